//! TASK (0x13): background work owned by the caller — an EXEC run, a
//! THINK, or the kernel's prompt-to-program loop — that outlives the
//! connection that dispatched it.

use serde::{Deserialize, Serialize};

use super::exec_run::ExecRequest;
use super::parse::{bad_request, check_range, from_value, parse_json};
use super::think::ThinkRequest;
use crate::error::{ErrorCode, ErrorReply};

/// Longest a `wait` may block (ten minutes).
pub const MAX_WAIT_MS: u64 = 600_000;
/// Most tasks one `list` returns.
pub const MAX_LIST_LIMIT: u64 = 1000;
/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;
/// The most times a fleet's task may be started.
pub const MAX_ATTEMPTS: u32 = 10;
/// The longest idempotency key of a dispatch.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
/// Most iterations a prompt loop may be given.
pub const MAX_ITERATIONS: u32 = 50;
/// Iterations a prompt loop is given when its request says none.
pub const DEFAULT_ITERATIONS: u32 = 5;
/// Longest prompt or system text of a prompt task, in bytes.
pub const MAX_PROMPT_BYTES: usize = 256 << 10;

/// What a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// An EXEC `run` request.
    Exec,
    /// A THINK request.
    Think,
    /// The prompt-to-program loop: THINK writes code, EXEC runs it.
    Prompt,
}

impl TaskKind {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Exec => "exec",
            TaskKind::Think => "think",
            TaskKind::Prompt => "prompt",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<TaskKind> {
        [TaskKind::Exec, TaskKind::Think, TaskKind::Prompt]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// A task's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for its turn.
    Queued,
    /// Being worked on.
    Running,
    /// Finished; `result` holds the reply.
    Completed,
    /// Finished with an error; `result` holds the failed reply.
    Failed,
    /// Cancelled by its owner.
    Cancelled,
    /// Stopped by its deadline.
    TimedOut,
    /// It was running when the kernel stopped.
    Interrupted,
}

impl TaskState {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::TimedOut => "timed_out",
            TaskState::Interrupted => "interrupted",
        }
    }

    /// The state named `name`.
    pub fn from_name(name: &str) -> Option<TaskState> {
        [
            TaskState::Queued,
            TaskState::Running,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Cancelled,
            TaskState::TimedOut,
            TaskState::Interrupted,
        ]
        .into_iter()
        .find(|state| state.as_str() == name)
    }

    /// Whether the task has ended for good.
    pub fn is_finished(self) -> bool {
        !matches!(self, TaskState::Queued | TaskState::Running)
    }
}

/// A prompt task's request: the kernel's loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PromptRequest {
    /// What to do.
    pub prompt: String,
    /// Rounds of THINK and EXEC at most.
    #[serde(default = "default_iterations")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_ITERATIONS)))]
    pub max_iterations: u32,
    /// A system instruction added to the kernel's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The EXEC session the code runs in (one of the task's own if none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

fn default_iterations() -> u32 {
    DEFAULT_ITERATIONS
}

/// `dispatch`: start work in the background.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskDispatch {
    /// EXEC, THINK or the prompt loop.
    pub kind: TaskKind,
    /// The EXEC `run` or THINK payload (a THINK prompt may be a string), or
    /// a [`PromptRequest`].
    pub request: serde_json::Value,
    /// The owner's own name for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// A W3C `traceparent` the task's span joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// In a fleet: how many times the task may be started, when the node
    /// running it dies (1 to 10; default 1: never run again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = MAX_ATTEMPTS)))]
    pub max_attempts: Option<u32>,
    /// In a fleet: the node it must run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// In a fleet: the owner's key for this dispatch; the same key again
    /// answers with the same task, never a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

impl TaskDispatch {
    /// A dispatch of `kind` work, `request`, with nothing else said.
    pub fn new(kind: TaskKind, request: serde_json::Value) -> TaskDispatch {
        TaskDispatch {
            kind,
            request,
            label: None,
            trace: None,
            max_attempts: None,
            node: None,
            idempotency_key: None,
        }
    }
}

/// `status` and `cancel`: names a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    /// The task's id.
    pub task_id: String,
}

