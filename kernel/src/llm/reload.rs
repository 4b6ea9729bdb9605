//! SIGHUP for THINK: a new provider, model, rate limits or caps take over
//! from the next request on. Queued THINKs, the use figures and the token
//! budgets stay; calls already at the old provider finish there.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;

use super::admission::Admission;
use super::connection::Connection;
use super::Llm;
use crate::config::llm::LlmConfig;
use crate::sandbox::confine::Confinement;

impl Llm {
    /// Takes up `config` in place of `old` (see the module doc). When only
    /// the kernel's own limits changed, the provider stays connected (and a
    /// loaded local model stays loaded).
    pub fn reconfigure(
        &mut self,
        old: &LlmConfig,
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) {
        if same_provider(old, config) {
            log::info!(
                "THINK: new limits; provider {} and model {} unchanged",
                self.kind,
                self.model
            );
            self.take_limits(old, config);
            return;
        }
        let fresh = Connection::open(config, waker, log_dir, confinement);
        match self.callers.take() {
            Some(mut callers) => {
                // Its threads end once their current calls have; their
                // answers still arrive (see `poll`).
                callers.stop();
                self.retiring
                    .push((self.provider_generation, callers, self.local.take()));
            }
            None => {
                if let Some(local) = self.local.take() {
                    local.stop();
                }
            }
        }
        self.provider_generation += 1;
        self.kind = fresh.kind;
        self.model = fresh.model;
        self.counts.configured(&self.model);
        self.unavailable = fresh.unavailable;
        self.local = fresh.local;
        self.callers = fresh.callers;
        self.unreachable = None;
        // Calls still at the old provider count against the new
        // concurrency and per-caller cap alike: a smaller one sends
        // nothing more until they are under it.
        self.set_concurrency(config.concurrency);
        self.take_limits(old, config);
        self.retire_finished();
    }

    /// The kernel-side limits of `config`: rates (counted afresh only when
    /// they changed, so a reload is no way around them), queue, time,
    /// tokens, weights.
    fn take_limits(&mut self, old: &LlmConfig, config: &LlmConfig) {
        self.context_tokens = config.context_tokens();
        if (old.rpm, old.tpm) != (config.rpm, config.tpm) {
            self.admission = Admission::new(config.rpm, config.tpm, Instant::now());
        }
        self.timeout = Duration::from_millis(config.timeout_ms);
        self.default_max_tokens = config.default_max_tokens;
        self.max_tokens_limit = config.max_tokens_limit;
        self.weights = config.weights.clone();
        self.scheduler.set_capacity(config.max_queued);
    }

    /// Lets go of each replaced provider whose calls have all finished:
    /// its threads, and its local model server, stopped.
    pub(super) fn retire_finished(&mut self) {
        let in_flight = &self.in_flight;
        self.retiring.retain(|(generation, _, local)| {
            let busy = in_flight
                .values()
                .any(|call| call.generation == *generation);
            if !busy {
                if let Some(local) = local {
                    local.stop();
                }
            }
            busy
        });
    }
}

/// Whether `old` and `new` differ only in the kernel's own limits, not in
/// what it connects to or how (provider, URL, model, key, concurrency,
/// retries, the local server).
fn same_provider(old: &LlmConfig, new: &LlmConfig) -> bool {
    let connection = |c: &LlmConfig| LlmConfig {
        rpm: 0,
        tpm: 0,
        max_queued: 0,
        timeout_ms: 0,
        default_max_tokens: 0,
        max_tokens_limit: 0,
        weights: Default::default(),
        context_tokens: None,
        ..c.clone()
    };
    connection(old) == connection(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_alone_keep_the_provider() {
        let old = LlmConfig::default();
        let limits = LlmConfig {
            rpm: 60,
            tpm: 1000,
            max_queued: 3,
            weights: [("a".to_owned(), 2)].into(),
            ..old.clone()
        };
        assert!(same_provider(&old, &limits));
        let model = LlmConfig {
            model: Some("other".into()),
            ..old.clone()
        };
        assert!(!same_provider(&old, &model));
        let wider = LlmConfig {
            concurrency: old.concurrency + 1,
            ..old.clone()
        };
        assert!(!same_provider(&old, &wider));
    }
}
