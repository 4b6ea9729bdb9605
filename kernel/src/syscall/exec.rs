//! EXEC (0x02): run code in an isolated, pre-warmed sandbox. A run is
//! answered when it ends; refusals (a malformed request, no permission, a
//! full queue) come at once, in EXEC's reply shape, so a client reading
//! `stdout`/`exit_code` finds them too.
//!
//! The run is a principal of its own (see `runs`): its kernel connection
//! gets what the request's `permissions` ask for, within the caller's, and
//! nothing of the caller's beyond that. Sessions belong to the caller's
//! principal — an agent, an operator's uid, or a run.

use agentos_proto::payload::{
    AsyncAsk, ClosedReply, ExecCall, ExecReply, LifetimeReply, RemovedReply, SessionOpen,
    SessionsReply, SnapshotsReply,
};
use agentos_proto::ErrorReply;

use super::request::{actor, reply, Outcome, Request};
use super::{async_poll, templates, volumes};
use crate::address::{Answer, Reply};
use crate::exec::{Answered, Exec, RunCaller, SessionOp};
use crate::kernel::{fleet_sessions, Kernel, Permission};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let call = ExecCall::parse(request.payload).and_then(|call| {
        actor(kernel, request)?.require(Permission::Exec)?;
        Ok(call)
    });
    let call = match call {
        Ok(call) => call,
        Err(err) => return Outcome::Reply(refusal(err)),
    };
    let principal = request.caller.principal();
    let started = match call {
        ExecCall::Run(run) => match AsyncAsk::of_exec(request.payload) {
            Ok(Some(ask)) => return async_poll::exec_later(kernel, request, *run, ask),
            Ok(None) => kernel.start_run(*run, principal, request.reply_to),
            Err(err) => Err(err),
        },
        ExecCall::Snapshot {
            session,
            name,
            state,
        } => session_order(
            kernel,
            request,
            &session,
            SessionOp::Snapshot { name: &name, state },
        ),
        ExecCall::Restore {
            session,
            name,
            into,
        } => fleet_sessions::refuse_restore_if_kept(&kernel.fleet, principal, &session, &into)
            .and_then(|()| {
                let into = into.as_deref();
                let op = SessionOp::Restore { name: &name, into };
                session_order(kernel, request, &session, op)
            }),
        ExecCall::Templates | ExecCall::BuildTemplate { .. } | ExecCall::RemoveTemplate { .. } => {
            return templates::handle(kernel, request, call)
        }
        ExecCall::Volumes | ExecCall::CreateVolume { .. } | ExecCall::RemoveVolume { .. } => {
            return volumes::handle(kernel, request, call)
        }
        ExecCall::Open(open) => {
            // A run of no code, answered as the session.
            let SessionOpen { mut run, setup } = *open;
            run.opens = Some(Box::new(setup));
            return match kernel.start_run(run, principal, request.reply_to) {
                Ok(()) => Outcome::Later,
                Err(err) => Outcome::Reply(err.into()),
            };
        }
        ExecCall::Lifetime { session, lifetime } => {
            let key = (principal, session);
            let ends = kernel.exec.set_lifetime(&key, lifetime);
            return reply(ends.map(|ends| LifetimeReply {
                success: true,
                session: key.1,
                ends_at: ends.map(|ends| ends.text()),
            }));
        }
        ExecCall::Proc(call) => {
            let reply_to = request.reply_to;
            return in_session(kernel, request, |exec, caller, replies| {
                exec.proc_call(caller, call, reply_to, replies)
            });
        }
        ExecCall::Files(call) => {
            let reply_to = request.reply_to;
            return in_session(kernel, request, |exec, caller, replies| {
                exec.file_call(caller, call, reply_to, replies)
            });
        }
        ExecCall::Sessions { usage } => {
            return Outcome::Reply(Answer::json(&SessionsReply {
                success: true,
                sessions: kernel.exec.sessions(principal, usage),
            }))
        }
        ExecCall::Close { session } => {
            let replies = &mut kernel.outbox.replies;
            let closed = kernel.exec.close(principal, &session, replies);
            fleet_sessions::closed(&mut kernel.fleet, principal, &session);
            return Outcome::Reply(Answer::json(&ClosedReply {
                success: true,
                closed,
            }));
        }
        ExecCall::Snapshots { session } => {
            let store = &mut kernel.exec.disks().store;
            return reply(store.snapshots_of(&(principal, session)).map(|snapshots| {
                SnapshotsReply {
                    success: true,
                    snapshots,
                }
            }));
        }
        ExecCall::RemoveSnapshot { session, name } => {
            let store = &mut kernel.exec.disks().store;
            let removed = store.remove_snapshot(&(principal, session), &name);
            return reply(removed.map(|()| RemovedReply {
                success: true,
                removed: true,
            }));
        }
    };
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// What EXEC needs to know of the caller of a session's snapshot or restore.
fn run_caller(kernel: &Kernel, request: &Request<'_>) -> Result<RunCaller, ErrorReply> {
    Ok(kernel.run_caller(&actor(kernel, request)?))
}

/// A refusal with EXEC's reply fields: no output, no exit code.
fn refusal(err: ErrorReply) -> Answer {
    ExecReply::from(err).into()
}

/// Queues a snapshot or restore for the caller's session.
fn session_order(
    kernel: &mut Kernel,
    request: &Request<'_>,
    session: &str,
    op: SessionOp<'_>,
) -> Result<(), ErrorReply> {
    let caller = run_caller(kernel, request)?;
    let replies = &mut kernel.outbox.replies;
    kernel
        .exec
        .session_order(caller, session, op, request.reply_to, replies)
}

/// A process or file op in one of the caller's own sessions.
fn in_session(
    kernel: &mut Kernel,
    request: &Request<'_>,
    op: impl FnOnce(&mut Exec, RunCaller, &mut Vec<Reply>) -> Answered,
) -> Outcome {
    let caller = match run_caller(kernel, request) {
        Ok(caller) => caller,
        Err(err) => return Outcome::Reply(err.into()),
    };
    match op(&mut kernel.exec, caller, &mut kernel.outbox.replies) {
        Ok(Some(answer)) => Outcome::Reply(answer),
        Ok(None) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into()),
    }
}
