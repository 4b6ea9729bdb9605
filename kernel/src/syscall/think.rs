//! THINK (0x01): a prompt for the shared LLM. The request is queued and
//! answered when the provider has; refusals (a malformed request, a spent
//! quota, a full queue) are answered at once, in THINK's reply shape.

use agentos_proto::payload::{to_json, ThinkReply, ThinkRequest};
use agentos_proto::ErrorReply;

use super::runs::{Actor, Power};
use super::{actor, Kernel, Outcome, Request};
use crate::llm::Asker;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let queued = ThinkRequest::parse(request.payload).and_then(|think| {
        let asker = asker(
            kernel,
            &actor(kernel, request)?,
            request.caller.identity.id(),
        )?;
        kernel
            .llm
            .think(&asker, request.reply_to, think, &mut kernel.outbox.replies)
    });
    match queued {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// Who is asking, as the fair queue and the token budgets know it. An
/// agent's weight and quota come from its name and its SPAWN permissions;
/// an EXEC run's THINKs are its agent's — queued and charged as the
/// agent's, within the run's own budget too if it has one — and an
/// operator's (or an operator's run's) are those of `flow`, the asking
/// connection, with neither limit.
pub fn asker(kernel: &Kernel, actor: &Actor<'_>, flow: u32) -> Result<Asker, ErrorReply> {
    actor.may(Power::Think)?;
    let agent = actor.root().agent();
    let weight = agent
        .and_then(|id| kernel.agents.grant(id))
        .map_or(1, |grant| kernel.llm.weight_of(grant.name));
    Ok(Asker {
        id: agent.unwrap_or(flow),
        weight,
        budgets: actor.budgets().to_vec(),
    })
}

/// A refusal with THINK's reply fields: empty content, no tokens.
pub fn refusal(err: ErrorReply) -> Vec<u8> {
    to_json(&ThinkReply {
        success: false,
        content: String::new(),
        tokens: 0,
        error: Some(err.error),
        code: Some(err.code),
        usage: None,
        model: None,
        queue_ms: None,
        latency_ms: None,
    })
}
