//! TOOL (0x05): list, search and call tools — those of the MCP servers the
//! kernel is configured with, and its own built-ins. The request's `op`
//! picks which.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::parse::{bad_request, check_range, parse_json, validate_name};
use crate::error::ErrorReply;

/// The longest a tool call may be given, in milliseconds (one hour).
pub const MAX_TOOL_TIMEOUT_MS: u64 = 3_600_000;
/// The most tools one search returns.
pub const MAX_SEARCH_LIMIT: u64 = 200;
/// How many tools a search returns when its `limit` is left out.
pub const DEFAULT_SEARCH_LIMIT: u64 = 10;
/// The longest search query, in bytes.
pub const MAX_QUERY_BYTES: usize = 1024;

/// How much a search says of each tool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Detail {
    /// Server and name only.
    Name,
    /// And the description.
    #[default]
    Summary,
    /// And the input and output schemas.
    Full,
}

/// A TOOL request. Serialised, it is the payload [`ToolCall::parse`]
/// reads back.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ToolCall {
    /// Every tool the caller may use, and every server's state.
    List,
    /// The tools whose names and descriptions match a query, best first.
    Search {
        /// The words looked for.
        query: String,
        /// How much to say of each.
        detail: Detail,
        /// The most tools returned.
        limit: u64,
    },
    /// Calls one tool.
    Call {
        /// Its server (`llm`, `kernel`, or a configured MCP server).
        server: String,
        /// Its name, as the server gives it.
        tool: String,
        /// Its arguments: a JSON object.
        arguments: Map<String, Value>,
        /// How long the call may take, if not the server's default.
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// A W3C `traceparent` the call's span joins.
        #[serde(skip_serializing_if = "Option::is_none")]
        trace: Option<String>,
    },
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
enum Op {
    #[default]
    List,
    Search,
    Call,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default)]
    op: Op,
    query: Option<String>,
    #[serde(default)]
    detail: Detail,
    limit: Option<u64>,
    server: Option<String>,
    tool: Option<String>,
    arguments: Option<Value>,
    timeout_ms: Option<u64>,
    trace: Option<String>,
}

impl ToolCall {
    /// Parses and checks a TOOL payload, naming the field at fault.
    ///
    /// ```
    /// use agentos_proto::payload::ToolCall;
    /// let call = ToolCall::parse(br#"{"op":"call","server":"everything","tool":"echo","arguments":{"message":"hi"}}"#).unwrap();
    /// assert!(matches!(call, ToolCall::Call { ref tool, .. } if tool == "echo"));
    /// assert!(ToolCall::parse(br#"{"op":"call","tool":"echo"}"#).is_err());
    /// ```
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let wire: Wire = parse_json("TOOL", payload)?;
        match wire.op {
            Op::List => Ok(ToolCall::List),
            Op::Search => {
                let query = wire.query.ok_or_else(|| {
                    bad_request("TOOL field `query` is missing: a search needs words to look for")
                })?;
                if query.len() > MAX_QUERY_BYTES {
                    return Err(bad_request(format!(
                        "TOOL field `query` is {} bytes, over {MAX_QUERY_BYTES}",
                        query.len()
                    )));
                }
                check_range("limit", wire.limit, 1, MAX_SEARCH_LIMIT)?;
                Ok(ToolCall::Search {
                    query,
                    detail: wire.detail,
                    limit: wire.limit.unwrap_or(DEFAULT_SEARCH_LIMIT),
                })
            }
            Op::Call => {
                let server = wire.server.ok_or_else(|| {
                    bad_request("TOOL field `server` is missing: a call names its server")
                })?;
                validate_name("server", &server)?;
                let tool = wire.tool.ok_or_else(|| {
                    bad_request("TOOL field `tool` is missing: a call names its tool")
                })?;
                // A tool's name is its server's: any text, within reason.
                if tool.is_empty() || tool.len() > 128 || tool.chars().any(char::is_control) {
                    return Err(bad_request(
                        "TOOL field `tool` must be 1 to 128 characters, none of them control \
                         characters",
                    ));
                }
                let arguments =
                    match wire.arguments {
                        None | Some(Value::Null) => Map::new(),
                        Some(Value::Object(arguments)) => arguments,
                        Some(_) => return Err(bad_request(
                            "TOOL field `arguments` must be a JSON object of the tool's arguments",
                        )),
                    };
                check_range("timeout_ms", wire.timeout_ms, 1, MAX_TOOL_TIMEOUT_MS)?;
                Ok(ToolCall::Call {
                    server,
                    tool,
                    arguments,
                    timeout_ms: wire.timeout_ms,
                    trace: wire.trace,
                })
            }
        }
    }
}

/// A tool as TOOL `list` and `search` describe it. `search` leaves out
/// what its `detail` does not ask for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolDescription {
    /// Its server.
    pub server: String,
    /// Its name, as its server gives it.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// The JSON schema of its structured result (`null`: it gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

