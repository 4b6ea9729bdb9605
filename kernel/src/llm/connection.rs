//! The connection THINK uses: the configured provider, reached over HTTP
//! by a pool of call threads, or the local model server the kernel starts.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;

use super::call::{Callers, Endpoint, Fixed, RetryBudget};
use super::local::{self, LocalServer, LocalSetup};
use super::provider::anthropic::Anthropic;
use super::provider::gemini::Gemini;
use super::provider::openai::OpenAi;
use super::provider::Provider;
use crate::config::llm::{LlmConfig, ProviderKind};
use crate::sandbox::confine::Confinement;
use crate::sandbox::lookup::interpreter_binds;

/// What THINK talks to: the configured provider, its local model server
/// if it has one, and the threads that call it — or why there are none.
pub(super) struct Connection {
    pub(super) kind: ProviderKind,
    pub(super) model: String,
    pub(super) unavailable: Option<String>,
    pub(super) local: Option<Arc<LocalServer>>,
    pub(super) callers: Option<Callers>,
}

impl Connection {
    /// Connects as `config` says (see [`Llm::new`]).
    pub(super) fn open(
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) -> Connection {
        let kind = config.kind();
        let model = config.model();
        let mut connection = Connection {
            kind,
            model: model.clone(),
            unavailable: None,
            local: None,
            callers: None,
        };
        let endpoint: Arc<dyn Endpoint> = match kind {
            ProviderKind::None => {
                connection.unavailable = Some(
                    "no LLM provider is configured (llm.provider = \"none\"); set \
                     AGENTOS_LLM_PROVIDER to local, openai, anthropic or gemini"
                        .to_owned(),
                );
                return connection;
            }
            ProviderKind::Local => {
                let local_model = local::models::LocalModel::of(config.local.model);
                let python = match local::find_python(config.local.python.as_deref(), local_model) {
                    Ok(python) => python,
                    Err(reason) => {
                        log::warn!("THINK unavailable: {reason}");
                        connection.unavailable = Some(reason.to_string());
                        return connection;
                    }
                };
                if confinement.is_none() {
                    log::warn!(
                        "the local model server runs unconfined, as the daemon's own user: \
                         this host gives the daemon no namespaces"
                    );
                }
                let setup = LocalSetup {
                    confinement: confinement.map(|c| (c, interpreter_binds(&python))),
                    python,
                    model,
                    local_model,
                    parallel: config.concurrency,
                    threads: config.local.threads,
                    context_tokens: config.local.context_tokens,
                    log: log_dir.join("llm-local.log"),
                };
                match LocalServer::start(setup) {
                    Ok(server) => {
                        let server = Arc::new(server);
                        connection.local = Some(server.clone());
                        server
                    }
                    Err(err) => {
                        connection.unavailable =
                            Some(format!("cannot start the local model: {err}"));
                        return connection;
                    }
                }
            }
            remote => Arc::new(Fixed(remote_provider(remote, config))),
        };
        let budget = RetryBudget {
            max_wait: Duration::from_millis(config.max_retry_ms),
            attempt_timeout: Duration::from_millis(config.attempt_timeout_ms),
        };
        match Callers::start(config.concurrency, endpoint, budget, waker) {
            Ok(callers) => connection.callers = Some(callers),
            Err(err) => {
                connection.unavailable = Some(format!("cannot start LLM call threads: {err}"))
            }
        }
        log::info!(
            "THINK: provider {kind}, model {}{}",
            connection.model,
            match &connection.unavailable {
                Some(reason) => format!(" — unavailable: {reason}"),
                None => String::new(),
            }
        );
        connection
    }
}

/// The provider for a remote kind.
fn remote_provider(kind: ProviderKind, config: &LlmConfig) -> Arc<dyn Provider> {
    let base_url = config.base_url();
    let key = config.api_key.clone();
    match kind {
        ProviderKind::Anthropic => Arc::new(Anthropic::new(&base_url, key)),
        ProviderKind::Gemini => Arc::new(Gemini::new(&base_url, key)),
        _ => Arc::new(OpenAi::new("openai", &base_url, key)),
    }
}
