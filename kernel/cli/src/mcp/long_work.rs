//! Long work: `exec` and `run_prompt` run as kernel TASKs when the client
//! wants more than one blocking answer — a task handle it polls (the MCP
//! Tasks extension, `io.modelcontextprotocol/tasks`), or progress
//! notifications while it waits — and `tasks/get`, `tasks/update` and
//! `tasks/cancel` on those handles.
//!
//! An MCP task id is the kernel's task id. The kernel already keeps each
//! task for its owner alone, with its result, across restarts of the
//! kernel and of this server, and kills a cancelled task's run; a second
//! store here (rmcp's `TaskManager` is an in-memory one) would forget on
//! restart what the kernel remembers, and could disagree with it. Every
//! `tasks/*` request goes to the kernel as the caller, so a task id that
//! is not the caller's is as unknown to it as one that never was; and any
//! of the caller's tasks, `task_dispatch`ed ones too, can be followed.

use agentos_proto::payload::{
    ExecReply, PromptResult, TaskCancelReply, TaskDispatch, TaskDispatchReply, TaskInfo, TaskKind,
    TaskProgress, TaskRef, TaskReply, TaskRequest, TaskState, TaskWait, ThinkReply,
};
use agentos_proto::{ErrorCode, Opcode};
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult, DetailedTask,
    GetTaskParams, GetTaskResult, JsonObject, ProgressNotificationParam, ProgressToken, Task,
    TaskPayload, TaskStatus, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde::Serialize;
use serde_json::Value;

use super::kernel::{KernelError, KernelLink, Refusal, Wait};
use super::results::{from_result, prompt_text, run_text, structured};
use super::tool_error::{ReplyError, ToolError};
use super::trace::CallerTrace;

/// The longest one TASK `wait` of a followed task lasts before it
/// returns the task as it is, to report its progress. The kernel
/// refreshes a running task's output once a second: polling faster would
/// see nothing newer. A task that ends answers the wait at once.
const PROGRESS_POLL_MS: u64 = 1_000;

/// How often a client holding a task handle is asked to poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1_000;

/// How a call that can run long answers.
#[derive(Debug)]
pub enum Delivery {
    /// With a task handle at once: the client declared the Tasks extension.
    TaskHandle,
    /// When the work ends, sending progress on this token meanwhile.
    WithProgress(ProgressToken),
    /// When the work ends.
    AtTheEnd,
}

impl Delivery {
    /// What the client asked for: a task handle if it declared the Tasks
    /// extension (for this request, or for the session at `initialize`),
    /// else progress if it gave a progress token.
    pub fn asked_for(context: &RequestContext<RoleServer>) -> Delivery {
        let declares_tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        if declares_tasks {
            Delivery::TaskHandle
        } else if let Some(token) = context.meta.get_progress_token() {
            Delivery::WithProgress(token)
        } else {
            Delivery::AtTheEnd
        }
    }
}

