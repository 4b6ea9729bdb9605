//! The OpenAI chat-completions format (`POST {base}/chat/completions`),
//! which llama.cpp, vLLM, Ollama and LiteLLM speak too — hence the name is
//! a parameter: the same format serves `openai` and `local`.

use agentos_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use super::{
    classify, error_detail, malformed, read_json, to_body, usage, ApiKey, Chat, Completion,
    Failure, HeaderValue, HttpRequest, Provider, ReplyHeaders,
};

/// A server speaking the OpenAI chat-completions format.
#[derive(Clone, Debug)]
pub struct OpenAi {
    /// Includes the version path (`https://api.openai.com/v1`); no
    /// trailing slash.
    base_url: String,
    /// Local servers usually need none.
    api_key: Option<ApiKey>,
    /// `openai` or `local`, for messages and configuration.
    name: &'static str,
}

impl OpenAi {
    /// A provider called `name` at `base_url` (which includes `/v1`),
    /// sending `api_key` as a bearer token when there is one.
    pub fn new(name: &'static str, base_url: &str, api_key: Option<ApiKey>) -> OpenAi {
        OpenAi {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            name,
        }
    }
}

/// The parts of a chat-completion reply the kernel reads.
#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
    model: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    message: Option<Message>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    content: Option<String>,
    refusal: Option<String>,
}

/// A chat completion request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Vec<Turn<'a>>,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    total_tokens: Option<u64>,
}

impl Provider for OpenAi {
    fn name(&self) -> &'static str {
        self.name
    }

    fn request(&self, chat: &Chat) -> HttpRequest {
        let body = Body {
            model: &chat.model,
            messages: chat
                .system
                .iter()
                .map(|system| Turn {
                    role: "system",
                    content: system,
                })
                .chain(chat.messages.iter().map(|m| Turn {
                    role: &m.role,
                    content: &m.content,
                }))
                .collect(),
            max_tokens: chat.max_tokens,
            temperature: chat.temperature,
            stop: &chat.stop,
        };
        let headers = self
            .api_key
            .iter()
            .map(|key| {
                (
                    "authorization",
                    HeaderValue::Secret(format!("Bearer {}", key.expose())),
                )
            })
            .collect();
        HttpRequest {
            url: format!("{}/chat/completions", self.base_url),
            headers,
            body: to_body(&body),
        }
    }

    fn probe_url(&self) -> String {
        format!("{}/models", self.base_url)
    }

    fn parse(&self, body: &[u8]) -> Result<Completion, Failure> {
        let reply: Reply = read_json(self.name, body)?;
        let Some(choice) = reply.choices.into_iter().next() else {
            // Some compatible servers answer 200 with an error object; its
            // message says more than "no choices" would.
            return Err(malformed(
                self.name,
                format!("no choices in the reply: {}", error_detail(body)),
            ));
        };
        let message = choice
            .message
            .ok_or_else(|| malformed(self.name, "the first choice has no message"))?;
        // A refusal comes with null content; it is the model's answer, so
        // the agent sees it rather than a failure.
        let content = match (message.content, message.refusal) {
            (Some(content), _) => content,
            (None, Some(refusal)) => refusal,
            (None, None) => {
                let reason = choice.finish_reason.as_deref().unwrap_or("none given");
                return Err(malformed(
                    self.name,
                    format!("the message has no content (finish_reason: {reason})"),
                ));
            }
        };
        let usage = match reply.usage {
            Some(u) => usage(u.prompt_tokens, u.completion_tokens, u.total_tokens),
            None => usage(0, 0, None),
        };
        Ok(Completion {
            content,
            usage,
            // llama.cpp answers "-" for a model name it was not given an
            // alias for: no name at all.
            model: reply.model.filter(|m| m != "-").unwrap_or_default(),
            finish_reason: choice.finish_reason,
        })
    }

    fn failure(&self, status: u16, headers: &ReplyHeaders, body: &[u8]) -> Failure {
        // OpenAI reports an exhausted account as 429, like a rate limit, but
        // waiting does not refill it: retrying would only burn the deadline.
        if status == 429 && out_of_quota(body) {
            return Failure::fatal(
                ErrorCode::LimitExceeded,
                format!(
                    "{} answered HTTP 429: {} (the {} account has run out of quota; check its plan and billing)",
                    self.name,
                    error_detail(body),
                    self.name,
                ),
            );
        }
        classify(self.name, status, headers, body)
    }
}

