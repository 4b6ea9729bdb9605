//! EXEC (0x02): run code in an isolated, pre-warmed sandbox. A run is
//! answered when it ends; refusals (a malformed request, no permission, a
//! full queue) come at once, in EXEC's reply shape, so a client reading
//! `stdout`/`exit_code` finds them too.

use agentos_proto::payload::{
    to_json, ClosedReply, ExecCall, ExecReply, Limits, SessionsReply, SnapshotsReply,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::{agent_grant, Kernel, Outcome, Request};
use crate::exec::{RunCaller, SessionOwner};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let call = match ExecCall::parse(request.payload).and_then(|call| {
        may_exec(kernel, request)?;
        Ok(call)
    }) {
        Ok(call) => call,
        Err(err) => return Outcome::Reply(refusal(err)),
    };
    let caller = RunCaller {
        owner: owner_of(request),
        identity: request.caller.identity,
        limits: own_limits(kernel, request),
    };
    let replies = &mut kernel.outbox.replies;
    let started = match call {
        ExecCall::Run(run) => kernel.exec.run(run, caller, request.reply_to, replies),
        ExecCall::Snapshot { session, name } => {
            kernel
                .exec
                .snapshot(caller, &session, &name, request.reply_to, replies)
        }
        ExecCall::Restore { session, name } => {
            kernel
                .exec
                .restore(caller, &session, &name, request.reply_to, replies)
        }
        ExecCall::Sessions => {
            return Outcome::Reply(to_json(&SessionsReply {
                success: true,
                sessions: kernel.exec.sessions(caller.owner),
            }))
        }
        ExecCall::Close { session } => {
            return Outcome::Reply(to_json(&ClosedReply {
                success: true,
                closed: kernel.exec.close(caller.owner, &session, replies),
            }))
        }
        ExecCall::Snapshots { session } => {
            return Outcome::Reply(match kernel.exec.snapshots(caller.owner, &session) {
                Ok(snapshots) => to_json(&SnapshotsReply {
                    success: true,
                    snapshots,
                }),
                Err(err) => err.to_json(),
            })
        }
    };
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// Whose sessions a caller reaches: an agent's own, or those of the
/// operator's uid.
fn owner_of(request: &Request<'_>) -> SessionOwner {
    match request.caller.identity.agent() {
        Some(agent) => SessionOwner::Agent(agent),
        None => SessionOwner::User(request.caller.uid),
    }
}

/// The caller's own limits, which bound its runs': an agent's in force;
/// an operator has none.
fn own_limits(kernel: &Kernel, request: &Request<'_>) -> Limits {
    request
        .caller
        .identity
        .agent()
        .and_then(|agent| kernel.agents.grant(agent))
        .map(|grant| grant.limits)
        .unwrap_or_default()
}

/// Agents need `permissions.exec`; operators may always.
fn may_exec(kernel: &Kernel, request: &Request<'_>) -> Result<(), ErrorReply> {
    let Some(grant) = agent_grant(kernel, request.caller.identity)? else {
        return Ok(());
    };
    if !grant.permissions.exec {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "agent {} may not EXEC (its permissions.exec is false)",
                grant.name
            ),
        ));
    }
    Ok(())
}

/// A refusal with EXEC's reply fields: no output, no exit code.
fn refusal(err: ErrorReply) -> Vec<u8> {
    to_json(&ExecReply {
        error: Some(err.error),
        code: Some(err.code),
        ..ExecReply::default()
    })
}
