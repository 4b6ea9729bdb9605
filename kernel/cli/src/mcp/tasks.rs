//! The tools for TASK: background exec runs and think prompts, which
//! outlive the call (and the server) that dispatched them.

use agentos_proto::payload::{
    ExecRequest, TaskCancelReply, TaskDispatch, TaskDispatchReply, TaskKind, TaskList,
    TaskListReply, TaskRef, TaskReply, TaskRequest, TaskWait, ThinkRequest,
};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::Serialize;
use serde_json::Value;

use super::arguments::{
    ArgumentError, TaskArguments, TaskDispatchArguments, TaskListArguments, TaskWaitArguments,
};
use super::kernel::{KernelLink, Wait};
use super::results::answer;
use super::tool_error::{ReplyError, ToolError};
use super::trace::CallerTrace;

/// `task_dispatch`: starts the code or the prompt as a task; its id.
pub async fn dispatch(
    kernel: &KernelLink,
    arguments: TaskDispatchArguments,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ToolError> {
    let request = dispatch_request(arguments, CallerTrace::of(context).traceparent())?;
    answer::<TaskDispatchReply>(kernel, Opcode::TASK, &request, Wait::Quick).await
}

/// `task_wait`: the task once it has finished, or when the wait is over;
/// with no wait (`timeout_ms` left out or 0), the task as it is now.
pub async fn wait(
    kernel: &KernelLink,
    arguments: TaskWaitArguments,
) -> Result<CallToolResult, ToolError> {
    let (request, wait) = wait_request(arguments);
    answer::<TaskReply>(kernel, Opcode::TASK, &request, wait).await
}

/// The TASK request `task_wait` makes, and how long its reply may take: a
/// status, answered at once, unless there is a wait, which the kernel ends
/// at `timeout_ms`.
fn wait_request(arguments: TaskWaitArguments) -> (TaskRequest, Wait) {
    let task_id = arguments.task_id;
    match arguments.timeout_ms {
        None | Some(0) => (TaskRequest::Status(TaskRef { task_id }), Wait::Quick),
        Some(timeout_ms) => (
            TaskRequest::Wait(TaskWait {
                task_id,
                timeout_ms: Some(timeout_ms),
            }),
            Wait::AsLongAsTheKernel,
        ),
    }
}

/// `task_cancel`: kills the task's run, or withdraws its queued THINK.
pub async fn cancel(
    kernel: &KernelLink,
    arguments: TaskArguments,
) -> Result<CallToolResult, ToolError> {
    let request = TaskRequest::Cancel(TaskRef {
        task_id: arguments.task_id,
    });
    answer::<TaskCancelReply>(kernel, Opcode::TASK, &request, Wait::Quick).await
}

/// `task_list`: the caller's tasks, newest first.
pub async fn list(
    kernel: &KernelLink,
    arguments: TaskListArguments,
) -> Result<CallToolResult, ToolError> {
    let request = TaskRequest::List(TaskList {
        state: arguments.state,
        kind: arguments.kind,
        limit: arguments.limit.map(u64::from),
        before: arguments.before,
        owner: None,
        fleet: false,
    });
    answer::<TaskListReply>(kernel, Opcode::TASK, &request, Wait::Quick).await
}

/// The TASK dispatch for `arguments`: an EXEC run for `code`, a THINK for
/// `prompt`, joining the caller's `trace`.
fn dispatch_request(
    arguments: TaskDispatchArguments,
    trace: Option<String>,
) -> Result<TaskRequest, ToolError> {
    let exec_only = arguments.language.is_some()
        || arguments.session.is_some()
        || arguments.timeout_ms.is_some()
        || !arguments.env.is_empty();
    let (kind, request) = match (arguments.code, arguments.prompt) {
        (Some(code), None) => {
            if arguments.max_tokens.is_some() {
                return Err(ArgumentError::Refused {
                    argument: "max_tokens",
                    why: "goes with prompt, not code",
                }
                .into());
            }
            let run = ExecRequest {
                code,
                language: arguments.language.unwrap_or_default(),
                session: arguments.session,
                timeout_ms: arguments.timeout_ms,
                env: arguments.env,
                ..ExecRequest::default()
            };
            (TaskKind::Exec, embedded(&run)?)
        }
        (None, Some(prompt)) => {
            if exec_only {
                return Err(ArgumentError::CodeOnly.into());
            }
            let think = ThinkRequest {
                prompt: Some(prompt),
                max_tokens: arguments.max_tokens,
                ..ThinkRequest::default()
            };
            (TaskKind::Think, embedded(&think)?)
        }
        _ => return Err(ArgumentError::OneOf("code", "prompt").into()),
    };
    Ok(TaskRequest::Dispatch(TaskDispatch {
        label: arguments.label,
        trace,
        ..TaskDispatch::new(kind, request)
    }))
}

/// A request as a dispatch's `request`, which carries any kind's.
fn embedded(request: &impl Serialize) -> Result<Value, ReplyError> {
    serde_json::to_value(request).map_err(ReplyError::Unwritable)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::arguments::read;
    use super::*;

    fn dispatch(value: Value) -> Result<Value, ToolError> {
        let arguments = read(value.as_object().expect("an object").clone())?;
        let request = dispatch_request(arguments, None)?;
        Ok(serde_json::to_value(request).expect("a request"))
    }

    #[test]
    fn code_is_an_exec_task_and_a_prompt_a_think_task() {
        let exec = dispatch(json!({"code": "ls", "language": "bash", "label": "l"})).unwrap();
        assert_eq!(
            exec,
            json!({"op": "dispatch", "kind": "exec", "label": "l",
                   "request": {"code": "ls", "language": "bash"}})
        );
        let think = dispatch(json!({"prompt": "hi", "max_tokens": 5})).unwrap();
        assert_eq!(
            think,
            json!({"op": "dispatch", "kind": "think",
                   "request": {"prompt": "hi", "max_tokens": 5}})
        );
    }

    fn waited(value: Value) -> (Value, bool) {
        let arguments = read(value.as_object().expect("an object").clone()).expect("arguments");
        let (request, wait) = wait_request(arguments);
        let request = serde_json::to_value(request).expect("a request");
        (request, matches!(wait, Wait::AsLongAsTheKernel))
    }

    #[test]
    fn a_wait_of_none_or_zero_is_the_task_now_and_any_other_a_kernel_wait() {
        let now = json!({"op": "status", "task_id": "t-1"});
        assert_eq!(waited(json!({"task_id": "t-1"})), (now.clone(), false));
        assert_eq!(
            waited(json!({"task_id": "t-1", "timeout_ms": 0})),
            (now, false)
        );
        assert_eq!(
            waited(json!({"task_id": "t-1", "timeout_ms": 200})),
            (
                json!({"op": "wait", "task_id": "t-1", "timeout_ms": 200}),
                true
            )
        );
    }

    #[test]
    fn arguments_of_the_other_kind_are_refused() {
        let refused = |value| dispatch(value).unwrap_err().to_string();
        let err = refused(json!({"code": "1", "prompt": "hi"}));
        assert!(err.contains("code and prompt"), "{err}");
        let err = refused(json!({}));
        assert!(err.contains("code and prompt"), "{err}");
        let err = refused(json!({"prompt": "hi", "timeout_ms": 5}));
        assert!(err.contains("go with code"), "{err}");
        let err = refused(json!({"code": "1", "max_tokens": 5}));
        assert!(err.starts_with("argument max_tokens:"), "{err}");
    }
}
