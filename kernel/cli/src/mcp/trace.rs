//! The caller's trace: a `tools/call` whose `params._meta` carries a W3C
//! `traceparent` (MCP reserves the key for trace context, as do
//! OpenTelemetry's MCP conventions) has the kernel's spans for the call
//! join that trace, through the kernel request's `trace` field (a THINK,
//! an EXEC `run`, a TOOL `call` or a TASK `dispatch`).
//!
//! Only a value a receiver may use is passed on, as it came: anything
//! else is dropped here, and the kernel starts a trace of its own, as it
//! would for a malformed `trace` — a bad header never fails a call.
//! `tracestate` is not passed on: kernel requests carry no field for it.

use agentos_proto::TraceContext;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// The `traceparent` of one tool call, if it carried a valid one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallerTrace(Option<String>);

impl CallerTrace {
    /// The trace the call's request names in `_meta.traceparent`.
    pub fn of(context: &RequestContext<RoleServer>) -> CallerTrace {
        CallerTrace::from_traceparent(context.meta.get_traceparent())
    }

    fn from_traceparent(value: Option<&str>) -> CallerTrace {
        CallerTrace(
            value
                .filter(|value| TraceContext::parse(value).is_some())
                .map(str::to_owned),
        )
    }

    /// The request's `trace`: the caller's traceparent, if it gave one.
    pub fn traceparent(&self) -> Option<String> {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_reaches_the_request_as_it_came() {
        let trace = CallerTrace::from_traceparent(Some(TRACEPARENT));
        assert_eq!(trace.traceparent().as_deref(), Some(TRACEPARENT));
    }

    #[test]
    fn a_malformed_or_missing_traceparent_leaves_the_request_alone() {
        for value in [
            None,
            Some(""),
            Some("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Some("not a traceparent"),
        ] {
            let trace = CallerTrace::from_traceparent(value);
            assert_eq!(trace.traceparent(), None, "{value:?}");
        }
    }
}