/// `wait`: until the task ends or `timeout_ms` passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskWait {
    /// The task's id.
    pub task_id: String,
    /// How long to wait (default 30 s, at most ten minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `list`: the caller's tasks, newest first, a page at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskList {
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Only tasks of this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TaskKind>,
    /// Most tasks returned (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Only tasks older than this one (the last page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// Whose tasks (operators only): an agent by id or name, or `"*"` for
    /// everyone's. Left out, the caller's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<TaskOwner>,
    /// The caller's tasks in the whole fleet, not this node's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fleet: bool,
}

/// Whose tasks a `list` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum TaskOwner {
    /// An agent, by id.
    Agent(u32),
    /// An agent by name, or `"*"` for every owner.
    Name(String),
}

impl TaskOwner {
    /// Whether it asks for every owner's tasks.
    pub fn is_everyone(&self) -> bool {
        matches!(self, TaskOwner::Name(name) if name == "*")
    }
}

/// A TASK request, selected by `op`.
///
/// ```
/// use agentos_proto::payload::{TaskKind, TaskRequest};
/// let request = TaskRequest::parse(
///     br#"{"op":"dispatch","kind":"exec","request":{"code":"print(1)"}}"#,
/// ).unwrap();
/// assert!(matches!(request, TaskRequest::Dispatch(d) if d.kind == TaskKind::Exec));
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TaskRequest {
    /// Start work in the background.
    Dispatch(TaskDispatch),
    /// Look a task up.
    Status(TaskRef),
    /// Until the task ends or the timeout passes.
    Wait(TaskWait),
    /// The caller's tasks.
    List(TaskList),
    /// Stop a task.
    Cancel(TaskRef),
}

impl TaskRequest {
    /// Parses and validates a TASK payload, including the embedded request
    /// of a dispatch.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        // Selected by hand rather than through serde's tagged-enum support,
        // which buffers the fields and so loses the name of a field at fault.
        let value: serde_json::Value = parse_json("TASK", payload)?;
        let serde_json::Value::Object(mut fields) = value else {
            return Err(bad_request("TASK payload must be a JSON object"));
        };
        let op = fields.remove("op");
        let value = serde_json::Value::Object(fields);
        let request = match op.as_ref().and_then(serde_json::Value::as_str) {
            Some("dispatch") => TaskRequest::Dispatch(from_value("TASK", value)?),
            Some("status") => TaskRequest::Status(from_value("TASK", value)?),
            Some("wait") => TaskRequest::Wait(from_value("TASK", value)?),
            Some("list") => TaskRequest::List(from_value("TASK", value)?),
            Some("cancel") => TaskRequest::Cancel(from_value("TASK", value)?),
            Some(other) => {
                return Err(bad_request(format!(
                    "TASK field `op`: unknown operation {other:?}; expected one of \
                     dispatch, status, wait, list, cancel"
                )))
            }
            None => {
                return Err(bad_request(
                    "TASK needs `op`: one of dispatch, status, wait, list, cancel",
                ))
            }
        };
        match &request {
            TaskRequest::Dispatch(dispatch) => dispatch.validate()?,
            TaskRequest::Wait(wait) => check_range("timeout_ms", wait.timeout_ms, 0, MAX_WAIT_MS)?,
            TaskRequest::List(list) => {
                check_range("limit", list.limit, 1, MAX_LIST_LIMIT)?;
                if let Some(TaskOwner::Name(name)) = &list.owner {
                    if name != "*" {
                        super::parse::validate_name("owner", name)?;
                    }
                }
            }
            TaskRequest::Status(_) | TaskRequest::Cancel(_) => {}
        }
        Ok(request)
    }
}

