//! SIGHUP for THINK: a new provider, model, rate limits or caps take over
//! from the next request on. Queued THINKs, the use figures and the token
//! budgets stay; calls already at the old provider finish there.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;

use super::admission::Admission;
use super::Llm;
use crate::config::llm::LlmConfig;
use crate::sandbox::confine::Confinement;

impl Llm {
    /// Takes up `config` (see the module doc).
    pub fn reconfigure(
        &mut self,
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) {
        let fresh = Llm::new(config, waker, log_dir, confinement);
        if let Some(mut callers) = self.callers.take() {
            // Its threads end once their current calls have; their answers
            // still arrive (see `poll`).
            callers.stop();
            self.retiring.push(callers);
        }
        if let Some(local) = self.local.take() {
            self.retiring_local.push(local);
        }
        self.kind = fresh.kind;
        self.model = fresh.model;
        self.unavailable = fresh.unavailable;
        self.local = fresh.local;
        self.callers = fresh.callers;
        self.admission = Admission::new(config.rpm, config.tpm, Instant::now());
        self.concurrency = config.concurrency;
        self.timeout = Duration::from_millis(config.timeout_ms);
        self.default_max_tokens = config.default_max_tokens;
        self.max_tokens_limit = config.max_tokens_limit;
        self.weights = config.weights.clone();
        self.scheduler.set_capacity(config.max_queued);
        self.retire_when_idle();
    }

    /// Lets go of the old provider's threads and stops the old local model
    /// once no call is under way.
    pub(super) fn retire_when_idle(&mut self) {
        if !self.in_flight.is_empty() {
            return;
        }
        self.retiring.clear();
        for local in self.retiring_local.drain(..) {
            local.stop();
        }
    }
}
