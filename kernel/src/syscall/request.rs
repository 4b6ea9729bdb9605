//! What every handler receives and returns: the request with its caller
//! and reply address, and the outcome — a reply now, a job for a worker,
//! or a reply the kernel delivers later.

use agentos_proto::{ErrorCode, ErrorReply, Opcode};
use serde::Serialize;

use crate::address::{Answer, ReplyTo};
use crate::identity::{Identity, PeerCred, Principal};
use crate::kernel::{Actor, Kernel};
use crate::workers::Job;

/// What a syscall decided.
pub enum Outcome {
    /// Reply with the request's own payload (NOOP); the reactor copies it
    /// straight from its read buffer.
    Echo,
    /// Reply with this now.
    Reply(Answer),
    /// Reply with this payload, then close the connection once it and every
    /// earlier reply are delivered.
    ReplyAndClose(Vec<u8>),
    /// Reply with what this job returns, computed on a worker thread.
    Deferred(Job),
    /// Reply with this now; from the next request on, the connection
    /// speaks as this identity (DELEGATE).
    Become(Identity, Answer),
    /// The kernel will deliver the reply itself, to the request's address,
    /// when a later event completes the request.
    Later,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Echo => f.write_str("Echo"),
            Outcome::Reply(answer) => write!(f, "Reply({} bytes)", answer.json_len()),
            Outcome::ReplyAndClose(p) => write!(f, "ReplyAndClose({} bytes)", p.len()),
            Outcome::Deferred(_) => f.write_str("Deferred"),
            Outcome::Become(identity, _) => write!(f, "Become({identity:?})"),
            Outcome::Later => f.write_str("Later"),
        }
    }
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The caller's identity, derived from its socket.
    pub identity: Identity,
    /// Its user id, from its socket's credentials (what an operator's
    /// sessions belong to).
    pub uid: u32,
}

impl Caller {
    /// Whom the connection speaks for.
    pub fn principal(&self) -> Principal {
        self.identity.principal(self.uid)
    }

    /// The EXEC run whose own kernel connection this is, if it is one: the
    /// run's reply counts the TOOL calls made on it.
    pub fn run(&self) -> Option<u64> {
        match self.identity {
            Identity::Run { run, .. } => Some(run),
            Identity::Operator { .. } | Identity::Agent { .. } | Identity::Delegate { .. } => None,
        }
    }
}

/// One request, as every handler receives it.
#[derive(Debug)]
pub struct Request<'a> {
    /// Who sent it.
    pub caller: Caller,
    /// Its peer's credentials when it connected (what READ and WRITE act
    /// as).
    pub peer: &'a PeerCred,
    /// Its peer's supplementary groups when it connected.
    pub groups: &'a [u32],
    /// Where a [`Outcome::Later`] reply must go.
    pub reply_to: ReplyTo,
    /// Its opcode.
    pub opcode: Opcode,
    /// Its payload.
    pub payload: &'a [u8],
}

/// Who sent `request`, with what it was given; an agent the kernel does not
/// know (any more), or a run that is over, is refused.
pub(super) fn actor<'k>(
    kernel: &'k Kernel,
    request: &Request<'_>,
) -> Result<Actor<'k>, ErrorReply> {
    let actor = Actor::of(request.caller.principal(), &kernel.agents, &kernel.runs)?;
    // An operator's connection may have lowered itself (and then named
    // a delegate, which stays as low).
    Ok(actor.lowered_to(kernel.services.lowered.of(request.reply_to)))
}

/// A typed result as the reply.
pub(super) fn reply<R: Serialize>(result: Result<R, ErrorReply>) -> Outcome {
    match result {
        Ok(reply) => Outcome::Reply(Answer::json(&reply)),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// The reply now, or `None` when it comes later.
pub(super) fn reply_later<R: Serialize>(result: Result<Option<R>, ErrorReply>) -> Outcome {
    match result {
        Ok(Some(reply)) => Outcome::Reply(Answer::json(&reply)),
        Ok(None) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// Why a delegate may not do `what`.
pub(super) fn delegate_refused(what: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::PermissionDenied,
        format!(
            "{what}: a delegate principal (and its runs) reaches only its own sessions and \
             tasks: EXEC, THINK, TASK, PAUSE and RESUME"
        ),
    )
}