/// Runs `request` as a kernel task of `kind` and answers as `answer`
/// says. While the call waits for the task, the client's cancelling the
/// call cancels the task, and so kills its run.
pub async fn run(
    kernel: &KernelLink,
    kind: TaskKind,
    request: &impl Serialize,
    answer: Delivery,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ToolError> {
    let task_id = dispatch(kernel, kind, request, &CallerTrace::of(context)).await?;
    answer_for(kernel, &task_id, answer, context).await
}

/// Starts `request` as a kernel task of `kind`; its id. The trace goes
/// on the dispatch, not the request: the task's span joins it, and the
/// task's own work (its run, its THINKs) nests under that span.
pub async fn dispatch(
    kernel: &KernelLink,
    kind: TaskKind,
    request: &impl Serialize,
    trace: &CallerTrace,
) -> Result<String, ToolError> {
    let request = serde_json::to_value(request).map_err(ReplyError::Unwritable)?;
    let dispatch = TaskRequest::Dispatch(TaskDispatch {
        trace: trace.traceparent(),
        ..TaskDispatch::new(kind, request)
    });
    let reply: TaskDispatchReply = kernel.request(Opcode::TASK, &dispatch, Wait::Quick).await?;
    Ok(reply.task_id)
}

/// Whether a dispatch failed because the caller may not have tasks here
/// (an agent without `permissions.task`, a kernel whose task store is
/// unavailable), where the same work may still run without one.
pub fn tasks_refused(error: &ToolError) -> bool {
    matches!(
        error.refusal_code(),
        Some(ErrorCode::PermissionDenied | ErrorCode::Unavailable)
    )
}

/// The call's answer for dispatched task `task_id`, as `answer` says.
pub async fn answer_for(
    kernel: &KernelLink,
    task_id: &str,
    answer: Delivery,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ToolError> {
    let progress = match answer {
        Delivery::TaskHandle => {
            // The task outlives this call: the client follows it with
            // tasks/get and ends it with tasks/cancel.
            let task = task_state(kernel, task_id).await?;
            return Ok(CreateTaskResult::new(mcp_task(&task)).into());
        }
        Delivery::WithProgress(token) => Some(ProgressReport::new(token, context.peer.clone())),
        Delivery::AtTheEnd => None,
    };
    let task = follow(kernel, task_id, progress, context).await?;
    tool_result(&task).map(CallToolResponse::from)
}

/// Waits for task `task_id` to finish, reporting its progress if asked.
/// If the client cancels the call, the task is cancelled.
async fn follow(
    kernel: &KernelLink,
    task_id: &str,
    mut progress: Option<ProgressReport>,
    context: &RequestContext<RoleServer>,
) -> Result<TaskInfo, ToolError> {
    let mut cancel_unless_finished = CancelsOnDrop::new(kernel.clone(), task_id);
    let wait = TaskRequest::Wait(TaskWait {
        task_id: task_id.to_owned(),
        timeout_ms: Some(PROGRESS_POLL_MS),
    });
    loop {
        let reply = kernel
            .request_until::<TaskReply>(
                Opcode::TASK,
                &wait,
                Wait::AsLongAsTheKernel,
                context.ct.cancelled(),
            )
            .await;
        if context.ct.is_cancelled() {
            cancel_unless_finished.cancel_now().await;
            return Err(ToolError::TaskCancelled);
        }
        let task = match reply {
            Ok(reply) => reply.task,
            Err(err) => {
                cancel_unless_finished.cancel_now().await;
                return Err(err.into());
            }
        };
        if task.state.is_finished() {
            cancel_unless_finished.disarm();
            return Ok(task);
        }
        if let (Some(report), Some(so_far)) = (progress.as_mut(), &task.progress) {
            report.send(so_far).await;
        }
    }
}

/// Cancels a task that a call waits for, if the call is dropped before
/// the task finishes: the work a client asked for as one blocking call
/// does not outlive that call, even when this server stops mid-call.
struct CancelsOnDrop {
    kernel: KernelLink,
    task_id: Option<String>,
}

impl CancelsOnDrop {
    fn new(kernel: KernelLink, task_id: &str) -> CancelsOnDrop {
        CancelsOnDrop {
            kernel,
            task_id: Some(task_id.to_owned()),
        }
    }

    fn disarm(&mut self) {
        self.task_id = None;
    }

    async fn cancel_now(&mut self) {
        if let Some(task_id) = &self.task_id {
            // Nothing to tell a client that has gone; the kernel logs it.
            let _ = self
                .kernel
                .request::<TaskCancelReply>(Opcode::TASK, &cancel_request(task_id), Wait::Quick)
                .await;
            // Only now: dropped before the kernel answered (the server
            // stopping), the drop asks again.
            self.task_id = None;
        }
    }
}

impl Drop for CancelsOnDrop {
    fn drop(&mut self) {
        if let Some(task_id) = self.task_id.take() {
            // No future can run in a drop (the runtime may be stopping),
            // so this one quick request blocks its thread.
            let _ = self.kernel.request_blocking::<TaskCancelReply>(
                Opcode::TASK,
                &cancel_request(&task_id),
                Wait::Quick,
            );
        }
    }
}

fn cancel_request(task_id: &str) -> TaskRequest {
    TaskRequest::Cancel(TaskRef {
        task_id: task_id.to_owned(),
    })
}

/// Progress notifications for one call: one each time the task's output
/// (or a prompt loop's iteration) changes, carrying the output so far.
struct ProgressReport {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    last: TaskProgress,
    sent: u32,
}

impl ProgressReport {
    fn new(token: ProgressToken, peer: Peer<RoleServer>) -> ProgressReport {
        ProgressReport {
            token,
            peer,
            last: TaskProgress::default(),
            sent: 0,
        }
    }

    async fn send(&mut self, so_far: &TaskProgress) {
        if *so_far == self.last {
            return;
        }
        self.sent += 1;
        let notification = ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent))
            .with_message(progress_message(so_far));
        // A client that no longer reads progress still gets its answer.
        let _ = self.peer.notify_progress(notification).await;
        self.last = so_far.clone();
    }
}

