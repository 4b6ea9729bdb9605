//! `agentos call SERVER.TOOL key=value ...`: call a tool.
//!
//! A tool's arguments and its result are the tool's own JSON, typed by
//! its input schema rather than by the protocol: this file holds them as
//! JSON values.

use agentos_proto::payload::{ToolCall, ToolListReply, ToolReply};
use agentos_proto::{Client, ErrorCode, ErrorReply, Opcode};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{CliError, NotOfType};
use crate::failure::usage;
use crate::format::print_json;
use crate::input::millis;
use crate::raw::Raw;
use crate::tools;

#[derive(Debug, clap::Args)]
pub struct CallArgs {
    /// The tool, as SERVER.TOOL (`everything.echo`)
    pub tool: String,
    /// Its arguments, as key=value: the value is read as the tool's input
    /// schema types it (a string stays a string, a number becomes one,
    /// objects and arrays are JSON); untyped values that are JSON are sent
    /// as JSON
    #[arg(value_name = "KEY=VALUE")]
    pub arguments: Vec<String>,
    /// How long the tool itself may take, in seconds, enforced by the
    /// kernel [default: the server's own]; the global --timeout is how long
    /// this command waits for the reply
    #[arg(long, value_name = "SECS")]
    pub call_timeout: Option<f64>,
}

pub fn call_tool(client: &mut Client, args: CallArgs, json: bool) -> Result<(), CliError> {
    let Some((server, tool)) = args.tool.split_once('.') else {
        return Err(usage(format!(
            "name the tool as SERVER.TOOL (like everything.echo), not {:?}",
            args.tool
        )));
    };
    let schema = input_schema(client, server, tool)?;
    let mut arguments = Map::new();
    for pair in &args.arguments {
        let Some((key, text)) = pair.split_once('=') else {
            return Err(usage(format!("arguments are key=value, not {pair:?}")));
        };
        let typed = schema.as_ref().and_then(|schema| schema.type_of(key));
        let value = argument(typed, text).map_err(|why| CliError::ToolArgument {
            tool: args.tool.clone(),
            key: key.to_owned(),
            why,
        })?;
        arguments.insert(key.to_owned(), value);
    }
    let timeout_ms = match args.call_timeout {
        Some(secs) if !(secs > 0.0 && secs.is_finite()) => {
            return Err(usage("--call-timeout must be a positive number of seconds"));
        }
        secs => secs.map(millis),
    };
    let request = ToolCall::Call {
        server: server.to_owned(),
        tool: tool.to_owned(),
        arguments,
        timeout_ms,
        trace: None,
    };
    let reply = client.call(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    let raw = Raw::parse(&reply.payload)?;
    if json {
        raw.print()?;
    }
    if !raw.succeeded() {
        let refusal = raw
            .decode::<ErrorReply>()
            .unwrap_or_else(|_| ErrorReply::new(ErrorCode::Internal, "failed"));
        return Err(CliError::ToolFailed {
            tool: args.tool,
            refusal,
        });
    }
    if !json {
        match raw.decode::<ToolReply>()?.result.unwrap_or_default() {
            Value::String(text) => println!("{text}"),
            result => print_json(&result)?,
        }
    }
    Ok(())
}

/// What `call` reads of a tool's input schema: its properties. Anything
/// else a schema says, or a schema that is not an object, leaves the
/// values to be sent as they read.
#[derive(Debug, Deserialize)]
struct InputSchema {
    #[serde(default)]
    properties: Map<String, Value>,
}

impl InputSchema {
    /// The JSON type the schema gives `key`, if it gives one word.
    fn type_of(&self, key: &str) -> Option<&str> {
        self.properties.get(key)?.get("type")?.as_str()
    }
}

/// The input schema of `server.tool`, from TOOL's list (`None`: the list
/// does not have it, so the values are sent as they read and the kernel
/// answers for the tool).
fn input_schema(
    client: &mut Client,
    server: &str,
    tool: &str,
) -> Result<Option<InputSchema>, CliError> {
    let reply: ToolListReply = tools::ask(client, &ToolCall::List)?.decode()?;
    Ok(reply
        .tools
        .into_iter()
        .find(|t| t.server == server && t.name == tool)
        .and_then(|t| t.input_schema)
        .and_then(|schema| serde_json::from_value(schema).ok()))
}

/// A `key=value`'s value as the schema's `type` wants it; with no type,
/// JSON if it reads as JSON, else the text.
fn argument(typed: Option<&str>, text: &str) -> Result<Value, NotOfType> {
    let json = || serde_json::from_str::<Value>(text);
    match typed {
        Some("string") => Ok(Value::String(text.to_owned())),
        Some("integer") => text
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| NotOfType::Integer(text.to_owned())),
        Some("number") => match json() {
            Ok(number @ Value::Number(_)) => Ok(number),
            _ => Err(NotOfType::Number(text.to_owned())),
        },
        Some("boolean") => match text {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(NotOfType::Boolean(text.to_owned())),
        },
        Some("object") => match json() {
            Ok(value @ Value::Object(_)) => Ok(value),
            _ => Err(NotOfType::Json {
                kind: "object",
                text: text.to_owned(),
            }),
        },
        Some("array") => match json() {
            Ok(value @ Value::Array(_)) => Ok(value),
            _ => Err(NotOfType::Json {
                kind: "array",
                text: text.to_owned(),
            }),
        },
        _ => Ok(json().unwrap_or_else(|_| Value::String(text.to_owned()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_schema_type() {
        assert_eq!(argument(Some("string"), "123").unwrap(), "123");
        assert_eq!(argument(Some("string"), "{\"a\":1}").unwrap(), "{\"a\":1}");
        assert_eq!(argument(Some("number"), "1.5").unwrap(), 1.5);
        assert_eq!(argument(Some("integer"), "42").unwrap(), 42);
        assert_eq!(argument(Some("boolean"), "true").unwrap(), true);
        assert_eq!(
            argument(Some("object"), r#"{"a":[1]}"#).unwrap(),
            serde_json::json!({"a": [1]})
        );
        assert_eq!(
            argument(Some("array"), "[1,2]").unwrap(),
            serde_json::json!([1, 2])
        );
        assert_eq!(argument(None, "123").unwrap(), 123);
        assert_eq!(argument(None, "hello").unwrap(), "hello");
    }

    #[test]
    fn values_the_schema_cannot_take_are_refused_naming_the_type() {
        let refused = |typed, text| argument(Some(typed), text).unwrap_err().to_string();
        assert_eq!(refused("number", "abc"), r#"is a number, not "abc""#);
        assert_eq!(refused("integer", "1.5"), r#"is an integer, not "1.5""#);
        assert_eq!(refused("object", "[1]"), r#"is a JSON object, not "[1]""#);
        assert_eq!(refused("array", "{}"), r#"is a JSON array, not "{}""#);
        assert_eq!(refused("boolean", "yes"), r#"is true or false, not "yes""#);
    }

    #[test]
    fn a_schema_is_read_for_its_properties_types_only() {
        let schema: InputSchema = serde_json::from_str(
            r#"{"type": "object", "properties": {"a": {"type": "number"},
                "b": {"type": ["string", "null"]}, "c": true}}"#,
        )
        .unwrap();
        assert_eq!(schema.type_of("a"), Some("number"));
        assert_eq!(schema.type_of("b"), None);
        assert_eq!(schema.type_of("c"), None);
        assert_eq!(schema.type_of("d"), None);
    }
}
