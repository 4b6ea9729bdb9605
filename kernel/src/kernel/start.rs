//! What starting the kernel takes beside its subsystems, and why it can
//! fail.

use std::io;

use crate::agents::BadBootEntry;
use crate::config::metrics::MetricsConfig;
use crate::config::tracing::TracingConfig;
use crate::config::Config;
use crate::http_call::Upstream;
use crate::tasks::store::StoreError;
use crate::telemetry::exporter::Exporter;
use crate::telemetry::listener::{self, Listen};
use crate::telemetry::metrics::Published;
use crate::telemetry::tracer::Tracer;

/// The tracer `[tracing]` asks for: its exporter's thread started, or
/// none.
pub fn tracer(tracing: &TracingConfig) -> io::Result<Tracer> {
    Ok(match &tracing.otlp_endpoint {
        Some(endpoint) => Tracer::new(
            Exporter::start(endpoint, &tracing.service_name, tracing.queue)?,
            tracing.record_content,
        ),
        None => Tracer::default(),
    })
}

/// Serves what is `published` on `[metrics] listen`, if it is set, from
/// a thread of its own.
pub fn serve_metrics(config: &MetricsConfig, published: &Published) -> io::Result<()> {
    let Some(listen) = &config.listen else {
        return Ok(());
    };
    let listen = Listen::parse(listen);
    listener::serve(&listen, published.clone())
        .map_err(|err| io::Error::new(err.kind(), format!("[metrics] listen {listen:?}: {err}")))
}

/// Why the kernel could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A `[[agents.boot]]` entry is wrong.
    #[error(transparent)]
    BootAgent(#[from] BadBootEntry),
    /// The task store cannot be opened.
    #[error("the task store: {0}")]
    TaskStore(#[from] StoreError),
    /// The fleet refused this node.
    #[error("the fleet: {0}")]
    Fleet(#[from] crate::fleet::FleetError),
    /// A subsystem or the state directory cannot be set up.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What the kernel's HTTP requests for callers share: `[network]`'s names
/// and extra roots; a body as large as READ reads.
pub fn http_upstream(config: &Config) -> io::Result<Upstream> {
    let extra_roots = config
        .network
        .extra_roots_pem()
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err.to_string()))?;
    let max_body = config.exec.max_file_bytes.min(config.max_request_bytes);
    Ok(Upstream::new(
        config.network.resolved_names(),
        &extra_roots,
        max_body,
    ))
}
