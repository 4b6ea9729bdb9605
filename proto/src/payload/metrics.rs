//! METRICS (0x18): the kernel's metrics in the Prometheus text format, as
//! `[metrics] listen` serves them (for `agentos metrics`, without a
//! listener). Operators only.

use serde::{Deserialize, Serialize};

use super::parse::parse_empty_or_object;
use crate::error::ErrorReply;

/// A METRICS request: empty, or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MetricsRequest {}

impl MetricsRequest {
    /// Parses a METRICS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("METRICS", payload)
    }
}

/// METRICS' reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MetricsReply {
    pub success: bool,
    /// `prometheus`: the text format 0.0.4.
    pub format: String,
    /// The metrics, as `GET /metrics` gives them.
    pub text: String,
}
