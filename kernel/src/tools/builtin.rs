//! The kernel's own tools, listed beside the MCP servers' and called the
//! same way: server `llm` (`think`: a prompt through the THINK scheduler,
//! charged to the caller) and server `kernel` (`list_agents`).

use std::sync::OnceLock;

use agentos_proto::payload::ToolReply;
use agentos_proto::{ErrorCode, ErrorReply};
use serde::Serialize;
use serde_json::Value;

use super::mcp::client::ToolInfo;
use crate::address::Answer;

/// The built-in servers' names.
pub const LLM: &str = "llm";
/// The kernel's own server.
pub const KERNEL: &str = "kernel";

/// A built-in tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `llm.think`.
    Think,
    /// `kernel.list_agents`.
    ListAgents,
}

impl Builtin {
    /// The built-in `server.tool`, if it is one.
    pub fn find(server: &str, tool: &str) -> Option<Builtin> {
        match (server, tool) {
            (LLM, "think") => Some(Builtin::Think),
            (KERNEL, "list_agents") => Some(Builtin::ListAgents),
            _ => None,
        }
    }
}

/// What a server is, for its SKILL.md.
pub fn describe_server(server: &str) -> String {
    match server {
        LLM => "The kernel's shared LLM, through its fair queue and the caller's quota.".into(),
        KERNEL => "The AgentOS kernel itself: its agents.".into(),
        other => format!("The MCP server `{other}`, run by the kernel."),
    }
}

/// Whether `server` is a built-in one.
pub fn is_builtin_server(server: &str) -> bool {
    server == LLM || server == KERNEL
}

/// Every built-in tool, with its server.
pub fn tools() -> &'static [(&'static str, ToolInfo)] {
    static TOOLS: OnceLock<Vec<(&'static str, ToolInfo)>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        vec![
            (
                LLM,
                ToolInfo {
                    name: "think".into(),
                    description: "Ask the kernel's shared LLM: a prompt in, its answer out \
                                  (text). Charged to the caller's token quota."
                        .into(),
                    input_schema: schema(&ObjectSchema {
                        kind: "object",
                        properties: ThinkArguments {
                            prompt: Property::described("string", "What to ask."),
                            system: Property::described("string", "A system prompt."),
                            max_tokens: Property {
                                minimum: Some(1),
                                ..Property::described("integer", "Most tokens in the answer.")
                            },
                            temperature: Property {
                                kind: "number",
                                minimum: Some(0),
                                description: None,
                            },
                        },
                        required: &["prompt"],
                    }),
                    output_schema: None,
                },
            ),
            (
                KERNEL,
                ToolInfo {
                    name: "list_agents".into(),
                    description: "List the agents the kernel runs: id, name, state, limits \
                                  and use of memory, CPU and the LLM."
                        .into(),
                    input_schema: schema(&ObjectSchema {
                        kind: "object",
                        properties: NoArguments {},
                        required: &[],
                    }),
                    output_schema: None,
                },
            ),
        ]
    })
}

/// An object schema of the built-in tools.
#[derive(Serialize)]
struct ObjectSchema<P> {
    #[serde(rename = "type")]
    kind: &'static str,
    properties: P,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    required: &'static [&'static str],
}

#[derive(Serialize)]
struct ThinkArguments {
    prompt: Property,
    system: Property,
    max_tokens: Property,
    temperature: Property,
}

#[derive(Serialize)]
struct NoArguments {}

#[derive(Serialize)]
struct Property {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    minimum: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'static str>,
}

impl Property {
    fn described(kind: &'static str, description: &'static str) -> Property {
        Property {
            kind,
            minimum: None,
            description: Some(description),
        }
    }
}

/// A built-in schema as the JSON a tool listing carries.
fn schema<P: Serialize>(schema: &ObjectSchema<P>) -> Value {
    serde_json::to_value(schema).unwrap_or_default()
}

/// One text content block.
pub fn text_content(text: String) -> Value {
    Value::Array(vec![
        serde_json::to_value(TextBlock { kind: "text", text }).unwrap_or_default()
    ])
}

/// An MCP text content block.
#[derive(Serialize)]
struct TextBlock {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// A TOOL call's reply as the caller gets it: THINK's answer to
/// `llm.think` as a TOOL reply (its text is the result; a failure stays
/// one); a TOOL reply or a refusal as it is.
pub fn as_tool_reply(answer: Answer) -> Answer {
    match answer {
        Answer::Think(think) if think.success => {
            let answer = Value::String(think.content.clone());
            ToolReply::done(answer, text_content(think.content)).into()
        }
        Answer::Think(think) => ErrorReply::new(
            think.code.unwrap_or(ErrorCode::Internal),
            think.error.unwrap_or_else(|| "THINK failed".into()),
        )
        .into(),
        Answer::Tool(_) | Answer::Error(_) => answer,
        Answer::Exec(_) | Answer::Json(_) => ErrorReply::new(
            ErrorCode::Internal,
            "a TOOL call was answered with another request's kind of reply",
        )
        .into(),
    }
}
