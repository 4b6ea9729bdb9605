//! The Anthropic Messages format (`POST {base}/v1/messages`).

use serde::{Deserialize, Serialize};

use super::{
    classify, error_detail, malformed, read_json, to_body, usage, ApiKey, Chat, Completion,
    Failure, HeaderValue, HttpRequest, Provider, ReplyHeaders,
};

/// The API version the request and reply shapes below follow.
const API_VERSION: &str = "2023-06-01";

/// Anthropic's Messages API.
#[derive(Clone, Debug)]
pub struct Anthropic {
    /// Without the version path (`https://api.anthropic.com`); no trailing
    /// slash.
    base_url: String,
    /// Sent as `x-api-key` when set.
    api_key: Option<ApiKey>,
}

impl Anthropic {
    /// The Messages API at `base_url`, sending `api_key` when there is one.
    pub fn new(base_url: &str, api_key: Option<ApiKey>) -> Anthropic {
        Anthropic {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
        }
    }
}

/// The parts of a Messages reply the kernel reads.
#[derive(Deserialize)]
struct Reply {
    #[serde(rename = "type")]
    kind: Option<String>,
    content: Option<Vec<Block>>,
    usage: Option<WireUsage>,
    model: Option<String>,
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

/// A Messages API request.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    max_tokens: u32,
    messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'a str,
    content: String,
}

impl Provider for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn request(&self, chat: &Chat) -> HttpRequest {
        let body = Body {
            model: &chat.model,
            max_tokens: chat.max_tokens,
            messages: turns(chat)
                .into_iter()
                .map(|(role, content)| Turn { role, content })
                .collect(),
            system: chat.system_text(),
            temperature: chat.temperature,
            stop_sequences: &chat.stop,
        };
        let mut headers = Vec::with_capacity(2);
        if let Some(key) = &self.api_key {
            headers.push(("x-api-key", HeaderValue::Secret(key.expose().to_owned())));
        }
        headers.push((
            "anthropic-version",
            HeaderValue::Plain(API_VERSION.to_owned()),
        ));
        HttpRequest {
            url: format!("{}/v1/messages", self.base_url),
            headers,
            body: to_body(&body),
        }
    }

    fn probe_url(&self) -> String {
        format!("{}/v1/models", self.base_url)
    }

    fn parse(&self, body: &[u8]) -> Result<Completion, Failure> {
        let reply: Reply = read_json(self.name(), body)?;
        if reply.kind.as_deref() == Some("error") {
            return Err(self.error_in_success(body));
        }
        let blocks = reply
            .content
            .ok_or_else(|| malformed(self.name(), "the reply has no content"))?;
        // Thinking and tool-use blocks sit among the text blocks; only the
        // text is the answer.
        let mut content = String::new();
        for block in blocks.iter().filter(|b| b.kind == "text") {
            let text = block
                .text
                .as_deref()
                .ok_or_else(|| malformed(self.name(), "a text block has no text"))?;
            content.push_str(text);
        }
        let usage = match reply.usage {
            Some(u) => usage(u.input_tokens, u.output_tokens, None),
            None => usage(0, 0, None),
        };
        Ok(Completion {
            content,
            usage,
            model: reply.model.unwrap_or_default(),
            finish_reason: reply.stop_reason,
        })
    }
}

impl Anthropic {
    /// An error body that came with a 2xx status, read as if it had come
    /// with the status its `error.type` stands for, so that an overload is
    /// retried and a bad request is not.
    fn error_in_success(&self, body: &[u8]) -> Failure {
        let kind = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.pointer("/error/type")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        let status = match kind.as_str() {
            "invalid_request_error" => 400,
            "authentication_error" => 401,
            "permission_error" => 403,
            "not_found_error" => 404,
            "request_too_large" => 413,
            "rate_limit_error" => 429,
            "api_error" => 500,
            "timeout_error" => 504,
            "overloaded_error" => 529,
            // An error the kernel cannot place: retrying blind could loop.
            _ => 0,
        };
        let mut failure = classify(self.name(), status, &ReplyHeaders::default(), body);
        failure.message = format!(
            "{} answered an error ({}): {}",
            self.name(),
            if kind.is_empty() { "untyped" } else { &kind },
            error_detail(body),
        );
        failure
    }
}

