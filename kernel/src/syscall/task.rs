//! TASK (0x13): background work owned by the caller's principal — the
//! agent, or the operator's uid. Another owner's task is `not_found`, so
//! ids tell nothing. `dispatch` answers with the id at once; `wait` is
//! answered when the task ends or its timeout passes, while the
//! connection's other requests go on.

use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, TaskCancelReply, TaskDispatchReply, TaskInfo, TaskKind, TaskReply, TaskRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::{agent_grant, reply, Kernel, Outcome, Request};
use crate::tasks::store::read_result;
use crate::tasks::{Owner, Waited};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let task = match TaskRequest::parse(request.payload) {
        Ok(task) => task,
        Err(err) => return Outcome::Reply(err.to_json()),
    };
    let owner = owner_of(kernel, request);
    match task {
        TaskRequest::Dispatch(dispatch) => {
            match may_dispatch(kernel, request, dispatch.kind)
                .and_then(|()| kernel.tasks.dispatch(owner, dispatch))
            {
                Ok(task_id) => {
                    // The id goes out once the task is on disk.
                    let reply = to_json(&TaskDispatchReply {
                        success: true,
                        task_id,
                    });
                    kernel.tasks.reply_once_saved(request.reply_to, reply);
                    kernel.start_tasks();
                    Outcome::Later
                }
                Err(err) => Outcome::Reply(err.to_json()),
            }
        }
        TaskRequest::Status(task) => {
            // Only the task asked about needs its output read now.
            if let Some(number) = kernel.tasks.number_of(&task.task_id) {
                kernel.refresh_progress_of(number, false);
            }
            reply(
                kernel
                    .tasks
                    .status(owner, &task.task_id)
                    .map(|task| TaskReply {
                        success: true,
                        task,
                    }),
            )
        }
        TaskRequest::Wait(wait) => {
            let timeout = wait.timeout_ms.map(Duration::from_millis);
            let now = Instant::now();
            match kernel
                .tasks
                .wait(owner, &wait.task_id, timeout, request.reply_to, now)
            {
                Ok(Waited::Reply(reply)) => Outcome::Reply(reply),
                Ok(Waited::Later) => Outcome::Later,
                Ok(Waited::ReadResult { path, task }) => {
                    Outcome::Deferred(Box::new(move || with_result(&path, task)))
                }
                Err(err) => Outcome::Reply(err.to_json()),
            }
        }
        TaskRequest::List(filter) => reply(kernel.tasks.list(owner, &filter)),
        TaskRequest::Cancel(task) => {
            let cancelled = kernel
                .tasks
                .cancel(owner, &task.task_id, &mut kernel.outbox.replies);
            reply(cancelled.map(|(cancelled, stop)| {
                if let Some(stop) = stop {
                    kernel.stop_task(stop);
                }
                kernel.close_ended_task_sessions();
                // Its place is free for a queued task of its owner's.
                kernel.start_tasks();
                TaskCancelReply {
                    success: true,
                    cancelled,
                }
            }))
        }
    }
}

/// Whose tasks the caller reaches: its agent's (of this kernel's life), or
/// its operator uid's.
fn owner_of(kernel: &Kernel, request: &Request<'_>) -> Owner {
    match request.caller.identity.agent() {
        Some(id) => Owner::Agent {
            boot: kernel.tasks.boot(),
            id,
        },
        None => Owner::User(request.caller.uid),
    }
}

/// A task needs what its work needs: `permissions.exec` for EXEC,
/// `permissions.think` for THINK, both for the prompt loop.
fn may_dispatch(kernel: &Kernel, request: &Request<'_>, kind: TaskKind) -> Result<(), ErrorReply> {
    let Some(grant) = agent_grant(kernel, request.caller.identity)? else {
        return Ok(());
    };
    let (needs, has) = match kind {
        TaskKind::Exec => ("exec", grant.permissions.exec),
        TaskKind::Think => ("think", grant.permissions.think),
        TaskKind::Prompt => (
            "exec and think",
            grant.permissions.exec && grant.permissions.think,
        ),
    };
    if has {
        Ok(())
    } else {
        Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "agent {} may not dispatch a {} task (it needs permissions.{needs})",
                grant.name,
                kind.as_str()
            ),
        ))
    }
}

/// `wait`'s reply for a finished task whose result is read back from the
/// store (on a worker).
fn with_result(path: &Path, mut task: TaskInfo) -> Vec<u8> {
    match read_result(path, &task.task_id) {
        Ok(result) => {
            task.result = result.and_then(|bytes| serde_json::from_slice(&bytes).ok());
            to_json(&TaskReply {
                success: true,
                task,
            })
        }
        Err(err) => ErrorReply::new(
            ErrorCode::Internal,
            format!("the task's result cannot be read from the store: {err}"),
        )
        .to_json(),
    }
}