/// Whether an error body says the account's quota is spent.
fn out_of_quota(body: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    ["/error/code", "/error/type"]
        .iter()
        .any(|field| value.pointer(field).and_then(|v| v.as_str()) == Some("insufficient_quota"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentos_proto::payload::{ChatMessage, Usage};

    use super::*;
    use crate::llm::provider::Retry;
    use serde_json::json;

    fn chat() -> Chat {
        Chat {
            model: "gpt-4o-mini".into(),
            system: Some("Be brief.".into()),
            messages: vec![
                ChatMessage {
                    role: "user".into(),
                    content: "What is 2+2?".into(),
                },
                ChatMessage {
                    role: "assistant".into(),
                    content: "4".into(),
                },
                ChatMessage {
                    role: "user".into(),
                    content: "And 3+3?".into(),
                },
            ],
            max_tokens: 256,
            temperature: Some(0.2),
            stop: Vec::new(),
        }
    }

    fn openai() -> OpenAi {
        OpenAi::new(
            "openai",
            "https://api.openai.com/v1/",
            Some(ApiKey::new("sk-test-secret")),
        )
    }

    fn body_of(request: &HttpRequest) -> serde_json::Value {
        serde_json::from_slice(&request.body).unwrap()
    }

    #[test]
    fn request_goes_to_chat_completions_with_a_bearer_key() {
        let request = openai().request(&chat());
        assert_eq!(request.url, "https://api.openai.com/v1/chat/completions");
        assert_eq!(
            request.headers,
            vec![(
                "authorization",
                HeaderValue::Secret("Bearer sk-test-secret".into())
            )]
        );
        assert!(!format!("{request:?}").contains("sk-test-secret"));
    }

    #[test]
    fn request_without_a_key_has_no_authorization_header() {
        let local = OpenAi::new("local", "http://127.0.0.1:8080/v1", None);
        let request = local.request(&chat());
        assert_eq!(request.url, "http://127.0.0.1:8080/v1/chat/completions");
        assert!(request.headers.is_empty());
        assert_eq!(local.name(), "local");
    }

    #[test]
    fn request_body_puts_the_system_instruction_first() {
        let body = body_of(&openai().request(&chat()));
        assert_eq!(
            body,
            json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And 3+3?"},
                ],
                "max_tokens": 256,
                "temperature": 0.2,
            })
        );
    }

    #[test]
    fn request_body_omits_what_the_caller_did_not_choose() {
        let mut chat = chat();
        chat.system = None;
        chat.temperature = None;
        let body = body_of(&openai().request(&chat));
        assert!(body.get("temperature").is_none());
        assert!(body.get("stop").is_none());
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["messages"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn stop_sequences_are_sent_as_stop() {
        let mut chat = chat();
        chat.stop = vec!["```\n\n".into()];
        assert_eq!(
            body_of(&openai().request(&chat))["stop"],
            json!(["```\n\n"])
        );
    }

    #[test]
    fn parse_reads_content_usage_and_model_ignoring_the_rest() {
        let body = br#"{
            "id": "chatcmpl-abc123",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "6", "refusal": null, "annotations": []},
                "logprobs": null,
                "finish_reason": "stop"
            }],
            "usage": {
                "prompt_tokens": 31,
                "completion_tokens": 1,
                "total_tokens": 32,
                "prompt_tokens_details": {"cached_tokens": 0}
            },
            "system_fingerprint": "fp_0123"
        }"#;
        let completion = openai().parse(body).unwrap();
        assert_eq!(
            completion,
            Completion {
                content: "6".into(),
                usage: Usage {
                    prompt_tokens: 31,
                    completion_tokens: 1,
                    total_tokens: 32,
                },
                model: "gpt-4o-mini-2024-07-18".into(),
                finish_reason: Some("stop".into()),
            }
        );
    }

    #[test]
    fn missing_usage_counts_zero_and_missing_total_is_the_sum() {
        let no_usage = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
        let completion = openai().parse(no_usage).unwrap();
        assert_eq!(completion.usage, Usage::default());
        assert_eq!(completion.model, "");

        let no_total = br#"{"model":"m","choices":[{"message":{"content":"hi"}}],
            "usage":{"prompt_tokens":7,"completion_tokens":5}}"#;
        let usage = openai().parse(no_total).unwrap().usage;
        assert_eq!(usage.total_tokens, 12);
    }

    #[test]
    fn a_refusal_is_the_answer_when_content_is_null() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":null,
            "refusal":"I can't help with that."},"finish_reason":"stop"}]}"#;
        assert_eq!(
            openai().parse(body).unwrap().content,
            "I can't help with that."
        );
    }

    #[test]
    fn null_content_without_a_refusal_is_malformed() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":null},
            "finish_reason":"tool_calls"}]}"#;
        let failure = openai().parse(body).unwrap_err();
        assert_eq!(failure.retry, Retry::Never);
        assert!(
            failure.message.contains("tool_calls"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn malformed_bodies_fail_without_panicking() {
        let bodies: [&[u8]; 9] = [
            b"",
            b"not json",
            br#"{"choices":[{"message":{"content":"trunc"#,
            b"[]",
            b"{}",
            br#"{"choices":[]}"#,
            br#"{"choices":[{"finish_reason":"stop"}]}"#,
            br#"{"choices":[{"message":{"content":42}}]}"#,
            br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":"many"}}"#,
        ];
        for body in bodies {
            let failure = openai().parse(body).unwrap_err();
            assert_eq!(failure.code, ErrorCode::Unavailable, "{failure:?}");
            assert!(
                failure.message.starts_with("openai "),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn an_error_object_in_a_success_reply_is_quoted() {
        let body = br#"{"error":{"message":"model is loading","code":503}}"#;
        let failure = OpenAi::new("local", "http://x/v1", None)
            .parse(body)
            .unwrap_err();
        assert!(
            failure.message.contains("model is loading"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn insufficient_quota_is_not_retried() {
        let body = br#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.",
            "type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let failure = openai().failure(429, &ReplyHeaders::default(), body);
        assert_eq!(failure.retry, Retry::Never);
        assert_eq!(failure.code, ErrorCode::LimitExceeded);
        assert!(failure.message.contains("quota"), "{}", failure.message);

        let by_type_only = br#"{"error":{"message":"quota","type":"insufficient_quota"}}"#;
        let failure = openai().failure(429, &ReplyHeaders::default(), by_type_only);
        assert_eq!(failure.retry, Retry::Never);
    }

    #[test]
    fn an_ordinary_rate_limit_is_retried_after_the_hint() {
        let headers = ReplyHeaders(vec![("retry-after-ms".into(), "1500".into())]);
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        let failure = openai().failure(429, &headers, body);
        assert_eq!(
            failure.retry,
            Retry::After(Some(Duration::from_millis(1500)))
        );
    }

    #[test]
    fn a_bad_key_is_not_retried_and_the_key_is_not_echoed() {
        let body =
            br#"{"error":{"message":"Incorrect API key provided.","code":"invalid_api_key"}}"#;
        let failure = openai().failure(401, &ReplyHeaders::default(), body);
        assert_eq!(failure.retry, Retry::Never);
        assert!(!failure.message.contains("sk-test-secret"));
    }
}
