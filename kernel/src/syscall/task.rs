//! TASK (0x13): background work owned by the caller's principal — the
//! agent, the operator's uid, or an EXEC run (given `permissions.task`).
//! Another owner's task is `not_found`, so ids tell nothing — except to an
//! operator, who may look at, list and cancel anyone's. `dispatch` answers with the id at once; `wait` is
//! answered when the task ends or its timeout passes, while the
//! connection's other requests go on.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, TaskCancelReply, TaskDispatchReply, TaskInfo, TaskKind, TaskList, TaskListReply,
    TaskOwner, TaskReply, TaskRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::fleet_task::{self, Served};
use super::request::{actor, reply, Outcome, Request};
use crate::address::Answer;
use crate::identity::Principal;
use crate::kernel::Kernel;
use crate::kernel::{Actor, Permission};
use crate::tasks::store::ReadBack;
use crate::tasks::{Reach, Waited};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let task = match TaskRequest::parse(request.payload) {
        Ok(task) => task,
        Err(err) => return Outcome::Reply(err.into()),
    };
    let (owner, operator) = match owner_of(kernel, request) {
        Ok(owner) => owner,
        Err(err) => return Outcome::Reply(err.into()),
    };
    if let TaskRequest::Dispatch(dispatch) = &task {
        if let Err(err) = may_dispatch(kernel, request, dispatch.kind) {
            return Outcome::Reply(err.into());
        }
    }
    let task = match fleet_task::serve(kernel, request, task, owner, operator) {
        Served::Fleet(outcome) => return outcome,
        Served::Here(task) => task,
    };
    // An operator reaches every task by its id; anyone else only its own.
    let reach = if operator {
        Reach::Any
    } else {
        Reach::Own(owner)
    };
    match task {
        TaskRequest::Dispatch(dispatch) => {
            match kernel.tasks.dispatch(owner, dispatch) {
                Ok(task_id) => {
                    // The id goes out once the task is on disk.
                    let reply = Answer::json(&TaskDispatchReply {
                        success: true,
                        task_id,
                    });
                    kernel.tasks.reply_once_saved(request.reply_to, reply);
                    kernel.start_tasks();
                    Outcome::Later
                }
                Err(err) => Outcome::Reply(err.into()),
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
                    .status(reach, &task.task_id)
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
                .wait(reach, &wait.task_id, timeout, request.reply_to, now)
            {
                Ok(Waited::Reply(reply)) => Outcome::Reply(Answer::Json(reply)),
                Ok(Waited::Later) => Outcome::Later,
                Ok(Waited::ReadResult { read, task }) => {
                    Outcome::Deferred(Box::new(move || with_result(read, *task)))
                }
                Err(err) => Outcome::Reply(err.into()),
            }
        }
        TaskRequest::List(filter) => reply(list(kernel, owner, operator, &filter)),
        TaskRequest::Cancel(task) => {
            let cancelled = kernel
                .tasks
                .cancel(reach, &task.task_id, &mut kernel.outbox.replies);
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

/// Whose tasks the caller's are (its agent's of this kernel's life, its
/// operator uid's, its delegate's, or its run's), and whether it is an
/// operator. A run, or a delegate, needs `task` for any of it.
fn owner_of(kernel: &Kernel, request: &Request<'_>) -> Result<(Principal, bool), ErrorReply> {
    let actor = actor(kernel, request)?;
    if let Actor::Run { .. } | Actor::Delegate { .. } = actor {
        actor.require(Permission::Task)?;
    }
    let operator = matches!(actor, Actor::Operator { .. });
    Ok((actor.principal(), operator))
}

/// `list`: the caller's own tasks; for an operator naming an `owner`, that
/// agent's (by id or name) or everyone's (`"*"`), each saying whose it is.
fn list(
    kernel: &Kernel,
    own: Principal,
    operator: bool,
    filter: &TaskList,
) -> Result<TaskListReply, ErrorReply> {
    let Some(whose) = &filter.owner else {
        return kernel.tasks.list(Reach::Own(own), filter, None);
    };
    if !operator {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            "TASK field `owner`: only operators may list another owner's tasks",
        ));
    }
    let reach = match whose {
        TaskOwner::Agent(id) => Reach::Own(Principal::Agent { id: *id }),
        owner if owner.is_everyone() => Reach::Any,
        TaskOwner::Name(name) => {
            let id = kernel
                .agents
                .live_named(name)
                .map(|(id, _)| id)
                .ok_or_else(|| {
                    ErrorReply::new(
                        ErrorCode::NotFound,
                        format!("TASK field `owner`: no live agent named {name:?}"),
                    )
                })?;
            Reach::Own(Principal::Agent { id })
        }
    };
    let describe = |principal| kernel.runs.describe(principal, &kernel.agents);
    kernel.tasks.list(reach, filter, Some(&describe))
}

/// A task needs `permissions.task` and what its work needs:
/// `permissions.exec` for EXEC, `permissions.think` for THINK, both for the
/// prompt loop.
fn may_dispatch(kernel: &Kernel, request: &Request<'_>, kind: TaskKind) -> Result<(), ErrorReply> {
    let actor = actor(kernel, request)?;
    actor.require(Permission::Task)?;
    match kind {
        TaskKind::Exec => actor.require(Permission::Exec),
        TaskKind::Think => actor.require(Permission::Think),
        TaskKind::Prompt => actor
            .require(Permission::Exec)
            .and(actor.require(Permission::Think)),
    }
}

/// `wait`'s reply for a finished task whose result is read back from the
/// store (on a worker).
fn with_result(read: ReadBack, mut task: TaskInfo) -> Vec<u8> {
    match read.read() {
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
