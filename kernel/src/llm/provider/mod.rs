//! LLM providers: how one chat call is written for a provider's HTTP API
//! and how its answer is read. Pure functions over bytes — no sockets — so
//! every wire format is tested without a network; sending, retrying and
//! timing live in [`super::call`].
//!
//! One file per provider: [`openai`] (chat completions; also llama.cpp,
//! vLLM, Ollama, LiteLLM and the local model), [`anthropic`] (Messages) and
//! [`gemini`] (generateContent).

pub mod anthropic;
pub mod gemini;
pub mod openai;

pub use crate::config::llm::ApiKey;
use std::fmt;
use std::time::Duration;

use agentos_proto::payload::{ChatMessage, Usage};
use agentos_proto::ErrorCode;
use serde::de::DeserializeOwned;

/// One chat call, in the kernel's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Chat {
    /// The model to ask.
    pub model: String,
    /// A system instruction.
    pub system: Option<String>,
    /// The conversation, oldest first; never empty. `system` messages may
    /// appear in it too (providers without a system role fold them into
    /// the system instruction).
    pub messages: Vec<ChatMessage>,
    /// Upper bound on completion tokens.
    pub max_tokens: u32,
    /// Sampling temperature, when the caller chose one.
    pub temperature: Option<f64>,
    /// Text that ends the answer where it would appear, not included.
    pub stop: Vec<String>,
}

impl Chat {
    /// The system instruction and every `system` message, joined by blank
    /// lines, for providers that take one system text.
    pub fn system_text(&self) -> Option<String> {
        let parts: Vec<&str> = self
            .system
            .as_deref()
            .into_iter()
            .chain(
                self.messages
                    .iter()
                    .filter(|m| m.role == "system")
                    .map(|m| m.content.as_str()),
            )
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }
}

/// An HTTP request ready to send: always a POST of a JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpRequest {
    /// The full URL.
    pub url: String,
    /// Headers besides `content-type: application/json`, which is implied.
    pub headers: Vec<(&'static str, HeaderValue)>,
    /// The JSON body.
    pub body: Vec<u8>,
}

/// A header value; secret ones are hidden from `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderValue {
    /// An ordinary value.
    Plain(String),
    /// A value carrying a key.
    Secret(String),
}

impl HeaderValue {
    /// The value to send.
    pub fn as_str(&self) -> &str {
        match self {
            HeaderValue::Plain(v) | HeaderValue::Secret(v) => v,
        }
    }
}

impl fmt::Debug for HeaderValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderValue::Plain(v) => write!(f, "{v:?}"),
            HeaderValue::Secret(_) => f.write_str("<hidden>"),
        }
    }
}

/// The headers of a provider's reply, looked up case-insensitively.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyHeaders(pub Vec<(String, String)>);

impl ReplyHeaders {
    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What a provider answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The text of the answer.
    pub content: String,
    /// Tokens used, as the provider counted them.
    pub usage: Usage,
    /// The model that answered, as the provider names it.
    pub model: String,
    /// Why the model stopped, in the provider's words (`stop`, `length`,
    /// `end_turn`, `STOP`...), if it said.
    pub finish_reason: Option<String>,
}

/// Whether a failed call may be tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// No: the same request would fail the same way.
    Never,
    /// Yes, after the provider's hint if it gave one (else by backoff).
    After(Option<Duration>),
    /// No connection could be made: tried again once, soon, in case it was
    /// a blip — a provider that is down should be reported in seconds, not
    /// waited for like one that is busy.
    Reconnect,
}

/// A call that did not produce a completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// Whether to try again.
    pub retry: Retry,
    /// The code the THINK reply carries if this is the last word.
    pub code: ErrorCode,
    /// What went wrong, for the caller (never contains the key).
    pub message: String,
}

impl Failure {
    /// A failure that is not retried.
    pub fn fatal(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            retry: Retry::Never,
            code,
            message: message.into(),
        }
    }

    /// A provider that could not be reached (see [`Retry::Reconnect`]).
    pub fn unreachable(message: impl Into<String>) -> Failure {
        Failure {
            retry: Retry::Reconnect,
            code: ErrorCode::Unavailable,
            message: message.into(),
        }
    }

    /// A failure worth retrying.
    pub fn transient(
        code: ErrorCode,
        after: Option<Duration>,
        message: impl Into<String>,
    ) -> Failure {
        Failure {
            retry: Retry::After(after),
            code,
            message: message.into(),
        }
    }
}

/// A provider's wire format.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The provider's name as configured (`openai`, `anthropic`, `gemini`,
    /// `local`).
    fn name(&self) -> &'static str;

    /// The HTTP request for `chat`.
    fn request(&self, chat: &Chat) -> HttpRequest;

    /// A cheap URL whose answer, whatever its status, shows the provider
    /// is answering requests: its list of models, asked for without the
    /// key (a 401 is as good an answer as a list).
    fn probe_url(&self) -> String;

    /// Reads a successful (2xx) reply body.
    fn parse(&self, body: &[u8]) -> Result<Completion, Failure>;

    /// Reads a failed (non-2xx) reply: whether to retry, and what to say.
    fn failure(&self, status: u16, headers: &ReplyHeaders, body: &[u8]) -> Failure {
        classify(self.name(), status, headers, body)
    }
}

