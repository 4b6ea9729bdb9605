//! What THINK counts for the kernel's metrics: calls and tokens by model,
//! failures by kind, and how long calls waited and took.

use std::collections::BTreeMap;

use crate::telemetry::metrics::{Histogram, Snapshot, LATENCY_BUCKETS};

/// Distinct models counted apart; beyond, they are counted as `other`
/// (a model name comes from requests, so its cardinality is bounded here).
const MAX_MODELS: usize = 32;

/// One model's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ModelCounts {
    calls: u64,
    input_tokens: u64,
    output_tokens: u64,
}

/// THINK's counters, kept on the reactor.
#[derive(Clone, Debug)]
pub struct ThinkCounts {
    by_model: BTreeMap<String, ModelCounts>,
    failures: BTreeMap<&'static str, u64>,
    refusals: BTreeMap<&'static str, u64>,
    rate_limit_waits: BTreeMap<&'static str, u64>,
    queue_wait: Histogram,
    latency: Histogram,
}

impl Default for ThinkCounts {
    fn default() -> Self {
        ThinkCounts {
            by_model: BTreeMap::new(),
            failures: BTreeMap::new(),
            refusals: BTreeMap::new(),
            rate_limit_waits: BTreeMap::new(),
            queue_wait: Histogram::new(&LATENCY_BUCKETS),
            latency: Histogram::new(&LATENCY_BUCKETS),
        }
    }
}

impl ThinkCounts {
    /// A call answered by `model` with these tokens.
    pub fn answered(&mut self, model: &str, input_tokens: u64, output_tokens: u64) {
        let key = if self.by_model.contains_key(model) || self.by_model.len() < MAX_MODELS {
            model
        } else {
            "other"
        };
        let counts = self.by_model.entry(key.to_owned()).or_default();
        counts.calls += 1;
        counts.input_tokens += input_tokens;
        counts.output_tokens += output_tokens;
    }

    /// A call that failed, by its error code's word.
    pub fn failed(&mut self, kind: &'static str) {
        *self.failures.entry(kind).or_default() += 1;
    }

    /// A THINK answered with an error before the provider saw it: refused
    /// at once, or expired in the queue (`timeout`).
    pub fn refused(&mut self, code: &'static str) {
        *self.refusals.entry(code).or_default() += 1;
    }

    /// `waits` times a call was held back by a rate limit: the kernel's
    /// own (`[llm] rpm`/`tpm`) or the provider's HTTP 429.
    pub fn rate_limit_wait(&mut self, limit: &'static str, waits: u32) {
        if waits > 0 {
            *self.rate_limit_waits.entry(limit).or_default() += u64::from(waits);
        }
    }

    /// A call that waited `queue` seconds in the fair queue and took
    /// `latency` at the provider.
    pub fn timed(&mut self, queue: f64, latency: f64) {
        self.queue_wait.observe(queue);
        self.latency.observe(latency);
    }

    /// Adds THINK's series, for `provider`, to `snapshot`.
    pub fn add_to(&self, provider: &str, snapshot: &mut Snapshot) {
        for (model, counts) in &self.by_model {
            let labels = [("provider", provider), ("model", model.as_str())];
            snapshot.counter(
                "agentos_think_calls",
                "THINK calls answered, by provider and model.",
                &labels,
                counts.calls,
            );
            for (direction, tokens) in [
                ("input", counts.input_tokens),
                ("output", counts.output_tokens),
            ] {
                snapshot.counter(
                    "agentos_think_tokens",
                    "Tokens of answered THINK calls, by provider, model and direction.",
                    &[
                        ("provider", provider),
                        ("model", model.as_str()),
                        ("direction", direction),
                    ],
                    tokens,
                );
            }
        }
        for (kind, count) in &self.failures {
            snapshot.counter(
                "agentos_think_failures",
                "THINK calls that failed, by error code.",
                &[("provider", provider), ("code", kind)],
                *count,
            );
        }
        for (code, count) in &self.refusals {
            snapshot.counter(
                "agentos_think_refused",
                "THINK requests answered with an error before the provider saw them: refused \
                 at once or expired in the queue (timeout), by error code.",
                &[("provider", provider), ("code", code)],
                *count,
            );
        }
        for (limit, count) in &self.rate_limit_waits {
            snapshot.counter(
                "agentos_think_rate_limit_waits",
                "Times THINK calls were held back by a rate limit: the kernel's own or the \
                 provider's (HTTP 429, then retried).",
                &[("provider", provider), ("limit", limit)],
                *count,
            );
        }
        snapshot.seconds(
            "agentos_think_queue_wait",
            "Time THINK calls waited in the fair queue.",
            &[("provider", provider)],
            &self.queue_wait,
        );
        snapshot.seconds(
            "agentos_think_latency",
            "Time THINK calls took at the provider, retries included.",
            &[("provider", provider)],
            &self.latency,
        );
    }
}