/// The output so far, after the iteration under way for a prompt loop.
fn progress_message(so_far: &TaskProgress) -> String {
    match so_far.iteration {
        Some(iteration) => format!("iteration {iteration}\n{}", so_far.output),
        None => so_far.output.clone(),
    }
}

/// `tasks/get`: the task as the kernel has it, with its result once it
/// has finished.
pub async fn get(kernel: &KernelLink, params: GetTaskParams) -> Result<GetTaskResult, McpError> {
    check_task_id(&params.task_id)?;
    // A wait of 0 ms is a status that carries the result once there is
    // one.
    let request = TaskRequest::Wait(TaskWait {
        task_id: params.task_id,
        timeout_ms: Some(0),
    });
    let reply: TaskReply = kernel
        .request(Opcode::TASK, &request, Wait::Quick)
        .await
        .map_err(|err| task_error(err.into()))?;
    let task = reply.task;
    let payload = match task.state {
        TaskState::Queued | TaskState::Running => TaskPayload::Working,
        TaskState::Cancelled => TaskPayload::Cancelled,
        // Every other end is the call's result: an exec that failed or
        // timed out ran, and a task the kernel refused or interrupted is
        // a tool error with the kernel's reason, as in a blocking call.
        _ => TaskPayload::Completed {
            result: call_result_object(tool_result(&task))?,
        },
    };
    Ok(GetTaskResult::new(DetailedTask::new(
        mcp_task(&task),
        payload,
    )))
}

/// `tasks/cancel`: the kernel cancels the task, killing its run. A task
/// that has already finished stays as it ended.
pub async fn cancel(kernel: &KernelLink, params: CancelTaskParams) -> Result<(), McpError> {
    check_task_id(&params.task_id)?;
    kernel
        .request::<TaskCancelReply>(Opcode::TASK, &cancel_request(&params.task_id), Wait::Quick)
        .await
        .map(drop)
        .map_err(|err| task_error(err.into()))
}

/// `tasks/update`: no task of this server asks the client for input, so
/// every response is to a request that is not outstanding, which the
/// extension says to ignore; the task must still be the caller's.
pub async fn update(kernel: &KernelLink, params: UpdateTaskParams) -> Result<(), McpError> {
    check_task_id(&params.task_id)?;
    task_state(kernel, &params.task_id)
        .await
        .map(drop)
        .map_err(task_error)
}

/// A kernel refusal about a task as a JSON-RPC error: the client's
/// mistake for an id the kernel does not know (or not as the caller's),
/// the server's otherwise. The kernel's message names the id as given.
fn task_error(error: ToolError) -> McpError {
    match error.refusal_code() {
        Some(ErrorCode::NotFound | ErrorCode::BadRequest) => {
            McpError::invalid_params(error.to_string(), None)
        }
        _ => McpError::internal_error(error.to_string(), None),
    }
}

/// The longest task id sent to the kernel: its ids are `t-` and 16 hex
/// digits, so a longer one is no one's, and would only come back,
/// echoed in the refusal, as long as it was sent.
const MAX_TASK_ID_BYTES: usize = 64;

/// Refuses, without asking the kernel, an id no task of the kernel's can
/// have.
fn check_task_id(task_id: &str) -> Result<(), McpError> {
    let plausible = task_id.len() <= MAX_TASK_ID_BYTES
        && task_id.strip_prefix("t-").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
        });
    if plausible {
        Ok(())
    } else {
        Err(McpError::invalid_params(
            format!(
                "taskId: not a task id (t- and up to {} letters and digits)",
                MAX_TASK_ID_BYTES - 2
            ),
            None,
        ))
    }
}

async fn task_state(kernel: &KernelLink, task_id: &str) -> Result<TaskInfo, ToolError> {
    let request = TaskRequest::Status(TaskRef {
        task_id: task_id.to_owned(),
    });
    let reply: TaskReply = kernel.request(Opcode::TASK, &request, Wait::Quick).await?;
    Ok(reply.task)
}

/// The MCP view of a kernel task.
fn mcp_task(task: &TaskInfo) -> Task {
    let status = match task.state {
        TaskState::Queued | TaskState::Running => TaskStatus::Working,
        TaskState::Cancelled => TaskStatus::Cancelled,
        _ => TaskStatus::Completed,
    };
    let last_updated = [&task.finished_at, &task.started_at]
        .into_iter()
        .flatten()
        .next()
        .unwrap_or(&task.created_at);
    // No TTL is given: the kernel keeps a finished task for its own
    // configured retention (a day by default) from when it finished, which
    // this server does not know and which does not count from creation.
    let mcp = Task::new(&task.task_id, status, &task.created_at, last_updated)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    match &task.progress {
        Some(so_far) if *so_far != TaskProgress::default() => {
            mcp.with_status_message(progress_message(so_far))
        }
        _ => mcp.with_status_message(task.state.as_str()),
    }
}

