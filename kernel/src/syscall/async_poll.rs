//! Clove's asynchronous EXEC and ASYNC_POLL (0x80), on top of TASK: an
//! EXEC with `"async": true` is dispatched as a TASK of its caller's (so
//! it needs `permissions.task` as TASK does) and answered at once with its
//! `request_id`; ASYNC_POLL hands over the caller's own results that are
//! done, each once, with the EXEC reply as a JSON string.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, AsyncAsk, AsyncExecReply, AsyncPollReply, AsyncPollRequest, AsyncResult, ExecRequest,
    TaskDispatch, TaskKind, TaskReply, TaskState,
};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::async_calls::Pending;
use crate::kernel::{Kernel, Permission};
use crate::tasks::{Reach, Waited};

/// EXEC `run` with `"async": true`: a TASK, answered with its id now.
pub fn exec_later(
    kernel: &mut Kernel,
    request: &Request<'_>,
    run: ExecRequest,
    ask: AsyncAsk,
) -> Outcome {
    let dispatched = dispatch(kernel, request, run, ask);
    match dispatched {
        Ok(reply) => {
            kernel
                .tasks
                .reply_once_saved(request.reply_to, Answer::json(&reply));
            kernel.start_tasks();
            Outcome::Later
        }
        Err(err) => Outcome::Reply(err.into()),
    }
}

fn dispatch(
    kernel: &mut Kernel,
    request: &Request<'_>,
    run: ExecRequest,
    ask: AsyncAsk,
) -> Result<AsyncExecReply, ErrorReply> {
    let actor = actor(kernel, request)?;
    actor.require(Permission::Task)?;
    let owner = actor.principal();
    let request_id = kernel
        .services
        .async_calls
        .request_id(owner, ask.request_id)?;
    let run = serde_json::to_value(&run).map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("the run cannot be made a task: {err}"),
        )
    })?;
    let task_id = kernel.tasks.dispatch(
        owner,
        TaskDispatch {
            label: Some(format!("async-{request_id}")),
            ..TaskDispatch::new(TaskKind::Exec, run)
        },
    )?;
    kernel
        .services
        .async_calls
        .add(owner, request_id, task_id.clone());
    Ok(AsyncExecReply {
        success: true,
        request_id,
        task_id,
    })
}

/// ASYNC_POLL.
pub fn poll(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    match finished(kernel, request) {
        Ok(done) => Outcome::Deferred(Box::new(move || {
            let results: Vec<AsyncResult> = done
                .into_iter()
                .map(|(pending, waited)| AsyncResult {
                    request_id: pending.request_id,
                    opcode: Opcode::EXEC.0,
                    opcode_name: String::from("EXEC"),
                    payload: payload_of(waited),
                    task_id: pending.task_id,
                })
                .collect();
            to_json(&AsyncPollReply {
                success: true,
                count: results.len(),
                results,
            })
        })),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// The caller's requests whose tasks have finished (at most the request's
/// `max`), taken off its list, each with its task's reply; a request
/// whose task is gone is dropped.
fn finished(
    kernel: &mut Kernel,
    request: &Request<'_>,
) -> Result<Vec<(Pending, Waited)>, ErrorReply> {
    let asked = AsyncPollRequest::parse(request.payload)?;
    let owner = actor(kernel, request)?.principal();
    let reach = Reach::Own(owner);
    let mut done = Vec::new();
    for pending in kernel.services.async_calls.waiting_of(owner) {
        if done.len() >= asked.limit() {
            break;
        }
        match kernel.tasks.status(reach, &pending.task_id) {
            Ok(task) if !task.state.is_finished() => continue,
            Ok(_) => {}
            Err(_) => {
                kernel
                    .services
                    .async_calls
                    .remove(owner, pending.request_id);
                continue;
            }
        }
        let waited = kernel.tasks.wait(
            reach,
            &pending.task_id,
            Some(Duration::ZERO),
            request.reply_to,
            Instant::now(),
        )?;
        kernel
            .services
            .async_calls
            .remove(owner, pending.request_id);
        done.push((pending, waited));
    }
    Ok(done)
}

/// The EXEC reply a finished task holds, as a JSON string (on a worker:
/// it may be read from the store).
fn payload_of(waited: Waited) -> String {
    let (result, state) = match waited {
        Waited::Reply(bytes) => match serde_json::from_slice::<TaskReply>(&bytes) {
            Ok(reply) => (reply.task.result, reply.task.state),
            Err(err) => return internal(&format!("the task's reply does not read: {err}")),
        },
        Waited::ReadResult { read, task } => match read.read() {
            Ok(bytes) => (
                bytes.and_then(|bytes| serde_json::from_slice(&bytes).ok()),
                task.state,
            ),
            Err(err) => return internal(&format!("the task's result cannot be read: {err}")),
        },
        Waited::Later => return internal("the task had not finished"),
    };
    match result {
        Some(result) => result.to_string(),
        None => ended_without_result(state),
    }
}

fn ended_without_result(state: TaskState) -> String {
    let word = serde_json::to_value(state)
        .ok()
        .and_then(|word| word.as_str().map(str::to_owned))
        .unwrap_or_default();
    String::from_utf8_lossy(
        &ErrorReply::new(ErrorCode::Other, format!("the run's task ended {word}")).to_json(),
    )
    .into_owned()
}

fn internal(why: &str) -> String {
    String::from_utf8_lossy(&ErrorReply::new(ErrorCode::Internal, why).to_json()).into_owned()
}
