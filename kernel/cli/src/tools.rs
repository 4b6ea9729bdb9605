//! `agentos tools` and `agentos call`: the kernel's tools.

use agentos_proto::{Client, Opcode};
use serde_json::Value;

use crate::failure::{in_cli_terms, usage};
use crate::format::print_json;

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

pub fn tools(client: &mut Client, search: &[String], json: bool) -> anyhow::Result<()> {
    let request = if search.is_empty() {
        serde_json::json!({"op": "list"})
    } else {
        serde_json::json!({"op": "search", "query": search.join(" "), "limit": 50})
    };
    let reply: serde_json::Value =
        client.call_json(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    if json {
        return print_json(&reply);
    }
    for server in reply["servers"].as_array().into_iter().flatten() {
        let error = server["error"]
            .as_str()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        println!(
            "server {} {} ({} tools){error}",
            server["name"].as_str().unwrap_or("?"),
            server["state"].as_str().unwrap_or("?"),
            server["tools"],
        );
    }
    let tools = reply["tools"].as_array().cloned().unwrap_or_default();
    let width = tools.iter().map(|t| tool_name(t).len()).max().unwrap_or(0);
    for tool in &tools {
        let description = tool["description"].as_str().unwrap_or("");
        let first_line = description.lines().next().unwrap_or("");
        let mut summary: String = first_line.chars().take(100).collect();
        if summary.len() < first_line.len() {
            summary.push('…');
        }
        println!("{:width$}  {summary}", tool_name(tool));
    }
    if tools.is_empty() && !search.is_empty() {
        eprintln!("agentos: no tool matches {:?}", search.join(" "));
    }
    Ok(())
}

/// `server.name` of a tool in a TOOL reply.
fn tool_name(tool: &serde_json::Value) -> String {
    format!(
        "{}.{}",
        tool["server"].as_str().unwrap_or("?"),
        tool["name"].as_str().unwrap_or("?")
    )
}

pub fn call_tool(client: &mut Client, args: CallArgs, json: bool) -> anyhow::Result<()> {
    let Some((server, tool)) = args.tool.split_once('.') else {
        return Err(usage(format!(
            "name the tool as SERVER.TOOL (like everything.echo), not {:?}",
            args.tool
        )));
    };
    let schema = input_schema(client, server, tool)?;
    let mut arguments = serde_json::Map::new();
    for pair in &args.arguments {
        let Some((key, text)) = pair.split_once('=') else {
            return Err(usage(format!("arguments are key=value, not {pair:?}")));
        };
        let typed = schema
            .as_ref()
            .and_then(|schema| schema["properties"][key]["type"].as_str());
        let value = argument(typed, text)
            .map_err(|why| usage(format!("{}'s argument `{key}` {why}", args.tool)))?;
        arguments.insert(key.to_owned(), value);
    }
    let mut request = serde_json::json!({
        "op": "call", "server": server, "tool": tool, "arguments": arguments,
    });
    if let Some(secs) = args.call_timeout {
        if !(secs > 0.0 && secs.is_finite()) {
            return Err(usage("--call-timeout must be a positive number of seconds"));
        }
        request["timeout_ms"] = ((secs * 1e3).round() as u64).into();
    }
    let reply = client.call(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    let reply: Value = serde_json::from_slice(&reply.payload)?;
    if json {
        print_json(&reply)?;
    }
    if reply["success"] != true {
        let refusal: agentos_proto::ErrorReply = serde_json::from_value(reply.clone())
            .unwrap_or_else(|_| {
                agentos_proto::ErrorReply::new(agentos_proto::ErrorCode::Internal, "failed")
            });
        anyhow::bail!("{}: {}", args.tool, in_cli_terms(&refusal));
    }
    if !json {
        match &reply["result"] {
            Value::String(text) => println!("{text}"),
            result => print_json(result)?,
        }
    }
    Ok(())
}

/// The input schema of `server.tool`, from TOOL's list (`None`: the list
/// does not have it, so the values are sent as they read and the kernel
/// answers for the tool).
fn input_schema(client: &mut Client, server: &str, tool: &str) -> anyhow::Result<Option<Value>> {
    let request = serde_json::json!({"op": "list"});
    let reply: Value = client.call_json(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    Ok(reply["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["server"] == server && t["name"] == tool)
        .map(|t| t["input_schema"].clone()))
}

/// A `key=value`'s value as the schema's `type` wants it; with no type,
/// JSON if it reads as JSON, else the text.
fn argument(typed: Option<&str>, text: &str) -> Result<Value, String> {
    let json = || serde_json::from_str::<Value>(text);
    match typed {
        Some("string") => Ok(Value::String(text.to_owned())),
        Some("integer") => text
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("is an integer, not {text:?}")),
        Some("number") => match json() {
            Ok(number @ Value::Number(_)) => Ok(number),
            _ => Err(format!("is a number, not {text:?}")),
        },
        Some("boolean") => match text {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(format!("is true or false, not {text:?}")),
        },
        Some(kind @ ("object" | "array")) => match json() {
            Ok(value @ Value::Object(_)) if kind == "object" => Ok(value),
            Ok(value @ Value::Array(_)) if kind == "array" => Ok(value),
            _ => Err(format!("is a JSON {kind}, not {text:?}")),
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
        assert!(argument(Some("number"), "abc")
            .unwrap_err()
            .contains("number"));
        assert!(argument(Some("integer"), "1.5")
            .unwrap_err()
            .contains("integer"));
        assert!(argument(Some("object"), "[1]")
            .unwrap_err()
            .contains("object"));
        assert!(argument(Some("boolean"), "yes")
            .unwrap_err()
            .contains("true or false"));
    }
}