/// A finished task's result as the tool call's result: the output of its
/// kind's tool, or a tool error with the kernel's reason.
fn tool_result(task: &TaskInfo) -> Result<CallToolResult, ToolError> {
    let Some(result) = task.result.clone() else {
        return Err(ToolError::NoResult {
            task_id: task.task_id.clone(),
            state: task.state.as_str(),
        });
    };
    if let Some(refusal) = Refusal::in_result(&result) {
        return Err(KernelError::Refused(refusal).into());
    }
    let result = match task.kind {
        TaskKind::Exec => {
            let run: ExecReply = from_result(result)?;
            let text = run_text(&run);
            structured(&run, text)
        }
        TaskKind::Think => {
            let reply: ThinkReply = from_result(result)?;
            let text = reply.content.clone();
            structured(&reply, text)
        }
        TaskKind::Prompt => {
            let output: PromptResult = from_result(result)?;
            let text = prompt_text(&output);
            structured(&output, text)
        }
    };
    Ok(result?)
}

/// A tool result as the JSON object a completed task carries; an error
/// is a result too, flagged `isError`, as the blocking call gives it.
fn call_result_object(result: Result<CallToolResult, ToolError>) -> Result<JsonObject, McpError> {
    let result = result.unwrap_or_else(|error| {
        CallToolResult::error(vec![rmcp::model::ContentBlock::text(error.to_string())])
    });
    match serde_json::to_value(result) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(McpError::internal_error(
            format!("a tool result is not an object: {other}"),
            None,
        )),
        Err(err) => Err(McpError::internal_error(err.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(state: &str, result: Option<Value>) -> TaskInfo {
        serde_json::from_value(json!({
            "task_id": "t-1", "kind": "exec", "label": null, "state": state,
            "created_at": "2026-01-01T00:00:00.000Z",
            "started_at": "2026-01-01T00:00:01.000Z",
            "finished_at": null,
            "progress": {"output": "1\n2\n"},
            "result": result,
        }))
        .expect("a task")
    }

    #[test]
    fn a_running_task_is_working_with_its_output_as_the_message() {
        let mcp = mcp_task(&task("running", None));
        assert_eq!(mcp.task_id, "t-1");
        assert_eq!(mcp.status, TaskStatus::Working);
        assert_eq!(mcp.status_message.as_deref(), Some("1\n2\n"));
        assert_eq!(mcp.last_updated_at, "2026-01-01T00:00:01.000Z");
        assert_eq!(mcp.poll_interval_ms, Some(POLL_INTERVAL_MS));
    }

    #[test]
    fn a_finished_exec_is_its_structured_output_and_a_refusal_a_tool_error() {
        let failed = ExecReply {
            stdout: "x\n".to_owned(),
            exit_code: Some(3),
            ..ExecReply::default()
        };
        let ran = task("failed", Some(serde_json::to_value(failed).unwrap()));
        let result = tool_result(&ran).expect("a result");
        assert_eq!(
            result.structured_content.expect("structured")["exit_code"],
            3
        );
        let interrupted = task(
            "interrupted",
            Some(json!({"code": "interrupted", "error": "the kernel stopped", "success": false})),
        );
        let refused = tool_result(&interrupted).unwrap_err();
        assert_eq!(refused.to_string(), "the kernel stopped (interrupted)");
        assert_eq!(refused.refusal_code(), Some(ErrorCode::Interrupted));
        let object = call_result_object(tool_result(&interrupted)).expect("an object");
        assert_eq!(object["isError"], true);
    }

    #[test]
    fn only_ids_the_kernel_could_have_made_are_sent() {
        assert!(check_task_id("t-0123456789abcdef").is_ok());
        for bad in [
            "",
            "t-",
            "0123",
            "t-../../x",
            "t-a b",
            &format!("t-{}", "9".repeat(63)),
        ] {
            let err = check_task_id(bad).expect_err(bad);
            assert!(!err.message.contains("../"), "{}", err.message);
        }
    }

    #[test]
    fn a_prompt_loops_progress_names_its_iteration() {
        let so_far = TaskProgress {
            output: "55\n".to_owned(),
            iteration: Some(2),
        };
        assert_eq!(progress_message(&so_far), "iteration 2\n55\n");
    }
}