/// A tool server as TOOL `list` and HELLO describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServerInfo {
    /// Its name.
    pub name: String,
    /// `starting`, `ready`, `failed` or `stopped`.
    pub state: String,
    /// Why it failed, while it is `failed`, and while it is `starting` again
    /// after a failure (its last error).
    pub error: Option<String>,
    /// How many tools it offers.
    pub tools: usize,
}

/// TOOL `list`'s reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolListReply {
    /// Always true.
    pub success: bool,
    /// Every tool the caller may use.
    pub tools: Vec<ToolDescription>,
    /// Every server, whatever its state.
    pub servers: Vec<ServerInfo>,
}

/// TOOL `search`'s reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolSearchReply {
    /// Always true.
    pub success: bool,
    /// The matching tools the caller may use, best first.
    pub tools: Vec<ToolDescription>,
}

/// TOOL `call`'s reply when the tool ran: its result, or the error it
/// reported (`code` `tool_error`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolReply {
    /// Whether the tool succeeded.
    pub success: bool,
    /// The structured result, else the text parsed as JSON, else the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The tool's content blocks.
    pub content: Value,
    /// The tool's error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `tool_error` when the tool reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::error::ErrorCode>,
}

impl ToolReply {
    /// A tool's result.
    pub fn done(result: Value, content: Value) -> ToolReply {
        ToolReply {
            success: true,
            result: Some(result),
            content,
            error: None,
            code: None,
        }
    }

    /// An error the tool reported.
    pub fn tool_error(error: String, content: Value) -> ToolReply {
        ToolReply {
            success: false,
            result: None,
            content,
            error: Some(error),
            code: Some(crate::error::ErrorCode::ToolError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn refused(payload: &str) -> ErrorReply {
        ToolCall::parse(payload.as_bytes()).unwrap_err()
    }

    #[test]
    fn each_op_parses_with_its_defaults() {
        assert_eq!(ToolCall::parse(b"{}").unwrap(), ToolCall::List);
        assert_eq!(
            ToolCall::parse(br#"{"op":"list"}"#).unwrap(),
            ToolCall::List
        );
        assert_eq!(
            ToolCall::parse(br#"{"op":"search","query":"read file"}"#).unwrap(),
            ToolCall::Search {
                query: "read file".into(),
                detail: Detail::Summary,
                limit: 10
            }
        );
        let full = ToolCall::parse(br#"{"op":"search","query":"x","detail":"full","limit":3}"#);
        assert!(matches!(
            full,
            Ok(ToolCall::Search {
                detail: Detail::Full,
                limit: 3,
                ..
            })
        ));
        let call = ToolCall::parse(br#"{"op":"call","server":"everything","tool":"get-sum","arguments":{"a":1,"b":2},"timeout_ms":500}"#).unwrap();
        let ToolCall::Call {
            server,
            tool,
            arguments,
            timeout_ms,
            ..
        } = call
        else {
            panic!("not a call");
        };
        assert_eq!((server.as_str(), tool.as_str()), ("everything", "get-sum"));
        assert_eq!(arguments["a"], 1);
        assert_eq!(timeout_ms, Some(500));
    }

    #[test]
    fn bad_requests_name_their_field() {
        for (payload, field) in [
            (r#"{"op":"fly"}"#, "op"),
            (r#"{"op":"search"}"#, "`query`"),
            (r#"{"op":"search","query":"x","detail":"all"}"#, "detail"),
            (r#"{"op":"call","tool":"echo"}"#, "`server`"),
            (r#"{"op":"call","server":"../x","tool":"echo"}"#, "`server`"),
            (r#"{"op":"call","server":"everything"}"#, "`tool`"),
            (
                r#"{"op":"call","server":"everything","tool":"a\nb"}"#,
                "`tool`",
            ),
            (
                r#"{"op":"call","server":"everything","tool":"echo","arguments":[1]}"#,
                "`arguments`",
            ),
        ] {
            let err = refused(payload);
            assert_eq!(err.code, ErrorCode::BadRequest, "{payload}: {}", err.error);
            assert!(err.error.contains(field), "{payload}: {}", err.error);
        }
        let long = format!(r#"{{"op":"search","query":"{}"}}"#, "x".repeat(2000));
        assert!(refused(&long).error.contains("`query`"));
        for (payload, field) in [
            (r#"{"op":"search","query":"x","limit":0}"#, "`limit`"),
            (
                r#"{"op":"call","server":"s","tool":"t","timeout_ms":0}"#,
                "`timeout_ms`",
            ),
        ] {
            let err = refused(payload);
            assert_eq!(err.code, ErrorCode::LimitExceeded, "{payload}");
            assert!(err.error.contains(field), "{payload}: {}", err.error);
        }
    }
}
