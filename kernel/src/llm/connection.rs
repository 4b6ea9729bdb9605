//! The connection THINK uses: the configured provider, reached over HTTP
//! by a pool of call threads, or the local model server the kernel starts;
//! the providers a reload replaced, while their last calls finish; and
//! whether the provider in place can be reached and is answering.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::{ErrorCode, ErrorReply};
use mio::Waker;

use super::call::{CallDone, CallJob, CallTarget, Callers, Fixed, RetryBudget};
use super::health::Health;
use super::local::{self, LocalServer, LocalSetup};
use super::provider::anthropic::Anthropic;
use super::provider::gemini::Gemini;
use super::provider::openai::OpenAi;
use super::provider::{self, Provider};
use crate::clock::rfc3339;
use crate::config::llm::{LlmConfig, ProviderKind};
use crate::sandbox::confine::Confinement;
use crate::sandbox::lookup::interpreter_binds;

/// What THINK talks to: the configured provider, its local model server
/// if it has one, and the threads that call it — or why there are none —
/// with the providers it replaced that still have calls out.
#[derive(Debug)]
pub struct Connection {
    kind: ProviderKind,
    model: String,
    /// Why THINK cannot work on this host, if it cannot.
    unavailable: Option<String>,
    local: Option<Arc<LocalServer>>,
    callers: Option<Callers>,
    /// Counts the providers reloads put in place; calls carry the one they
    /// went to.
    generation: u64,
    /// Providers a reload replaced, while their calls finish.
    retiring: Vec<Retiring>,
    /// Since when the provider in place could not be connected to, and the
    /// last such error; cleared by the next answered call.
    unreachable: Option<(SystemTime, String)>,
    /// Whether the provider in place is answering.
    health: Health,
}

/// A provider a reload replaced: its call threads, stopped but finishing
/// their calls, and a local model server to stop once they have.
#[derive(Debug)]
struct Retiring {
    generation: u64,
    callers: Callers,
    local: Option<Arc<LocalServer>>,
}

/// The provider in place, as a new connection finds it.
struct Opened {
    kind: ProviderKind,
    model: String,
    unavailable: Option<String>,
    local: Option<Arc<LocalServer>>,
    callers: Option<Callers>,
    health: Health,
}

impl Connection {
    /// Connects as `config` says (see `Llm::new`).
    pub fn open(
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) -> Connection {
        let opened = connect(config, waker, log_dir, confinement);
        Connection {
            kind: opened.kind,
            model: opened.model,
            unavailable: opened.unavailable,
            local: opened.local,
            callers: opened.callers,
            generation: 0,
            retiring: Vec::new(),
            unreachable: None,
            health: opened.health,
        }
    }

    /// Puts the provider `config` names in place of this one, a new
    /// generation. The old one's threads end once their current calls
    /// have; their answers still arrive (see [`Connection::finished`]).
    pub fn reconnect(
        &mut self,
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) {
        let fresh = connect(config, waker, log_dir, confinement);
        match self.callers.take() {
            Some(mut callers) => {
                callers.stop();
                self.retiring.push(Retiring {
                    generation: self.generation,
                    callers,
                    local: self.local.take(),
                });
            }
            None => {
                if let Some(local) = self.local.take() {
                    local.stop();
                }
            }
        }
        self.generation += 1;
        self.kind = fresh.kind;
        self.model = fresh.model;
        self.unavailable = fresh.unavailable;
        self.local = fresh.local;
        self.callers = fresh.callers;
        self.unreachable = None;
        self.health = fresh.health;
    }

    /// The provider's kind.
    pub fn kind(&self) -> ProviderKind {
        self.kind
    }

    /// The model a request that names none goes to.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Why THINK cannot work on this host, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// The local model server in place, if the provider is the local one
    /// and it was started.
    pub fn local(&self) -> Option<&LocalServer> {
        self.local.as_deref()
    }

    /// Since when the provider in place could not be connected to, and
    /// the last such error.
    pub fn unreachable(&self) -> Option<&(SystemTime, String)> {
        self.unreachable.as_ref()
    }

    /// Since when the provider in place has taken connections without
    /// answering, and what was said of it.
    pub fn not_answering(&self) -> Option<&(SystemTime, String)> {
        self.health.not_answering()
    }

    /// A call went out to the provider in place: its health is watched.
    pub fn call_sent(&mut self, now: Instant) {
        self.health.call_sent(now);
    }

    /// Time until the health watch's next look.
    pub fn next_look(&self, now: Instant) -> Option<Duration> {
        self.health.next_deadline(now)
    }

    /// The health watch's look, when one is due (see [`Health::look`]);
    /// `calls_out`: calls of the provider in place are unanswered.
    pub fn look(&mut self, now: Instant, calls_out: bool) {
        let oldest = self
            .callers
            .as_ref()
            .and_then(|callers| callers.unanswered().oldest());
        self.health.look(now, oldest, calls_out);
    }

