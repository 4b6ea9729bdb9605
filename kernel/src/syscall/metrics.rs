//! METRICS (0x18): the kernel's metrics as `[metrics] listen` serves them,
//! from the latest snapshot. Operators only: the figures are the whole
//! kernel's, not one agent's.

use agentos_proto::payload::{MetricsReply, MetricsRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::{Actor, Kernel};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let answer = MetricsRequest::parse(request.payload).and_then(|_| {
        if !matches!(actor(kernel, request)?, Actor::Operator { .. }) {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "METRICS is for operators: the figures are the whole kernel's",
            ));
        }
        Ok(Answer::json(&MetricsReply {
            success: true,
            format: "prometheus".into(),
            text: kernel.metrics_text(),
        }))
    });
    Outcome::Reply(answer.unwrap_or_else(Answer::from))
}
