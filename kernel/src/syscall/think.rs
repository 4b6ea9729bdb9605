//! THINK (0x01): a prompt for the shared LLM. The request is queued and
//! answered when the provider has; refusals (a malformed request, a spent
//! quota, a full queue) are answered at once, in THINK's reply shape.

use agentos_proto::payload::{ThinkReply, ThinkRequest};
use agentos_proto::ErrorReply;

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::Kernel;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let queued = ThinkRequest::parse(request.payload).and_then(|think| {
        let asker = kernel.asker(&actor(kernel, request)?, request.caller.identity.id())?;
        kernel
            .llm
            .think(&asker, request.reply_to, think, &mut kernel.outbox.replies)
    });
    match queued {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(refusal(err)),
    }
}

/// A refusal with THINK's reply fields: empty content, no tokens.
fn refusal(err: ErrorReply) -> Answer {
    ThinkReply {
        success: false,
        content: String::new(),
        tokens: 0,
        error: Some(err.error),
        code: Some(err.code),
        usage: None,
        model: None,
        queue_ms: None,
        latency_ms: None,
    }
    .into()
}
