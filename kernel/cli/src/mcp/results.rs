//! The tools' structured results: the kernel's replies as proto types,
//! and the few outputs the server puts together itself. Each is an
//! object, which is what every tool's output schema says (see `schema`).

use agentos_proto::payload::{AgentInfo, ExecReply, PromptResult};
use agentos_proto::Opcode;
use rmcp::model::{CallToolResult, ContentBlock};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::kernel::{KernelLink, Wait};
use super::schema::REFUSAL_FIELDS;
use super::tool_error::{ReplyError, ToolError};

/// `list_agents`: LIST's agents (its reply is a bare array, and a tool's
/// structured content is an object).
#[derive(Debug, Serialize)]
pub struct AgentsOutput {
    /// The agents as the kernel's LIST describes them.
    pub agents: Vec<AgentInfo>,
}

/// `exec_session`'s restore: the session restored (or made, with
/// `into`), and the snapshot its files now are.
#[derive(Debug, Serialize)]
pub struct RestoreOutput {
    /// The session restored, or the new one a branch made.
    pub session: String,
    /// The snapshot its files now are.
    pub name: String,
    pub restored: bool,
    /// A branch: the session the snapshot was taken of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The snapshot's globals that could not be loaded (each name, with
    /// why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

/// A prompt loop's result as a person reads it: the answer, or why there
/// is none.
pub fn prompt_text(result: &PromptResult) -> String {
    match (&result.answer, &result.error) {
        (Some(answer), _) => answer.clone(),
        (None, Some(error)) => format!("(no answer: {error})"),
        (None, None) => "(no answer)".to_owned(),
    }
}

/// What a run's text starts with when its session's interpreter was new.
const FRESH_INTERPRETER: &str = "(the session's interpreter had ended and was started afresh: \
    its files and installed packages are kept, variables from earlier runs are not)\n";

/// An EXEC run's output as a person reads it: stdout, then stderr, then
/// why the run failed if it did (after a word on a fresh interpreter).
pub fn run_text(run: &ExecReply) -> String {
    let mut text = String::new();
    if run.fresh_interpreter {
        // A model that counts on an earlier run's variables learns at once
        // why they are gone.
        text.push_str(FRESH_INTERPRETER);
    }
    text.push_str(&run.stdout);
    text.push_str(&run.stderr);
    if let Some(error) = &run.error {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(error);
    }
    if text.is_empty() {
        text = match (run.exit_code, run.signal) {
            (Some(code), _) => format!("(no output; exit code {code})"),
            (None, Some(signal)) => format!("(no output; ended by signal {signal})"),
            (None, None) => "(no output)".to_owned(),
        };
    }
    text
}

/// Reads a task's result as its kind's output type.
pub fn from_result<T: DeserializeOwned>(result: Value) -> Result<T, ReplyError> {
    serde_json::from_value(result).map_err(ReplyError::Unreadable)
}

/// A successful result carrying `output` as structured content, and `text`
/// for clients (and models) that read only the text.
pub fn structured<T: Serialize>(output: &T, text: String) -> Result<CallToolResult, ReplyError> {
    Ok(with_content(content_of(output)?, text))
}

/// A successful result whose text is the structured content as JSON.
pub fn structured_json<T: Serialize>(output: &T) -> Result<CallToolResult, ReplyError> {
    let content = content_of(output)?;
    let text = serde_json::to_string_pretty(&content).map_err(ReplyError::Unwritable)?;
    Ok(with_content(content, text))
}

fn with_content(content: Value, text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(content);
    result
}

/// An output as structured content: its fields, but for those by which a
/// kernel reply says whether it is a refusal (see `schema`).
fn content_of<T: Serialize>(output: &T) -> Result<Value, ReplyError> {
    let mut content = serde_json::to_value(output).map_err(ReplyError::Unwritable)?;
    if let Value::Object(fields) = &mut content {
        for field in REFUSAL_FIELDS {
            fields.remove(field);
        }
    }
    Ok(content)
}

/// Sends `request` and answers the tool call with the kernel's reply,
/// read as `R`, as structured content.
pub async fn answer<R>(
    kernel: &KernelLink,
    opcode: Opcode,
    request: &impl Serialize,
    wait: Wait,
) -> Result<CallToolResult, ToolError>
where
    R: DeserializeOwned + Serialize,
{
    let reply: R = kernel.request(opcode, request, wait).await?;
    Ok(structured_json(&reply)?)
}