impl TaskDispatch {
    /// Checks the label and the embedded request as EXEC, THINK or the
    /// prompt loop would.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        if self
            .max_attempts
            .is_some_and(|n| !(1..=MAX_ATTEMPTS).contains(&n))
        {
            return Err(bad_request(format!(
                "TASK field `max_attempts`: 1 to {MAX_ATTEMPTS}"
            )));
        }
        if let Some(node) = &self.node {
            super::parse::validate_name("node", node).map_err(|mut err| {
                err.error = format!("TASK field {}", err.error);
                err
            })?;
        }
        if let Some(key) = &self.idempotency_key {
            if key.is_empty()
                || key.len() > MAX_IDEMPOTENCY_KEY_BYTES
                || key.chars().any(char::is_control)
            {
                return Err(bad_request(format!(
                    "TASK field `idempotency_key`: 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes, \
                     no control characters"
                )));
            }
        }
        if let Some(label) = &self.label {
            if label.len() > MAX_LABEL_BYTES || label.chars().any(char::is_control) {
                return Err(bad_request(format!(
                    "TASK field `label`: at most {MAX_LABEL_BYTES} bytes, no control characters"
                )));
            }
        }
        let field = |mut err: ErrorReply| {
            err.error = format!("TASK field `request`: {}", err.error);
            err
        };
        match self.kind {
            TaskKind::Exec => self.exec().map(drop),
            TaskKind::Think => self.think().map(drop),
            TaskKind::Prompt => self.prompt().map(drop),
        }
        .map_err(field)
    }

    /// The embedded EXEC request.
    pub fn exec(&self) -> Result<ExecRequest, ErrorReply> {
        ExecRequest::parse(&serde_json::to_vec(&self.request).unwrap_or_default())
    }

    /// The embedded THINK request (a string is the prompt itself).
    pub fn think(&self) -> Result<ThinkRequest, ErrorReply> {
        let bytes = match &self.request {
            serde_json::Value::String(prompt) => prompt.clone().into_bytes(),
            other => serde_json::to_vec(other).unwrap_or_default(),
        };
        ThinkRequest::parse(&bytes)
    }

    /// The embedded prompt-loop request.
    pub fn prompt(&self) -> Result<PromptRequest, ErrorReply> {
        let prompt: PromptRequest = from_value("prompt", self.request.clone())?;
        if prompt.prompt.trim().is_empty() {
            return Err(bad_request("`prompt` is empty"));
        }
        let too_long = [Some(&prompt.prompt), prompt.system.as_ref()]
            .into_iter()
            .flatten()
            .any(|text| text.len() > MAX_PROMPT_BYTES);
        if too_long {
            return Err(bad_request(format!(
                "`prompt` and `system` may be at most {MAX_PROMPT_BYTES} bytes"
            )));
        }
        check_range(
            "max_iterations",
            Some(u64::from(prompt.max_iterations)),
            1,
            u64::from(MAX_ITERATIONS),
        )?;
        if let Some(session) = &prompt.session {
            super::parse::validate_name("session", session)?;
        }
        Ok(prompt)
    }
}

/// What a running task has done so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskProgress {
    /// The tail of what it has printed.
    pub output: String,
    /// For a prompt loop: the iteration under way (1 first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u32>,
}

/// A task as `status`, `wait` and `list` report it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskInfo {
    /// `t-...`.
    pub task_id: String,
    /// What it runs.
    pub kind: TaskKind,
    /// The owner's name for it.
    pub label: Option<String>,
    /// Lifecycle state.
    pub state: TaskState,
    /// RFC 3339 UTC times.
    pub created_at: String,
    /// When it started running.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// While it runs: what it has done so far.
    pub progress: Option<TaskProgress>,
    /// Once it has finished (`wait`): the EXEC or THINK reply, or the
    /// prompt loop's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Whose it is, when an operator looks at another owner's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<super::hello::PrincipalInfo>,
    /// A fleet's task: the node that runs (or ran) it, or the node it is
    /// pinned to while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A fleet's task: how many times it has been started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// A fleet's task that cannot start now, and why (its node is dead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// The result of a prompt task whose loop ended: the LLM's answer, or why
