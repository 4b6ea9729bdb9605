//! The tools' structured results: their types (whose JSON schemas are the
//! tools' output schemas), read from the kernel's replies.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an `exec` run did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    /// Null when a signal ended the run.
    pub exit_code: Option<i64>,
    pub signal: Option<i64>,
    pub timed_out: bool,
    /// Why the run failed, if it did (an exception's `Type: message`).
    pub error: Option<String>,
    /// Tool calls the code made from inside the sandbox.
    pub tool_calls: u64,
    /// Bytes those tool calls brought into the sandbox.
    pub tool_bytes: u64,
    /// The run's connections through the egress proxy, when a network policy applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetTotals>,
}

/// Connections through the egress proxy.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct NetTotals {
    pub allowed: u64,
    pub refused: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl ExecOutput {
    /// The output as a person reads it: stdout, then stderr, then why the
    /// run failed if it did.
    pub fn text(&self) -> String {
        let mut text = self.stdout.clone();
        text.push_str(&self.stderr);
        if let Some(error) = &self.error {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(error);
        }
        if text.is_empty() {
            text = match (self.exit_code, self.signal) {
                (Some(code), _) => format!("(no output; exit code {code})"),
                (None, Some(signal)) => format!("(no output; ended by signal {signal})"),
                (None, None) => "(no output)".to_owned(),
            };
        }
        text
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ThinkOutput {
    pub content: String,
    pub tokens: u64,
    pub model: Option<String>,
}

/// What a `run_prompt` loop did.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RunPromptOutput {
    /// The LLM's answer; null if it gave none within the iterations.
    pub answer: Option<String>,
    /// Each round: the code it wrote and what running it printed.
    pub iterations: Vec<PromptIteration>,
    /// LLM tokens the loop used.
    pub tokens: u64,
    /// Tool calls its code made from inside the sandbox.
    pub tool_calls: u64,
    /// Bytes those tool calls brought into the sandbox.
    pub tool_bytes: u64,
    /// Why the loop stopped without an answer, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PromptIteration {
    pub code: String,
    pub language: String,
    pub stdout: String,
    pub stderr: String,
    /// Null when the code was killed or never ran.
    pub exit_code: Option<i64>,
}

impl RunPromptOutput {
    /// The answer, or why there is none.
    pub fn text(&self) -> String {
        match (&self.answer, &self.error) {
            (Some(answer), _) => answer.clone(),
            (None, Some(error)) => format!("(no answer: {error})"),
            (None, None) => "(no answer)".to_owned(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AgentsOutput {
    /// The agents as the kernel's LIST describes them.
    pub agents: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SpawnOutput {
    pub id: u32,
    pub name: String,
    pub pid: Option<u32>,
    pub status: String,
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct KillOutput {
    pub killed: bool,
    pub id: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct StatusOutput {
    pub kernel_version: String,
    pub protocol_version: u32,
    /// Who the kernel takes the caller to be.
    pub agent_id: u32,
    // Each JSON value carries a description, which makes its schema an
    // object rather than the bare `true`: MCP 2025-11-25 requires every
    // output schema property to be an object, and the TypeScript SDK's
    // clients reject the whole tool list otherwise.
    /// The caller's principal (operator, agent, or a run of one): uid, gid and role.
    pub principal: Option<Value>,
    /// What works on this host now: think, exec, spawn, tools, task, cgroup.
    pub features: Value,
    /// The kernel's LLM: provider and model, when it has one.
    pub llm: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct AgentLogsOutput {
    pub id: u32,
    pub name: String,
    /// The agent's state (running, exited, killed, ...).
    pub state: String,
    /// The log's last lines.
    pub text: String,
    /// The agent has ended and the text reaches the end of its log.
    pub ended: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SessionsOutput {
    /// Each with session, created_at, last_used_at, runs, workspace_bytes.
    pub sessions: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CloseOutput {
    pub closed: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotOutput {
    /// The snapshot's name, bytes and created_at.
    pub snapshot: Value,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct RestoreOutput {
    pub session: String,
    /// The snapshot its /workspace now holds.
    pub name: String,
    pub restored: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DispatchOutput {
    pub task_id: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskOutput {
    /// task_id, kind, label, state, created_at, started_at, finished_at,
    /// progress, and once finished its result (the EXEC or THINK reply).
    pub task: Value,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CancelOutput {
    pub cancelled: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TaskListOutput {
    /// Newest first.
    pub tasks: Vec<Value>,
    /// The `before` of the next page, if there is one.
    pub next: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ToolsSearchOutput {
    /// Best match first: server, name, description (and schemas with detail).
    pub tools: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ToolsCallOutput {
    /// The tool's structured result, else its text as JSON if it is JSON, else its text.
    pub result: Value,
    /// The tool's content blocks.
    #[serde(default)]
    pub content: Vec<Value>,
}

/// Reads a kernel reply as a tool's output type.
pub fn from_reply<T: for<'de> Deserialize<'de>>(reply: Value) -> Result<T, String> {
    serde_json::from_value(reply).map_err(|err| format!("unexpected reply from the kernel: {err}"))
}

/// A successful result carrying `output` as structured content, and `text`
/// for clients (and models) that read only the text.
pub fn structured<T: Serialize>(output: &T, text: String) -> Result<CallToolResult, String> {
    let value = serde_json::to_value(output).map_err(|err| err.to_string())?;
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    Ok(result)
}

/// A successful result whose text is the structured content as JSON.
pub fn structured_json<T: Serialize>(output: &T) -> Result<CallToolResult, String> {
    let text = serde_json::to_string_pretty(output).map_err(|err| err.to_string())?;
    structured(output, text)
}
