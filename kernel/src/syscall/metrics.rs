//! METRICS (0x18): the kernel's metrics as `[metrics] listen` serves them,
//! from the latest snapshot. Operators only: the figures are the whole
//! kernel's, not one agent's.

use agentos_proto::payload::{MetricsReply, MetricsRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::{Actor, Kernel};

/// Rendered on a worker: the text of a kernel with many agents is
/// hundreds of kilobytes.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let allowed = MetricsRequest::parse(request.payload).and_then(|_| {
        if matches!(actor(kernel, request)?, Actor::Operator { .. }) {
            Ok(())
        } else {
            Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "METRICS is for operators: the figures are the whole kernel's",
            ))
        }
    });
    if let Err(refusal) = allowed {
        return Outcome::Reply(Answer::from(refusal));
    }
    let published = kernel.metrics.published.clone();
    Outcome::Deferred(Box::new(move || {
        Answer::json(&MetricsReply {
            success: true,
            format: "prometheus".into(),
            text: published.render(),
        })
        .into_json()
    }))
}
