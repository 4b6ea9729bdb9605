//! TASK in a fleet: an operator's or a delegate's task lives in the
//! fleet's database, is run by whichever node claims it, and is looked at,
//! waited for and cancelled through any node. Agents' and runs' tasks stay
//! on their node (their owner ends with it), as do the tasks this node
//! kept before it joined. Every answer comes back from the fleet thread
//! through the kernel: the reactor never waits on the database.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    TaskCancelReply, TaskDispatch, TaskDispatchReply, TaskKind, TaskListReply, TaskReply,
    TaskRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{Outcome, Request};
use crate::address::Answer;
use crate::fleet::owners::fleet_owner;
use crate::fleet::tasks::{self, FleetReach, NewTask};
use crate::fleet::{FleetError, FleetLink, Wait};
use crate::identity::Principal;
use crate::kernel::Kernel;
use crate::tasks::ids::{new_fleet_id, FLEET_ID_PREFIX};

/// The longest `wait` (as on one node).
const MAX_WAIT: Duration = Duration::from_secs(600);
/// A `wait` without a timeout waits this long.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// Who serves a TASK request.
pub enum Served {
    /// The fleet did (or refused it): the outcome.
    Fleet(Outcome),
    /// It is this node's to serve.
    Here(TaskRequest),
}

/// Serves `task` in the fleet when it is the fleet's; gives it back when it
/// is this node's to serve.
pub fn serve(
    kernel: &Kernel,
    request: &Request<'_>,
    task: TaskRequest,
    owner: Principal,
    operator: bool,
) -> Served {
    let link = match kernel.fleet.link() {
        Ok(link) => link,
        Err(_) => return refuse_without_fleet(task),
    };
    // A task this node kept before it joined is looked at here, and
    // nothing of the fleet is asked for it.
    let local = |id: &str| !id.starts_with(FLEET_ID_PREFIX);
    let fleets = match &task {
        TaskRequest::Dispatch(_) => true,
        TaskRequest::Status(task) | TaskRequest::Cancel(task) => !local(&task.task_id),
        TaskRequest::Wait(wait) => !local(&wait.task_id),
        TaskRequest::List(filter) => filter.fleet,
    };
    if !fleets {
        return Served::Here(task);
    }
    let fleet_owner = match fleet_owner(owner) {
        Ok(Some(fleet_owner)) => fleet_owner,
        Ok(None) => return refuse_for_agents(task),
        Err(err) => return Served::Fleet(Outcome::Reply(err.into_reply().into())),
    };
    let reach = if operator {
        FleetReach::Any
    } else {
        FleetReach::Own(fleet_owner.clone())
    };
    let asked = match task {
        TaskRequest::Dispatch(dispatch) => {
            let new = NewTask {
                pin: match pin(link, &dispatch) {
                    Ok(pin) => pin,
                    Err(refusal) => return Served::Fleet(Outcome::Reply(refusal.into())),
                },
                owner: fleet_owner,
                from: link.node().to_owned(),
                max_queued: kernel.config().tasks.max_queued_per_owner as i64,
                dispatch,
            };
            let id = new_fleet_id();
            link.ask(request.reply_to, move |client| {
                let task_id = tasks::dispatch(client, &new, &id)?;
                Ok(Answer::json(&TaskDispatchReply {
                    success: true,
                    task_id,
                }))
            })
        }
        TaskRequest::Status(task) if !local(&task.task_id) => {
            link.ask(request.reply_to, move |client| {
                let found = tasks::status(client, &reach, &task.task_id, false)?;
                let task = found.ok_or(FleetError::NotFound(task.task_id))?;
                Ok(Answer::json(&TaskReply {
                    success: true,
                    task,
                }))
            })
        }
        TaskRequest::Wait(wait) if !local(&wait.task_id) => {
            let timeout = wait.timeout_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
            link.wait(Wait {
                task_id: wait.task_id,
                reach,
                reply_to: request.reply_to,
                deadline: Instant::now() + timeout.min(MAX_WAIT),
            })
        }
        TaskRequest::Cancel(task) if !local(&task.task_id) => {
            let why = if operator {
                "the task was cancelled by an operator"
            } else {
                "the task was cancelled by its owner"
            };
            link.ask(request.reply_to, move |client| {
                let cancelled = tasks::cancel(client, &reach, &task.task_id, why)?;
                let cancelled = cancelled.ok_or(FleetError::NotFound(task.task_id))?;
                Ok(Answer::json(&TaskCancelReply {
                    success: true,
                    cancelled,
                }))
            })
        }
        TaskRequest::List(filter) if filter.fleet => {
            if filter.owner.is_some() {
                let refusal =
                    bad_request("TASK field `owner`: not with `fleet`, which lists yours");
                return Served::Fleet(Outcome::Reply(refusal.into()));
            }
            link.ask(request.reply_to, move |client| {
                let (tasks, next) = tasks::list(client, &fleet_owner, &filter)?;
                Ok(Answer::json(&TaskListReply {
                    success: true,
                    tasks,
                    next,
                }))
            })
        }
        here => return Served::Here(here),
    };
    Served::Fleet(match asked {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into_reply().into()),
    })
}

/// The node a new task must run on: the one it names, or this one when
/// its work names a session (sessions are their node's).
fn pin(link: &FleetLink, dispatch: &TaskDispatch) -> Result<Option<String>, ErrorReply> {
    let session = match dispatch.kind {
        TaskKind::Exec => dispatch.exec()?.session,
        TaskKind::Prompt => dispatch.prompt()?.session,
        TaskKind::Think => None,
    };
    match (&dispatch.node, session) {
        (Some(node), Some(session)) if node != link.node() => Err(bad_request(format!(
            "TASK field `node`: the task names session {session:?}, which is this node's \
             ({:?}); a task naming a session runs on that session's node",
            link.node()
        ))),
        (Some(node), _) => Ok(Some(node.clone())),
        (None, Some(_)) => Ok(Some(link.node().to_owned())),
        (None, None) => Ok(None),
    }
}

/// A node without a fleet serves every task itself, and refuses what only
/// a fleet can do, by name.
fn refuse_without_fleet(task: TaskRequest) -> Served {
    refuse_fleet_field(
        task,
        ErrorCode::Unavailable,
        "this node has not joined a fleet ([fleet] database)",
    )
}

/// An agent's or a run's tasks are its node's: the fleet's fields are
/// refused by name.
fn refuse_for_agents(task: TaskRequest) -> Served {
    refuse_fleet_field(
        task,
        ErrorCode::PermissionDenied,
        "the fleet's tasks are operators' and delegates'; an agent's or a run's tasks run on \
         its own node",
    )
}

/// Refuses `task` with `code` because `why` when it uses a field only a
/// fleet's task has (`max_attempts` 1 is every task's); else it is this
/// node's to serve.
fn refuse_fleet_field(task: TaskRequest, code: ErrorCode, why: &str) -> Served {
    let field = match &task {
        TaskRequest::Dispatch(d) if d.node.is_some() => "node",
        TaskRequest::Dispatch(d) if d.max_attempts.is_some_and(|n| n > 1) => "max_attempts",
        TaskRequest::Dispatch(d) if d.idempotency_key.is_some() => "idempotency_key",
        TaskRequest::List(filter) if filter.fleet => "fleet",
        _ => return Served::Here(task),
    };
    let refusal = ErrorReply::new(code, format!("TASK field `{field}`: {why}"));
    Served::Fleet(Outcome::Reply(refusal.into()))
}

fn bad_request(why: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorCode::BadRequest, why)
}
