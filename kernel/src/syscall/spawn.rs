//! SPAWN (0x10): start an agent. The reply is delivered later, once the
//! workload runs or has failed to start (see `agents`); refusals come at
//! once.
//!
//! An operator may spawn anything its request describes. An agent may
//! spawn only if its permissions say so, only sandboxed children, and
//! never a child with more than it has (the agents table's inheritance
//! rules), drawing on what its token budgets still allow.

use agentos_proto::payload::SpawnRequest;
use agentos_proto::{ErrorCode, ErrorReply};

use super::kernel::agent_sandboxes;
use super::{Kernel, Outcome, Request};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let started = SpawnRequest::parse(request.payload).and_then(|spawn| {
        let tokens_left = match request.caller.identity.agent() {
            Some(parent) => may_spawn(kernel, parent, &spawn)?,
            None => None,
        };
        kernel.agents.spawn(
            &mut agent_sandboxes(&mut kernel.sandboxes),
            request.caller.identity,
            spawn,
            tokens_left,
            request.reply_to,
        )
    });
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(err.to_json()),
    }
}

/// Whether agent `parent` may make this SPAWN; if so, the tokens its
/// budgets still allow (`None`: it has no budget).
fn may_spawn(
    kernel: &Kernel,
    parent: u32,
    spawn: &SpawnRequest,
) -> Result<Option<u64>, ErrorReply> {
    let grant = kernel
        .agents
        .grant(parent)
        .ok_or_else(|| ErrorReply::new(ErrorCode::PermissionDenied, "unknown calling agent"))?;
    if !grant.permissions.spawn {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "agent {} may not spawn agents (its permissions.spawn is false)",
                grant.name
            ),
        ));
    }
    // A boot agent that is down must not find a stand-in under its name.
    if kernel
        .config
        .agents
        .boot
        .iter()
        .any(|b| b.name == spawn.name)
    {
        return Err(ErrorReply::new(
            ErrorCode::AlreadyExists,
            format!(
                "the name {:?} is reserved for a boot agent; choose another",
                spawn.name
            ),
        ));
    }
    if !spawn.sandboxed {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            "SPAWN field `sandboxed`: agents may only spawn sandboxed agents",
        ));
    }
    Ok(kernel.llm.tokens_left(grant.budgets))
}
