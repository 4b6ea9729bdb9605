//! THINK (0x01): a prompt for the shared LLM.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, from_value};
use crate::error::{ErrorCode, ErrorReply};

/// One chat message of a structured THINK request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// A THINK request: either a plain-text prompt or the structured form.
///
/// ```
/// use agentos_proto::payload::ThinkRequest;
/// let plain = ThinkRequest::parse(b"What is 2+2?").unwrap();
/// assert_eq!(plain.prompt.as_deref(), Some("What is 2+2?"));
/// let structured = ThinkRequest::parse(br#"{"prompt":"hi","system_instruction":"be brief"}"#).unwrap();
/// assert_eq!(structured.system.as_deref(), Some("be brief"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ThinkRequest {
    /// The user prompt (`prompt` or `messages` is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A system instruction; `system_instruction` is accepted as an alias.
    #[serde(
        default,
        alias = "system_instruction",
        skip_serializing_if = "Option::is_none"
    )]
    pub system: Option<String>,
    /// A chat history, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// Model override; the kernel's configured model otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Upper bound on completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// A W3C `traceparent` whose trace the kernel's spans for this request
    /// join (one that is not valid is ignored, as the standard says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Text that ends the answer where it would appear, not included: a
    /// kernel prompt loop's, never a client's (not on the wire).
    #[serde(skip)]
    pub stop: Vec<String>,
}

impl ThinkRequest {
    /// Parses a THINK payload. A payload that starts with `{` and is a JSON
    /// object with `prompt` or `messages` is structured; anything else is the
    /// prompt itself, as UTF-8 text.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        if payload.first() == Some(&b'{') {
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(payload) {
                if map.contains_key("prompt") || map.contains_key("messages") {
                    let request: ThinkRequest =
                        from_value("THINK", serde_json::Value::Object(map))?;
                    request.validate()?;
                    return Ok(request);
                }
            }
        }
        let prompt = std::str::from_utf8(payload)
            .map_err(|err| bad_request(format!("THINK prompt is not valid UTF-8: {err}")))?;
        let request = ThinkRequest {
            prompt: Some(prompt.to_owned()),
            ..ThinkRequest::default()
        };
        request.validate()?;
        Ok(request)
    }

    /// Checks the protocol's rules for a THINK request.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        let has_prompt = self.prompt.as_deref().is_some_and(|p| !p.trim().is_empty());
        let has_messages = self.messages.as_ref().is_some_and(|m| !m.is_empty());
        if !has_prompt && !has_messages {
            return Err(bad_request(
                "THINK needs a non-empty `prompt` or a non-empty `messages` array",
            ));
        }
        for (i, message) in self.messages.iter().flatten().enumerate() {
            if !matches!(message.role.as_str(), "system" | "user" | "assistant") {
                return Err(bad_request(format!(
                    "THINK field `messages[{i}].role` must be system, user or assistant (got {:?})",
                    message.role
                )));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(bad_request("THINK field `max_tokens` must be at least 1"));
        }
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(bad_request(format!(
                    "THINK field `temperature` must be between 0 and 2 (got {t})"
                )));
            }
        }
        Ok(())
    }
}

/// Token counts reported by the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

/// The reply to THINK. On failure `content` is empty, `tokens` 0, and
/// `error`/`code` say why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ThinkReply {
    /// Whether the model answered.
    pub success: bool,
    /// The model's answer.
    pub content: String,
    /// Total tokens charged for this call.
    pub tokens: u64,
    /// Why it failed, or `null`.
    pub error: Option<String>,
    /// The machine word of the failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Token counts from the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The model that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Time spent waiting in the kernel's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<u64>,
    /// Time spent at the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_without_prompt_or_messages_is_a_plain_prompt() {
        let request = ThinkRequest::parse(br#"{"question":"why?"}"#).unwrap();
        assert_eq!(request.prompt.as_deref(), Some(r#"{"question":"why?"}"#));
    }

    #[test]
    fn a_client_cannot_set_the_loops_stop_sequences() {
        let err = ThinkRequest::parse(br#"{"prompt":"hi","stop":["a"]}"#).unwrap_err();
        assert!(err.error.contains("stop"), "{}", err.error);
        let sent = serde_json::to_value(ThinkRequest {
            prompt: Some("hi".into()),
            stop: vec!["a".into()],
            ..ThinkRequest::default()
        })
        .unwrap();
        assert!(sent.get("stop").is_none(), "{sent}");
    }

    #[test]
    fn structured_prompt_with_wrong_type_names_the_field() {
        let err = ThinkRequest::parse(br#"{"prompt":5}"#).unwrap_err();
        assert!(err.error.contains("`prompt`"), "{}", err.error);
    }

    #[test]
    fn empty_and_non_utf8_prompts_are_refused() {
        assert!(ThinkRequest::parse(b"").is_err());
        assert!(ThinkRequest::parse(b"   ").is_err());
        assert!(ThinkRequest::parse(&[0xFF, 0xFE]).is_err());
    }

    #[test]
    fn messages_roles_and_temperature_are_checked() {
        let err =
            ThinkRequest::parse(br#"{"messages":[{"role":"robot","content":"x"}]}"#).unwrap_err();
        assert!(err.error.contains("messages[0].role"), "{}", err.error);
        let err = ThinkRequest::parse(br#"{"prompt":"x","temperature":9}"#).unwrap_err();
        assert!(err.error.contains("temperature"), "{}", err.error);
    }
}
