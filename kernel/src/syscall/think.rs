//! THINK (0x01): a prompt for the shared LLM. The request is queued and
//! answered when the provider has; refusals (a malformed request, a spent
//! quota, a full queue) are answered at once, in THINK's reply shape.

use agentos_proto::payload::{to_json, ThinkReply, ThinkRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::{agent_grant, Kernel, Outcome, Request};
use crate::identity::Identity;
use crate::llm::Asker;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let queued = ThinkRequest::parse(request.payload).and_then(|think| {
        let asker = asker(kernel, request.caller.identity)?;
        kernel
            .llm
            .think(&asker, request.reply_to, think, &mut kernel.outbox.replies)
    });
    match queued {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// Who is asking: an agent's weight and quota come from its name and its
/// SPAWN permissions; operators have neither limit.
pub fn asker(kernel: &Kernel, identity: Identity) -> Result<Asker, ErrorReply> {
    let Some(grant) = agent_grant(kernel, identity)? else {
        return Ok(Asker {
            id: identity.id(),
            weight: 1,
            budgets: Vec::new(),
        });
    };
    if !grant.permissions.think {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "agent {} may not THINK (its permissions.think is false)",
                grant.name
            ),
        ));
    }
    Ok(Asker {
        id: identity.id(),
        weight: kernel.llm.weight_of(grant.name),
        budgets: grant.budgets.to_vec(),
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
