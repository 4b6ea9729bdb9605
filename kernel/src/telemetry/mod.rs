//! Seeing inside the kernel: Prometheus metrics and OpenTelemetry traces
//! (docs/observability.md). A leaf module: every subsystem may record into
//! it, and it imports none of them.

pub mod exporter;
pub mod listener;
pub mod metrics;
pub mod otlp;
pub mod trace_context;
pub mod tracer;

pub use trace_context::TraceContext;