/// The conversation without its system messages (they go in `system`),
/// with consecutive messages of one role joined: the API wants user and
/// assistant turns to alternate, and a run of user messages is one turn.
fn turns(chat: &Chat) -> Vec<(&str, String)> {
    let mut turns: Vec<(&str, String)> = Vec::with_capacity(chat.messages.len());
    for message in chat.messages.iter().filter(|m| m.role != "system") {
        match turns.last_mut() {
            Some((role, content)) if *role == message.role => {
                content.push_str("\n\n");
                content.push_str(&message.content);
            }
            _ => turns.push((message.role.as_str(), message.content.clone())),
        }
    }
    turns
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentos_proto::payload::Usage;
    use agentos_proto::ErrorCode;

    use super::*;
    use crate::llm::provider::tests::message;
    use crate::llm::provider::Retry;
    use serde_json::json;

    fn chat() -> Chat {
        Chat {
            model: "claude-sonnet-4-5".into(),
            system: Some("Be brief.".into()),
            messages: vec![
                message("user", "What is 2+2?"),
                message("assistant", "4"),
                message("user", "And 3+3?"),
            ],
            max_tokens: 512,
            temperature: Some(0.7),
            stop: Vec::new(),
        }
    }

    fn anthropic() -> Anthropic {
        Anthropic::new(
            "https://api.anthropic.com/",
            Some(ApiKey::new("sk-ant-test-secret")),
        )
    }

    fn body_of(request: &HttpRequest) -> serde_json::Value {
        serde_json::from_slice(&request.body).unwrap()
    }

    #[test]
    fn request_goes_to_messages_with_key_and_version() {
        let request = anthropic().request(&chat());
        assert_eq!(request.url, "https://api.anthropic.com/v1/messages");
        assert_eq!(
            request.headers,
            vec![
                (
                    "x-api-key",
                    HeaderValue::Secret("sk-ant-test-secret".into())
                ),
                ("anthropic-version", HeaderValue::Plain("2023-06-01".into())),
            ]
        );
        assert!(!format!("{request:?}").contains("sk-ant-test-secret"));
    }

    #[test]
    fn request_without_a_key_still_names_the_version() {
        let request = Anthropic::new("http://proxy:4000", None).request(&chat());
        assert_eq!(request.url, "http://proxy:4000/v1/messages");
        assert_eq!(
            request.headers,
            vec![("anthropic-version", HeaderValue::Plain("2023-06-01".into()))]
        );
    }

    #[test]
    fn stop_sequences_are_sent_as_stop_sequences() {
        let mut chat = chat();
        assert!(body_of(&anthropic().request(&chat))
            .get("stop_sequences")
            .is_none());
        chat.stop = vec!["```\n\n".into()];
        assert_eq!(
            body_of(&anthropic().request(&chat))["stop_sequences"],
            json!(["```\n\n"])
        );
    }

    #[test]
    fn request_body_has_system_apart_from_the_messages() {
        let body = body_of(&anthropic().request(&chat()));
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 512,
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And 3+3?"},
                ],
                "temperature": 0.7,
            })
        );
    }

    #[test]
    fn system_messages_fold_into_system_and_runs_of_one_role_merge() {
        let chat = Chat {
            model: "m".into(),
            system: None,
            messages: vec![
                message("system", "Answer in French."),
                message("user", "Hello."),
                message("user", "What is 2+2?"),
                message("assistant", "4"),
                message("system", "Be terse."),
                message("assistant", "Quatre."),
            ],
            max_tokens: 10,
            temperature: None,
            stop: Vec::new(),
        };
        let body = body_of(&anthropic().request(&chat));
        assert_eq!(body["system"], "Answer in French.\n\nBe terse.");
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": "Hello.\n\nWhat is 2+2?"},
                {"role": "assistant", "content": "4\n\nQuatre."},
            ])
        );
        assert!(body.get("temperature").is_none());
    }

    #[test]
    fn request_without_system_text_has_no_system_field() {
        let mut chat = chat();
        chat.system = None;
        let body = body_of(&anthropic().request(&chat));
        assert!(body.get("system").is_none());
        assert_eq!(body["max_tokens"], 512);
    }

    #[test]
    fn parse_joins_text_blocks_and_skips_the_others() {
        let body = br#"{
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [
                {"type": "thinking", "thinking": "3+3 is 6", "signature": "abc"},
                {"type": "text", "text": "It is ", "citations": null},
                {"type": "text", "text": "6."}
            ],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {
                "input_tokens": 25,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 4,
                "service_tier": "standard"
            }
        }"#;
        assert_eq!(
            anthropic().parse(body).unwrap(),
            Completion {
                content: "It is 6.".into(),
                usage: Usage {
                    prompt_tokens: 25,
                    completion_tokens: 4,
                    total_tokens: 29,
                },
                model: "claude-sonnet-4-5-20250929".into(),
                finish_reason: Some("end_turn".into()),
            }
        );
    }

    #[test]
    fn missing_usage_and_model_read_as_zero_and_empty() {
        let body = br#"{"type":"message","content":[{"type":"text","text":"hi"}]}"#;
        let completion = anthropic().parse(body).unwrap();
        assert_eq!(completion.usage, Usage::default());
        assert_eq!(completion.model, "");

        let partial = br#"{"content":[],"usage":{"output_tokens":3}}"#;
        let completion = anthropic().parse(partial).unwrap();
        assert_eq!(completion.content, "");
        assert_eq!(completion.usage.total_tokens, 3);
    }

    #[test]
    fn malformed_bodies_fail_without_panicking() {
        let bodies: [&[u8]; 8] = [
            b"",
            b"<html>502 Bad Gateway</html>",
            br#"{"type":"message","content":[{"type":"text","te"#,
            br#"{"type":"message"}"#,
            br#"{"content":"just a string"}"#,
            br#"{"content":[{"type":"text"}]}"#,
            br#"{"content":[{"type":"text","text":7}]}"#,
            br#"{"content":[],"usage":{"input_tokens":-1}}"#,
        ];
        for body in bodies {
            let failure = anthropic().parse(body).unwrap_err();
            assert_eq!(failure.code, ErrorCode::Unavailable, "{failure:?}");
            assert!(
                failure.message.starts_with("anthropic "),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn an_error_body_with_a_success_status_is_a_failure() {
        let overloaded =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let failure = anthropic().parse(overloaded).unwrap_err();
        assert_eq!(failure.retry, Retry::After(None));
        assert!(
            failure.message.contains("Overloaded"),
            "{}",
            failure.message
        );

        let invalid = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#;
        let failure = anthropic().parse(invalid).unwrap_err();
        assert_eq!(failure.retry, Retry::Never);
        assert_eq!(failure.code, ErrorCode::BadRequest);

        let untyped = br#"{"type":"error"}"#;
        assert_eq!(anthropic().parse(untyped).unwrap_err().retry, Retry::Never);
    }

    #[test]
    fn overloaded_529_is_retried() {
        let body =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let failure = anthropic().failure(529, &ReplyHeaders::default(), body);
        assert_eq!(failure.retry, Retry::After(None));
        assert_eq!(failure.code, ErrorCode::Unavailable);
        assert!(
            failure.message.contains("Overloaded"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn rate_limit_is_retried_after_the_hint_and_bad_requests_are_not() {
        let headers = ReplyHeaders(vec![("retry-after".into(), "7".into())]);
        let body = br#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
        let failure = anthropic().failure(429, &headers, body);
        assert_eq!(failure.retry, Retry::After(Some(Duration::from_secs(7))));

        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}"#;
        let failure = anthropic().failure(400, &ReplyHeaders::default(), body);
        assert_eq!(failure.retry, Retry::Never);
        assert_eq!(failure.code, ErrorCode::BadRequest);
    }
}
