//! DELEGATE: an operator's connection narrows itself, for as long as it
//! lasts, to a delegate principal it names — a tenant of the operator, as
//! an HTTP face's API key is. What a delegate creates is its own; it
//! reaches only EXEC (its runs, sessions, volumes and snapshots), THINK
//! and TASK, within what its operator has. Nothing is registered: a
//! delegate is whoever names it, so the same name finds the same
//! sessions and tasks again, after a restart too.

use agentos_proto::payload::{AuditCategory, DelegateReply, DelegateRequest, PrincipalInfo};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};

use super::audit::note;
use super::request::{actor, delegate_refused, Outcome, Request};
use crate::address::Answer;
use crate::identity::Identity;
use crate::kernel::{Actor, Kernel, Root};

/// DELEGATE.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    match become_delegate(kernel, request) {
        Ok((identity, reply)) => {
            // Recorded as the operator who named it.
            let named = &reply.principal;
            note(
                kernel,
                request,
                AuditCategory::Security,
                "DELEGATE_NAMED",
                None,
                named,
            );
            Outcome::Become(identity, Answer::json(&reply))
        }
        Err(err) => Outcome::Reply(err.into()),
    }
}

fn become_delegate(
    kernel: &Kernel,
    request: &Request<'_>,
) -> Result<(Identity, DelegateReply), ErrorReply> {
    let name = DelegateRequest::parse(request.payload)?.delegate;
    let uid = match actor(kernel, request)? {
        Actor::Operator { uid, .. } => uid,
        Actor::Delegate { uid, name: own, .. } if own == name => uid,
        Actor::Delegate { name: own, .. } => {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "this connection speaks for delegate {own:?} until it closes; it cannot \
                     speak for another"
                ),
            ))
        }
        other => {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "{} may not name a delegate: only an operator's connection may",
                    other.name()
                ),
            ))
        }
    };
    let id = request.caller.identity.id();
    let reply = DelegateReply {
        success: true,
        agent_id: id,
        principal: PrincipalInfo::Delegate {
            name,
            of: Box::new(PrincipalInfo::Operator { uid }),
        },
    };
    Ok((Identity::Delegate { id, name }, reply))
}

/// Whether a delegate, or a run of one, may send `opcode` at all: what
/// it reaches is its own sessions and tasks, and the model.
fn delegate_may(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::NOOP
            | Opcode::HELLO
            | Opcode::EXIT
            | Opcode::GET_PERMS
            | Opcode::SET_PERMS
            | Opcode::ASYNC_POLL
            | Opcode::EXEC
            | Opcode::THINK
            | Opcode::TASK
            | Opcode::PAUSE
            | Opcode::RESUME
            | Opcode::DELEGATE
    )
}

/// The refusal of `request` if its caller is a delegate, or a run of one,
/// and its opcode reaches beyond a delegate's own (see
/// [`delegate_may`]).
pub(super) fn beyond_a_delegate(kernel: &Kernel, request: &Request<'_>) -> Option<ErrorReply> {
    let of_a_delegate = match request.caller.identity {
        Identity::Delegate { .. } => true,
        Identity::Run { run, .. } => kernel
            .runs
            .get(run)
            .is_some_and(|grant| matches!(grant.root, Root::Delegate(..))),
        Identity::Operator { .. } | Identity::Agent { .. } => false,
    };
    // An opcode no one knows is `unknown_opcode`, as it is to anyone.
    let name = request.opcode.name()?;
    (of_a_delegate && !delegate_may(request.opcode)).then(|| delegate_refused(name))
}
