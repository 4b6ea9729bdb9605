//! What THINK counts for the kernel's metrics: calls and tokens by model,
//! failures by kind, and how long calls waited and took.
//!
//! A model is a label only if the configuration named it: a request may
//! name any model, and servers that answer to any name (local ones do)
//! would otherwise let an agent write what it likes into every scrape.

use std::collections::{BTreeMap, BTreeSet};

use crate::telemetry::metrics::{Histogram, Snapshot, LATENCY_BUCKETS};

/// The label of calls to a model no configuration named.
pub const OTHER_MODEL: &str = "other";

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
    /// The models configured since the kernel started (one per reload
    /// that changed it, at most): the only model labels.
    configured: BTreeSet<String>,
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
            configured: BTreeSet::new(),
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
    /// `model` is configured: calls to it are counted under its name.
    pub fn configured(&mut self, model: &str) {
        self.configured.insert(model.to_owned());
    }

    /// A call answered by `model` with these tokens: under its name if it
    /// was configured, else as [`OTHER_MODEL`].
    pub fn answered(&mut self, model: &str, input_tokens: u64, output_tokens: u64) {
        let label = if self.configured.contains(model) {
            model
        } else {
            OTHER_MODEL
        };
        let counts = self.by_model.entry(label.to_owned()).or_default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Published;

    fn rendered(counts: &ThinkCounts) -> String {
        let mut snapshot = Snapshot::default();
        counts.add_to("openai", &mut snapshot);
        let published = Published::default();
        published.publish(snapshot);
        published.render()
    }

    #[test]
    fn a_model_no_configuration_named_is_counted_as_other() {
        let mut counts = ThinkCounts::default();
        counts.configured("gpt-4o-mini");
        counts.answered("gpt-4o-mini", 10, 5);
        let asked = format!("{}\nagentos_forged_total 1", "x".repeat(5000));
        counts.answered(&asked, 1, 1);
        counts.answered("gpt-4o", 1, 1);
        let text = rendered(&counts);
        assert!(
            text.lines()
                .any(|l| l
                    == "agentos_think_calls_total{provider=\"openai\",model=\"gpt-4o-mini\"} 1"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l == "agentos_think_calls_total{provider=\"openai\",model=\"other\"} 2"),
            "{text}"
        );
        assert!(!text.contains("xxxx") && !text.contains("forged"), "{text}");
    }

    #[test]
    fn every_model_configured_since_the_start_keeps_its_label() {
        let mut counts = ThinkCounts::default();
        counts.configured("first");
        counts.configured("second");
        counts.answered("first", 1, 1);
        counts.answered("second", 1, 1);
        let text = rendered(&counts);
        for model in ["first", "second"] {
            let line =
                format!("agentos_think_calls_total{{provider=\"openai\",model=\"{model}\"}} 1");
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }

    #[test]
    fn a_newline_quote_or_backslash_in_a_configured_model_is_escaped() {
        let mut counts = ThinkCounts::default();
        let model = "stub\nmodel \"q\" \\ end";
        counts.configured(model);
        counts.answered(model, 3, 4);
        let text = rendered(&counts);
        let line = "agentos_think_tokens_total{provider=\"openai\",\
                    model=\"stub\\nmodel \\\"q\\\" \\\\ end\",direction=\"input\"} 3";
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
        assert!(
            text.lines()
                .all(|l| l.is_empty() || l.starts_with('#') || l.starts_with("agentos_think_")),
            "a line outside a series: {text}"
        );
    }
}