    /// What the probes heard: what to say of the provider if it was found
    /// not answering (see [`Health::heard`]).
    pub fn heard(&mut self, now: Instant, calls_out: bool) -> Option<String> {
        self.health.heard(now, calls_out)
    }

    /// Gives up on the calls at the provider in place (it is not
    /// answering them) and starts fresh call threads for the next ones.
    pub fn abandon_calls(&mut self) {
        if let Some(callers) = &mut self.callers {
            if let Err(err) = callers.replace_threads() {
                log::error!("THINK: cannot start fresh LLM call threads: {err}");
                self.callers = None;
                self.unavailable = Some(format!("cannot start LLM call threads: {err}"));
            }
        }
    }

    /// The generation of the provider in place.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether there are call threads to send to.
    pub fn is_connected(&self) -> bool {
        self.callers.is_some()
    }

    /// Sends `job` to the provider in place; gives it back if its threads
    /// are gone.
    pub fn send(&self, job: CallJob) -> Result<(), Box<CallJob>> {
        match &self.callers {
            Some(callers) => callers.send(job),
            None => Err(Box::new(job)),
        }
    }

    /// The calls that have finished, at the provider in place and at
    /// those being retired.
    pub fn finished(&self) -> Vec<CallDone> {
        self.callers
            .iter()
            .chain(self.retiring.iter().map(|retiring| &retiring.callers))
            .flat_map(Callers::finished)
            .collect()
    }

    /// Whether a replaced provider still has calls out.
    pub fn is_retiring(&self) -> bool {
        !self.retiring.is_empty()
    }

    /// Lets go of each replaced provider with no call of its generation
    /// `busy`: its threads, and its local model server, stopped.
    pub fn retire_finished(&mut self, busy: impl Fn(u64) -> bool) {
        self.retiring.retain(|retiring| {
            let busy = busy(retiring.generation);
            if !busy {
                if let Some(local) = &retiring.local {
                    local.stop();
                }
            }
            busy
        });
    }

    /// Keeps HELLO's word on whether the provider can be reached, from a
    /// call `done` that went to the provider of `generation`: only the one
    /// in place counts. A call that could not connect marks it unreachable
    /// (from the first such call on), an answered call reachable again.
    pub fn note_reachability(&mut self, done: &CallDone, generation: u64) {
        if generation != self.generation {
            return;
        }
        match &done.result {
            Ok(_) => {
                if let Some((since, _)) = self.unreachable.take() {
                    log::info!(
                        "THINK: the provider answers again (unreachable since {})",
                        rfc3339(since)
                    );
                }
            }
            Err(failure) if done.unreachable => {
                let since = self
                    .unreachable
                    .as_ref()
                    .map_or_else(SystemTime::now, |(since, _)| *since);
                if self.unreachable.is_none() {
                    log::warn!("THINK: the provider is unreachable: {}", failure.message);
                }
                self.unreachable = Some((since, failure.message.clone()));
            }
            Err(_) => {}
        }
    }

    /// Refuses a model the kernel's own local model server does not serve:
    /// it would answer with its one model whatever the name, and the
    /// caller would take the answer for another model's. A remote provider
    /// judges the names itself (an unknown one is its 404).
    pub fn check_served(&self, asked: &str) -> Result<(), ErrorReply> {
        if self.kind != ProviderKind::Local || asked.eq_ignore_ascii_case(&self.model) {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorCode::BadRequest,
            format!(
                "THINK field `model`: the local provider serves only {} (asked for {:?}); \
                 leave `model` out, or configure a provider that serves it \
                 (AGENTOS_LLM_PROVIDER, llm.provider)",
                self.model,
                provider::shorten(asked, 100)
            ),
        ))
    }

    /// Stops the call threads and every local model server.
    pub fn shutdown(&mut self) {
        if let Some(callers) = &mut self.callers {
            callers.stop();
        }
        let retiring = self
            .retiring
            .iter()
            .filter_map(|retiring| retiring.local.as_ref());
        for local in self.local.iter().chain(retiring) {
            local.stop();
        }
    }
}

/// Connects as `config` says: the provider's threads started, or its
/// local model server too, or why THINK is unavailable.
fn connect(
    config: &LlmConfig,
    waker: Arc<Waker>,
    log_dir: &Path,
    confinement: Option<Confinement>,
) -> Opened {
    let kind = config.kind();
    let model = config.model();
    let mut connection = Opened {
        kind,
        model: model.clone(),
        unavailable: None,
        local: None,
        callers: None,
        health: Health::unwatched(),
    };
    let endpoint: Arc<dyn CallTarget> = match kind {
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
                    connection.unavailable = Some(format!("cannot start the local model: {err}"));
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
    connection.health = Health::watching(
        endpoint.clone(),
        Duration::from_millis(config.probe_timeout_ms),
        waker.clone(),
    );
    match Callers::start(config.concurrency, endpoint, budget, waker) {
        Ok(callers) => connection.callers = Some(callers),
        Err(err) => connection.unavailable = Some(format!("cannot start LLM call threads: {err}")),
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
