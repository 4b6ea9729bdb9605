//! SIGHUP for THINK: a new provider, model, rate limits or caps take over
//! from the next request on. Queued THINKs, the use figures and the token
//! budgets stay; calls already at the old provider finish there.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::llm::LlmConfig;

/// The kernel's own limits on THINK, which a reload takes up without
/// touching the provider: besides these, the rates and the queue's size.
#[derive(Debug)]
pub struct Limits {
    /// Tokens of context a request may use, when known.
    pub context_tokens: Option<u32>,
    /// How long a THINK may wait for its answer.
    pub timeout: Duration,
    /// `max_tokens` for a request that names none.
    pub default_max_tokens: u32,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_limit: u32,
    /// Fair-queueing weights by agent name.
    pub weights: BTreeMap<String, u32>,
}

impl Limits {
    /// The limits `config` sets.
    pub fn of(config: &LlmConfig) -> Limits {
        Limits {
            context_tokens: config.context_tokens(),
            timeout: Duration::from_millis(config.timeout_ms),
            default_max_tokens: config.default_max_tokens,
            max_tokens_limit: config.max_tokens_limit,
            weights: config.weights.clone(),
        }
    }
}

/// Whether `old` and `new` differ only in the kernel's own limits, not in
/// what it connects to or how (provider, URL, model, key, concurrency,
/// retries, the local server).
pub fn same_provider(old: &LlmConfig, new: &LlmConfig) -> bool {
    let connection = |c: &LlmConfig| LlmConfig {
        rpm: 0,
        tpm: 0,
        max_queued: 0,
        timeout_ms: 0,
        default_max_tokens: 0,
        max_tokens_limit: 0,
        weights: Default::default(),
        context_tokens: None,
        quota: Default::default(),
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