/// The common reading of an HTTP failure: 408, 409, 429 and 5xx (529 is
/// Anthropic's "overloaded") are worth
/// retrying (after `retry-after-ms` or `Retry-After` if given); auth
/// failures, bad requests and the rest are not.
pub fn classify(provider: &str, status: u16, headers: &ReplyHeaders, body: &[u8]) -> Failure {
    let detail = error_detail(body);
    let message = format!("{provider} answered HTTP {status}: {detail}");
    match status {
        408 | 409 | 429 | 500..=599 => {
            // A provider still rate-limiting after every retry: the
            // caller should come back later, as with a full queue.
            let code = if status == 429 {
                ErrorCode::Busy
            } else {
                ErrorCode::Unavailable
            };
            Failure::transient(code, retry_after(headers), message)
        }
        401 | 403 => Failure::fatal(
            ErrorCode::Unavailable,
            format!("{message} (check the kernel's API key for {provider})"),
        ),
        404 => Failure::fatal(
            ErrorCode::Unavailable,
            format!("{message} (check the model name and the base URL)"),
        ),
        400 | 413 | 422 => Failure::fatal(ErrorCode::BadRequest, message),
        _ => Failure::fatal(ErrorCode::Unavailable, message),
    }
}

/// The delay a provider asked for: `retry-after-ms` (milliseconds), else
/// `Retry-After` in seconds. (An HTTP-date `Retry-After` is ignored; the
/// backoff applies.)
pub fn retry_after(headers: &ReplyHeaders) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        return finite_delay(ms / 1000.0);
    }
    headers
        .get("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(finite_delay)
}

/// A delay in seconds, if it is a sane one (not negative, not NaN, under a
/// day).
pub fn finite_delay(seconds: f64) -> Option<Duration> {
    (seconds.is_finite() && (0.0..86_400.0).contains(&seconds))
        .then(|| Duration::from_secs_f64(seconds))
}

/// The most useful sentence of an error body: `error.message` (OpenAI,
/// Anthropic, Gemini all use it), else the body itself, shortened.
pub fn error_detail(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.pointer("/message"))
            .and_then(|m| m.as_str())
            .map(str::to_owned)
    });
    let text = message.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    shorten(&text, 300)
}

/// `text` cut to at most `max` characters, marked when cut.
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Reads a reply body as the JSON shape `T`: anything else (not JSON, a
/// truncated body, a field of the wrong type) is [`malformed`], so a
/// provider's surprise becomes a failed call rather than a panic.
pub fn read_json<T: DeserializeOwned>(provider: &str, body: &[u8]) -> Result<T, Failure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(malformed(provider, "an empty body"));
    }
    serde_json::from_slice(body).map_err(|e| malformed(provider, e))
}

/// A request body as JSON bytes. The providers' bodies are structs of
/// strings and numbers, which always serialise.
pub fn to_body<T: serde::Serialize>(body: &T) -> Vec<u8> {
    serde_json::to_vec(body).unwrap_or_default()
}

/// Token counts as a provider reported them; a missing total is the sum,
/// because the kernel charges budgets by the total.
pub fn usage(prompt: u64, completion: u64, total: Option<u64>) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: total.unwrap_or(prompt.saturating_add(completion)),
    }
}

/// A reply body that is not what the provider promised.
pub fn malformed(provider: &str, what: impl fmt::Display) -> Failure {
    Failure::fatal(
        ErrorCode::Unavailable,
        format!("{provider} sent a reply the kernel cannot read: {what}"),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A chat message, for the providers' tests.
    pub(crate) fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> ReplyHeaders {
        ReplyHeaders(
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn retry_after_prefers_milliseconds_and_ignores_nonsense() {
        let h = headers(&[("Retry-After", "3"), ("retry-after-ms", "250")]);
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2026 07:28:00 GMT"
            )])),
            None
        );
    }

    #[test]
    fn rate_limits_and_server_errors_are_retried_auth_errors_are_not() {
        let none = ReplyHeaders::default();
        assert_eq!(
            classify("x", 429, &headers(&[("retry-after", "1")]), b"{}").retry,
            Retry::After(Some(Duration::from_secs(1)))
        );
        assert_eq!(classify("x", 503, &none, b"").retry, Retry::After(None));
        let auth = classify("x", 401, &none, br#"{"error":{"message":"bad key"}}"#);
        assert_eq!(auth.retry, Retry::Never);
        assert!(auth.message.contains("bad key"), "{}", auth.message);
        assert_eq!(
            classify("x", 400, &none, b"nope").code,
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn keys_never_print() {
        let key = ApiKey::new("sk-secret");
        assert!(!format!("{key:?} {key}").contains("sk-secret"));
        let header = HeaderValue::Secret("Bearer sk-secret".into());
        assert!(!format!("{header:?}").contains("sk-secret"));
    }

    #[test]
    fn unreadable_bodies_are_malformed_not_panics() {
        for body in [&b""[..], b"  \n", b"{\"a\":", b"[1]"] {
            let failure = read_json::<Usage>("x", body).unwrap_err();
            assert_eq!(failure.retry, Retry::Never);
            assert!(
                failure.message.starts_with("x sent a reply"),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn a_missing_total_is_the_sum_of_the_parts() {
        assert_eq!(usage(3, 4, None).total_tokens, 7);
        assert_eq!(usage(3, 4, Some(20)).total_tokens, 20);
        assert_eq!(usage(u64::MAX, 1, None).total_tokens, u64::MAX);
    }

    #[test]
    fn long_error_bodies_are_shortened_on_a_character_boundary() {
        let body = "é".repeat(400);
        let detail = error_detail(body.as_bytes());
        assert_eq!(detail.chars().count(), 301);
        assert!(detail.ends_with('…'));
    }
}
