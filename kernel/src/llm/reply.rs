//! THINK's replies: an answer with its usage and timings, or a failure in
//! the same shape.

use std::time::Duration;

use agentos_proto::payload::{ThinkReply, Usage};

use super::provider::{Completion, Failure};

/// The reply to an answered THINK (the model the provider names, else the
/// one asked for).
pub fn answered(
    completion: Completion,
    asked: &str,
    queue: Duration,
    latency: Duration,
) -> ThinkReply {
    let Completion {
        content,
        usage,
        model,
        ..
    } = completion;
    ThinkReply {
        success: true,
        content,
        tokens: usage.total_tokens,
        error: None,
        code: None,
        usage: Some(usage),
        model: Some(if model.is_empty() {
            asked.to_owned()
        } else {
            model
        }),
        queue_ms: Some(queue.as_millis() as u64),
        latency_ms: Some(latency.as_millis() as u64),
    }
}

/// The reply to a THINK that failed.
pub fn failed(failure: &Failure, model: &str, queue: Duration, latency: Duration) -> ThinkReply {
    ThinkReply {
        success: false,
        content: String::new(),
        tokens: 0,
        error: Some(failure.message.clone()),
        code: Some(failure.code),
        usage: Some(Usage::default()),
        model: Some(model.to_owned()),
        queue_ms: Some(queue.as_millis() as u64),
        latency_ms: Some(latency.as_millis() as u64),
    }
}
