//! EXEC (0x02): run code in an isolated, pre-warmed sandbox. A run is
//! answered when it ends; refusals (a malformed request, no permission, a
//! full queue) come at once, in EXEC's reply shape, so a client reading
//! `stdout`/`exit_code` finds them too.

use agentos_proto::payload::{to_json, ExecCall, ExecReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::{Kernel, Outcome, Request};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let started = ExecCall::parse(request.payload).and_then(|call| {
        may_exec(kernel, request)?;
        match call {
            ExecCall::Run(run) => {
                kernel
                    .exec
                    .run(run, request.reply_to, &mut kernel.outbox.replies)
            }
            ExecCall::Sessions
            | ExecCall::Close { .. }
            | ExecCall::Snapshot { .. }
            | ExecCall::Restore { .. }
            | ExecCall::Snapshots { .. } => Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "EXEC sessions are not served by this kernel yet; runs without `session` work",
            )),
        }
    });
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// Agents need `permissions.exec`; operators may always.
fn may_exec(kernel: &Kernel, request: &Request<'_>) -> Result<(), ErrorReply> {
    let Some(agent) = request.caller.identity.agent() else {
        return Ok(());
    };
    let grant = kernel
        .agents
        .grant(agent)
        .ok_or_else(|| ErrorReply::new(ErrorCode::PermissionDenied, "unknown calling agent"))?;
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
