//! Trace export settings: the `[tracing]` table of the config file.

use serde::Deserialize;

use super::common::ConfigError;

/// Where and how the kernel's spans are exported.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// An OTLP/HTTP collector (`http://host:4318`); spans go to its
    /// `/v1/traces`. None by default: nothing is recorded.
    pub otlp_endpoint: Option<String>,
    /// Record prompts and outputs in spans (off: never).
    pub record_content: bool,
    /// Finished spans that may wait for the exporter; past it they are
    /// dropped and counted (`agentos_trace_spans_total{outcome="dropped"}`).
    pub queue: usize,
    /// The `service.name` the spans are sent under.
    pub service_name: String,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            record_content: false,
            queue: 4096,
            service_name: "agentosd".into(),
        }
    }
}

impl TracingConfig {
    /// Checks the endpoint's form and the queue's size.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if let Some(endpoint) = &self.otlp_endpoint {
            let ok = (endpoint.starts_with("http://") || endpoint.starts_with("https://"))
                && !endpoint.contains(char::is_whitespace);
            if !ok {
                return invalid(
                    "tracing.otlp_endpoint",
                    format!("{endpoint:?}: give the collector's http:// or https:// address"),
                );
            }
        }
        if !(16..=1_000_000).contains(&self.queue) {
            return invalid("tracing.queue", "must be between 16 and 1000000".into());
        }
        if self.service_name.is_empty() {
            return invalid("tracing.service_name", "may not be empty".into());
        }
        Ok(())
    }
}
