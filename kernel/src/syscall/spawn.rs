//! SPAWN (0x10): start an agent. The reply is delivered later, once the
//! workload runs or has failed to start (see `agents`); refusals come at
//! once.

use agentos_proto::payload::SpawnRequest;

use super::{Caller, Io, Kernel, Outcome};
use crate::reactor::ReplyTo;

pub fn handle(
    kernel: &mut Kernel,
    io: &mut Io<'_>,
    caller: &Caller,
    reply_to: ReplyTo,
    payload: &[u8],
) -> Outcome {
    let started = SpawnRequest::parse(payload).and_then(|request| {
        // An agent's child draws on what its token budgets still allow.
        let tokens_left = caller
            .identity
            .agent()
            .and_then(|id| kernel.agents.grant(id))
            .and_then(|grant| kernel.llm.tokens_left(grant.budgets));
        kernel
            .agents
            .spawn(io, caller.identity, request, tokens_left, reply_to)
    });
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(err.to_json()),
    }
}
