//! Seeing inside the kernel: Prometheus metrics and OpenTelemetry traces
//! (docs/observability.md). A leaf module: every subsystem may record into
//! it, and it imports none of them.

pub mod exporter;
pub mod host;
pub mod listener;
pub mod metrics;
pub mod otlp;
pub mod tracer;

/// The W3C trace context requests carry: parsed in `proto`, where the
/// CLI reads it too (an MCP client's `_meta.traceparent`).
pub use agentos_proto::TraceContext;