/// it gave none, with every round it ran. A task stopped before its loop
/// ended has a [`StoppedResult`] instead, and one refused before its loop
/// began the refusal; neither has `iterations` or `tokens`, so neither
/// reads as this. `error` is left out when there is none.
///
/// ```
/// use agentos_proto::payload::{PromptIteration, PromptResult};
/// let result = PromptResult {
///     success: true,
///     answer: Some("55".into()),
///     iterations: vec![PromptIteration {
///         code: "print(sum(range(11)))".into(),
///         language: "python".into(),
///         stdout: "55\n".into(),
///         stderr: String::new(),
///         exit_code: Some(0),
///     }],
///     tokens: 40,
///     tool_calls: 0,
///     tool_bytes: 0,
///     checked: true,
///     unchecked_reason: None,
///     error: None,
/// };
/// assert_eq!(
///     serde_json::to_string(&result).unwrap(),
///     r#"{"success":true,"answer":"55","iterations":[{"code":"print(sum(range(11)))","language":"python","stdout":"55\n","stderr":"","exit_code":0}],"tokens":40,"tool_calls":0,"tool_bytes":0,"checked":true}"#
/// );
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PromptResult {
    /// Whether the LLM answered (the task completed).
    #[serde(default)]
    pub success: bool,
    /// The LLM's answer; null if it gave none within the iterations.
    #[serde(default)]
    pub answer: Option<String>,
    /// Each round: the code it wrote and what running it printed.
    pub iterations: Vec<PromptIteration>,
    /// LLM tokens the loop used.
    pub tokens: u64,
    /// Tool calls its code made from inside the sandbox.
    pub tool_calls: u64,
    /// Bytes those tool calls brought into the sandbox.
    pub tool_bytes: u64,
    /// Whether the answer is checked: the last run worked and printed,
    /// and the answer states no number that no run printed (nor the
    /// task gave). False without an answer.
    #[serde(default)]
    pub checked: bool,
    /// Why the answer is not checked, if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked_reason: Option<String>,
    /// Why the loop stopped without an answer, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One round of the prompt loop: the code the LLM wrote and how running
/// it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// No description in the schema: a result's `iterations` say what an
// iteration is, and a schema that lists them says it once.
#[cfg_attr(feature = "schema", schemars(description = ""))]
pub struct PromptIteration {
    /// The code the LLM wrote.
    pub code: String,
    /// Its language: `python` or `bash`.
    pub language: String,
    /// What it printed.
    pub stdout: String,
    /// Its errors, or why it was not run.
    pub stderr: String,
    /// Null when the code was killed or never ran.
    pub exit_code: Option<i64>,
}

/// The result of a task stopped before its work answered: `cancelled`,
/// or `interrupted` with the `output` it had printed. Its fields are
/// written in this order (the order a task's result has always had).
///
/// ```
/// use agentos_proto::payload::StoppedResult;
/// let cancelled = StoppedResult::cancelled("the task was cancelled by its owner");
/// assert_eq!(
///     serde_json::to_string(&cancelled).unwrap(),
///     r#"{"code":"cancelled","error":"the task was cancelled by its owner","success":false}"#
/// );
/// let interrupted = StoppedResult::interrupted("the kernel stopped while the task ran", "1\n");
/// assert_eq!(
///     serde_json::to_string(&interrupted).unwrap(),
///     r#"{"code":"interrupted","error":"the kernel stopped while the task ran","output":"1\n","success":false}"#
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StoppedResult {
    /// `cancelled` or `interrupted`.
    pub code: ErrorCode,
    /// Why it was stopped.
    pub error: String,
    /// An interrupted task's: what it had printed (the tail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Always `false`.
    pub success: bool,
}

impl StoppedResult {
    /// A task cancelled because `why`.
    pub fn cancelled(why: impl Into<String>) -> StoppedResult {
        StoppedResult {
            code: ErrorCode::Cancelled,
            error: why.into(),
            output: None,
            success: false,
        }
    }

    /// A task that could not go on because `why`, having printed `output`.
    pub fn interrupted(why: impl Into<String>, output: impl Into<String>) -> StoppedResult {
        StoppedResult {
            code: ErrorCode::Interrupted,
            error: why.into(),
            output: Some(output.into()),
            success: false,
        }
    }
}

/// Reply to `dispatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskDispatchReply {
    /// Always `true`.
    pub success: bool,
    /// The new task's id.
    pub task_id: String,
}

/// Reply to `status` and `wait`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskReply {
    /// Always `true`.
    pub success: bool,
    /// The task.
    pub task: TaskInfo,
}

