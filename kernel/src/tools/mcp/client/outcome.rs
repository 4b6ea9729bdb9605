//! What a tool call came to, and how a `tools/call` result is read: its
//! content, its structured content, or the tool's own error (`isError`).

use serde_json::Value;

/// What a tool call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum CallOutcome {
    /// The tool's result: its content blocks and structured content.
    Done {
        /// The content blocks.
        content: Value,
        /// The structured content, if any.
        structured: Option<Value>,
    },
    /// The tool reported an error (`isError`): its text and content.
    ToolError {
        /// The text of its content blocks.
        message: String,
        /// The content blocks.
        content: Value,
    },
    /// The server answered the call with an error instead of a result: a
    /// JSON-RPC error (unknown tool, arguments that fail its schema), or a
    /// reply that cannot be read. The error's message, or what is wrong
    /// with the reply.
    Rejected(String),
    /// The call's deadline passed first.
    TimedOut(String),
    /// The call failed otherwise: the server's end, a reply over the limit.
    Failed(String),
}

impl CallOutcome {
    /// A `tools/call` result as an outcome.
    pub fn of_result(result: Value) -> CallOutcome {
        // 2026-07-28: a result that is not complete asks the client for
        // input (an elicitation, a sampling) the kernel has no one to ask
        // for.
        let kind = result.get("resultType").and_then(Value::as_str);
        if let Some(kind) = kind.filter(|kind| *kind != "complete") {
            return CallOutcome::Rejected(format!(
                "the tool answered with a {kind:?} result (it asks for input the kernel cannot \
                 give); only complete results are taken"
            ));
        }
        let content = result
            .get("content")
            .cloned()
            .unwrap_or_else(|| Value::Array(Vec::new()));
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let message = content
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|block| block.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n");
            return CallOutcome::ToolError { message, content };
        }
        CallOutcome::Done {
            structured: result.get("structuredContent").cloned(),
            content,
        }
    }
}
