//! TASK (0x13): background work owned by the caller.

use serde::{Deserialize, Serialize};

use super::{bad_request, check_range, from_value, parse_json, ExecRequest, ThinkRequest};
use crate::ErrorReply;

/// Longest a `wait` may block (ten minutes).
pub const MAX_WAIT_MS: u64 = 600_000;

/// What a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// An EXEC request.
    Exec,
    /// A THINK request.
    Think,
}

/// A task's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for a worker.
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
}

/// `dispatch`: start work in the background.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskDispatch {
    /// EXEC or THINK.
    pub kind: TaskKind,
    /// The EXEC or THINK payload, as JSON (a THINK prompt may be a string).
    pub request: serde_json::Value,
}

/// `status` and `cancel`: names a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    /// The task's id.
    pub task_id: String,
}

/// `wait`: block until the task ends or `timeout_ms` passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskWait {
    /// The task's id.
    pub task_id: String,
    /// How long to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
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
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TaskRequest {
    /// Start work in the background.
    Dispatch(TaskDispatch),
    /// Look a task up.
    Status(TaskRef),
    /// Block until the task ends or the timeout passes.
    Wait(TaskWait),
    /// The caller's tasks.
    List,
    /// Stop a task.
    Cancel(TaskRef),
}

impl TaskRequest {
    /// Parses and validates a TASK payload, including the embedded EXEC or
    /// THINK request of a dispatch.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        // Selected by hand rather than through serde's tagged-enum support,
        // which buffers the fields and so loses the name of a field at fault.
        let value: serde_json::Value = parse_json("TASK", payload)?;
        if !value.is_object() {
            return Err(bad_request("TASK payload must be a JSON object"));
        }
        let request = match value.get("op").and_then(serde_json::Value::as_str) {
            Some("dispatch") => TaskRequest::Dispatch(from_value("TASK", value)?),
            Some("status") => TaskRequest::Status(from_value("TASK", value)?),
            Some("wait") => TaskRequest::Wait(from_value("TASK", value)?),
            Some("list") => TaskRequest::List,
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
            TaskRequest::Status(_) | TaskRequest::List | TaskRequest::Cancel(_) => {}
        }
        Ok(request)
    }
}

impl TaskDispatch {
    /// Checks the embedded request as EXEC or THINK would.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        let embedded = match &self.request {
            serde_json::Value::String(prompt) if self.kind == TaskKind::Think => {
                prompt.clone().into_bytes()
            }
            other => serde_json::to_vec(other).unwrap_or_default(),
        };
        match self.kind {
            TaskKind::Exec => ExecRequest::parse(&embedded).map(drop),
            TaskKind::Think => ThinkRequest::parse(&embedded).map(drop),
        }
        .map_err(|mut err| {
            err.error = format!("TASK field `request`: {}", err.error);
            err
        })
    }
}

/// A task as reported by `status`, `wait` and `list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// `t-...`.
    pub task_id: String,
    /// EXEC or THINK.
    pub kind: TaskKind,
    /// Lifecycle state.
    pub state: TaskState,
    /// RFC 3339 UTC times.
    pub created_at: String,
    /// When a worker took it.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// The EXEC/THINK reply, once finished (from `wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

/// Reply to `dispatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDispatchReply {
    /// Always `true`.
    pub success: bool,
    /// The new task's id.
    pub task_id: String,
}

/// Reply to `status` and `wait`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskReply {
    /// Always `true`.
    pub success: bool,
    /// The task.
    pub task: TaskInfo,
}

/// Reply to `list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskListReply {
    /// Always `true`.
    pub success: bool,
    /// The caller's tasks.
    pub tasks: Vec<TaskInfo>,
}

/// Reply to `cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCancelReply {
    /// Always `true`.
    pub success: bool,
    /// Whether the task was still running and is now cancelled.
    pub cancelled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_op_is_a_bad_request() {
        let err = TaskRequest::parse(br#"{"op":"explode"}"#).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::BadRequest);
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
    }

    #[test]
    fn list_needs_no_fields() {
        assert_eq!(
            TaskRequest::parse(br#"{"op":"list"}"#).unwrap(),
            TaskRequest::List
        );
    }
}