/// Reply to `list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskListReply {
    /// Always `true`.
    pub success: bool,
    /// The caller's tasks, newest first.
    pub tasks: Vec<TaskInfo>,
    /// `before` for the next page; `null` on the last.
    pub next: Option<String>,
}

/// Reply to `cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TaskCancelReply {
    /// Always `true`.
    pub success: bool,
    /// Whether the task was queued or running and is now cancelled.
    pub cancelled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_op_is_a_bad_request() {
        let err = TaskRequest::parse(br#"{"op":"explode"}"#).unwrap_err();
        assert_eq!(err.code, crate::error::ErrorCode::BadRequest);
        assert!(err.error.contains("explode"), "{}", err.error);
    }

    #[test]
    fn dispatch_validates_the_embedded_request() {
        let err =
            TaskRequest::parse(br#"{"op":"dispatch","kind":"exec","request":{}}"#).unwrap_err();
        assert!(
            err.error.starts_with("TASK field `request`"),
            "{}",
            err.error
        );
        assert!(TaskRequest::parse(br#"{"op":"dispatch","kind":"think","request":"hi"}"#).is_ok());
        let prompt = TaskRequest::parse(
            br#"{"op":"dispatch","kind":"prompt","request":{"prompt":"sum 1..10"},"label":"x"}"#,
        )
        .unwrap();
        let TaskRequest::Dispatch(dispatch) = prompt else {
            panic!("not a dispatch")
        };
        assert_eq!(dispatch.prompt().unwrap().max_iterations, 5);
        for bad in [
            r#"{"op":"dispatch","kind":"prompt","request":{"prompt":""}}"#,
            r#"{"op":"dispatch","kind":"prompt","request":{"prompt":"x","max_iterations":0}}"#,
            r#"{"op":"dispatch","kind":"nap","request":{}}"#,
            r#"{"op":"dispatch","kind":"think","request":"hi","label":"a\nb"}"#,
        ] {
            assert!(TaskRequest::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn list_filters_and_pages() {
        assert_eq!(
            TaskRequest::parse(br#"{"op":"list"}"#).unwrap(),
            TaskRequest::List(TaskList::default())
        );
        let list = TaskRequest::parse(
            br#"{"op":"list","state":"running","kind":"exec","limit":5,"before":"t-1"}"#,
        )
        .unwrap();
        assert!(matches!(
            list,
            TaskRequest::List(TaskList {
                state: Some(TaskState::Running),
                kind: Some(TaskKind::Exec),
                limit: Some(5),
                ..
            })
        ));
        assert!(TaskRequest::parse(br#"{"op":"list","state":"napping"}"#).is_err());
        assert!(TaskRequest::parse(br#"{"op":"list","limit":0}"#).is_err());
    }

    #[test]
    fn a_prompt_result_without_an_answer_writes_why_last() {
        let failed = PromptResult {
            error: Some("THINK failed: no model".into()),
            ..PromptResult::default()
        };
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"success":false,"answer":null,"iterations":[],"tokens":0,"tool_calls":0,"tool_bytes":0,"checked":false,"error":"THINK failed: no model"}"#
        );
    }

    #[test]
    fn a_prompt_result_reads_without_success_answer_or_error_and_with_newer_fields() {
        let read: PromptResult = serde_json::from_str(
            r#"{"iterations":[{"code":"1","language":"python","stdout":"","stderr":"",
                "exit_code":null,"added_later":1}],"tokens":3,"tool_calls":0,"tool_bytes":0,
                "added_later":{"n":1}}"#,
        )
        .unwrap();
        assert_eq!(
            (read.success, &read.answer, &read.error),
            (false, &None, &None)
        );
        assert_eq!((read.iterations.len(), read.tokens), (1, 3));
    }

    #[test]
    fn a_stopped_or_refused_task_result_is_no_prompt_result() {
        let stopped = serde_json::to_value(StoppedResult::cancelled("by its owner")).unwrap();
        assert!(serde_json::from_value::<PromptResult>(stopped).is_err());
        let refused = serde_json::json!({"success": false, "error": "no", "code": "bad_request"});
        assert!(serde_json::from_value::<PromptResult>(refused).is_err());
    }
}
