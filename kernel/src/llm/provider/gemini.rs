//! The Gemini API's generateContent format
//! (`POST {base}/v1beta/models/{model}:generateContent`).

use std::time::Duration;

use agentos_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use super::{
    classify, finite_delay, malformed, read_json, to_body, usage, ApiKey, Chat, Completion,
    Failure, HeaderValue, HttpRequest, Provider, ReplyHeaders, Retry,
};

/// Google's Gemini API.
#[derive(Clone, Debug)]
pub struct Gemini {
    /// Without the version path (`https://generativelanguage.googleapis.com`);
    /// no trailing slash.
    base_url: String,
    /// Sent as `x-goog-api-key` when set.
    api_key: Option<ApiKey>,
}

impl Gemini {
    /// The Gemini API at `base_url`, sending `api_key` when there is one.
    pub fn new(base_url: &str, api_key: Option<ApiKey>) -> Gemini {
        Gemini {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
        }
    }
}

/// The parts of a generateContent reply the kernel reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reply {
    #[serde(default)]
    candidates: Vec<Candidate>,
    prompt_feedback: Option<PromptFeedback>,
    usage_metadata: Option<WireUsage>,
    model_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    parts: Option<Vec<Part>>,
}

#[derive(Deserialize)]
struct Part {
    text: Option<String>,
    #[serde(default)]
    thought: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    total_token_count: Option<u64>,
}

/// A `generateContent` request.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    contents: Vec<Turn<'a>>,
    generation_config: GenerationConfig<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<Instruction<'a>>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    parts: [TextPart<'a>; 1],
}

#[derive(Serialize)]
struct Instruction<'a> {
    parts: [TextPart<'a>; 1],
}

#[derive(Serialize)]
struct TextPart<'a> {
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    max_output_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
}

impl Provider for Gemini {
    fn name(&self) -> &'static str {
        "gemini"
    }

    fn request(&self, chat: &Chat) -> HttpRequest {
        let contents = chat
            .messages
            .iter()
            .filter(|m| m.role != "system")
            .map(|m| Turn {
                role: if m.role == "assistant" {
                    "model"
                } else {
                    "user"
                },
                parts: [TextPart { text: &m.content }],
            })
            .collect();
        let system = chat.system_text();
        let body = Body {
            contents,
            generation_config: GenerationConfig {
                max_output_tokens: chat.max_tokens,
                temperature: chat.temperature,
                stop_sequences: &chat.stop,
            },
            system_instruction: system.as_deref().map(|text| Instruction {
                parts: [TextPart { text }],
            }),
        };
        let headers = self
            .api_key
            .iter()
            .map(|key| {
                (
                    "x-goog-api-key",
                    HeaderValue::Secret(key.expose().to_owned()),
                )
            })
            .collect();
        HttpRequest {
            url: format!(
                "{}/v1beta/models/{}:generateContent",
                self.base_url,
                model_segment(&chat.model)
            ),
            headers,
            body: to_body(&body),
        }
    }

    fn probe_url(&self) -> String {
        format!("{}/v1beta/models", self.base_url)
    }

    fn parse(&self, body: &[u8]) -> Result<Completion, Failure> {
        let reply: Reply = read_json(self.name(), body)?;
        let Some(candidate) = reply.candidates.into_iter().next() else {
            return Err(match reply.prompt_feedback.and_then(|f| f.block_reason) {
                Some(reason) => Failure::fatal(
                    ErrorCode::BadRequest,
                    format!("{} blocked the prompt: {reason}", self.name()),
                ),
                None => malformed(self.name(), "no candidates in the reply"),
            });
        };
        let Some(parts) = candidate.content.and_then(|c| c.parts) else {
            // Without parts, the finish reason is the explanation: a safety
            // stop, or thinking that spent the whole token budget.
            return Err(match candidate.finish_reason {
                Some(reason) if reason != "STOP" => Failure::fatal(
                    ErrorCode::BadRequest,
                    format!("{} returned no text (finishReason {reason})", self.name()),
                ),
                _ => malformed(self.name(), "the first candidate has no content"),
            });
        };
        // Thought summaries are parts too; they are not the answer.
        let content: String = parts
            .iter()
            .filter(|p| !p.thought)
            .filter_map(|p| p.text.as_deref())
            .collect();
        let usage = match reply.usage_metadata {
            Some(u) => usage(
                u.prompt_token_count,
                u.candidates_token_count,
                u.total_token_count,
            ),
            None => usage(0, 0, None),
        };
        Ok(Completion {
            content,
            usage,
            model: reply.model_version.unwrap_or_default(),
            finish_reason: candidate.finish_reason,
        })
    }

    fn failure(&self, status: u16, headers: &ReplyHeaders, body: &[u8]) -> Failure {
        let mut failure = classify(self.name(), status, headers, body);
        // Gemini names its wait in the body, and that figure is the one its
        // quota system enforces; it only refines a failure already worth
        // retrying.
        if let (Retry::After(_), Some(delay)) = (failure.retry, retry_info(body)) {
            failure.retry = Retry::After(Some(delay));
        }
        failure
    }
}

/// The delay of a `google.rpc.RetryInfo` entry in `error.details`, whose
/// `retryDelay` is a protobuf Duration in JSON: seconds with an `s`
/// suffix (`"12s"`, `"0.5s"`).
fn retry_info(body: &[u8]) -> Option<Duration> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value
        .pointer("/error/details")?
        .as_array()?
        .iter()
        .filter(|detail| {
            detail
                .get("@type")
                .and_then(|t| t.as_str())
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|detail| {
            let delay = detail.get("retryDelay")?.as_str()?.strip_suffix('s')?;
            delay.trim().parse::<f64>().ok()
        })
        .and_then(finite_delay)
}

/// The model as one URL path segment. Gemini lists models as
/// `models/<name>`, so that prefix is accepted; the model comes from an
/// agent, so anything but unreserved characters is percent-encoded to keep
/// it from reaching another path or the query.
fn model_segment(model: &str) -> String {
    let name = model.strip_prefix("models/").unwrap_or(model);
    let mut segment = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    segment
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::Usage;

    use super::*;
    use crate::llm::provider::tests::message;
    use serde_json::json;

    fn chat() -> Chat {
        Chat {
            model: "gemini-2.5-flash".into(),
            system: Some("Be brief.".into()),
            messages: vec![
                message("user", "What is 2+2?"),
                message("assistant", "4"),
                message("system", "Answer with a digit."),
                message("user", "And 3+3?"),
            ],
            max_tokens: 128,
            temperature: Some(0.5),
            stop: Vec::new(),
        }
    }

    fn gemini() -> Gemini {
        Gemini::new(
            "https://generativelanguage.googleapis.com/",
            Some(ApiKey::new("AIza-test-secret")),
        )
    }

    fn body_of(request: &HttpRequest) -> serde_json::Value {
        serde_json::from_slice(&request.body).unwrap()
    }

    fn quota_error(details: &str) -> Vec<u8> {
        format!(
            r#"{{"error":{{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.",
            "status":"RESOURCE_EXHAUSTED","details":[{details}]}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn request_names_the_model_in_the_url_and_sends_the_key_in_a_header() {
        let request = gemini().request(&chat());
        assert_eq!(
            request.url,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            request.headers,
            vec![(
                "x-goog-api-key",
                HeaderValue::Secret("AIza-test-secret".into())
            )]
        );
        assert!(!format!("{request:?}").contains("AIza-test-secret"));
        assert!(!request.url.contains("AIza-test-secret"));
    }

    #[test]
    fn request_without_a_key_has_no_key_header() {
        let request = Gemini::new("http://proxy:8080", None).request(&chat());
        assert!(request.headers.is_empty());
        assert!(request.url.starts_with("http://proxy:8080/v1beta/models/"));
    }

    #[test]
    fn model_names_cannot_leave_their_path_segment() {
        let mut chat = chat();
        chat.model = "models/gemini-2.0-flash".into();
        assert!(gemini()
            .request(&chat)
            .url
            .ends_with("/v1beta/models/gemini-2.0-flash:generateContent"));
        chat.model = "../files?key=x#y".into();
        assert!(gemini()
            .request(&chat)
            .url
            .ends_with("/v1beta/models/..%2Ffiles%3Fkey%3Dx%23y:generateContent"));
    }

    #[test]
    fn request_body_maps_roles_and_gathers_the_system_text() {
        let body = body_of(&gemini().request(&chat()));
        assert_eq!(
            body,
            json!({
                "contents": [
                    {"role": "user", "parts": [{"text": "What is 2+2?"}]},
                    {"role": "model", "parts": [{"text": "4"}]},
                    {"role": "user", "parts": [{"text": "And 3+3?"}]},
                ],
                "systemInstruction": {"parts": [{"text": "Be brief.\n\nAnswer with a digit."}]},
                "generationConfig": {"maxOutputTokens": 128, "temperature": 0.5},
            })
        );
    }

    #[test]
    fn stop_sequences_are_sent_in_the_generation_config() {
        let mut chat = chat();
        chat.stop = vec!["```\n\n".into()];
        let body = body_of(&gemini().request(&chat));
        assert_eq!(
            body["generationConfig"]["stopSequences"],
            json!(["```\n\n"])
        );
    }

    #[test]
    fn request_body_omits_what_the_caller_did_not_choose() {
        let chat = Chat {
            model: "gemini-2.5-flash".into(),
            system: None,
            messages: vec![message("user", "Hi")],
            max_tokens: 64,
            temperature: None,
            stop: Vec::new(),
        };
        let body = body_of(&gemini().request(&chat));
        assert!(body.get("systemInstruction").is_none());
        assert_eq!(body["generationConfig"], json!({"maxOutputTokens": 64}));
    }

    #[test]
    fn parse_joins_the_text_parts_of_the_first_candidate() {
        let body = br#"{
            "candidates": [{
                "content": {
                    "parts": [
                        {"text": "Let me add.", "thought": true},
                        {"text": "It is "},
                        {"text": "6."}
                    ],
                    "role": "model"
                },
                "finishReason": "STOP",
                "avgLogprobs": -0.05,
                "safetyRatings": []
            }],
            "usageMetadata": {
                "promptTokenCount": 12,
                "candidatesTokenCount": 4,
                "totalTokenCount": 40,
                "thoughtsTokenCount": 24,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 12}]
            },
            "modelVersion": "gemini-2.5-flash",
            "responseId": "abc123"
        }"#;
        assert_eq!(
            gemini().parse(body).unwrap(),
            Completion {
                content: "It is 6.".into(),
                usage: Usage {
                    prompt_tokens: 12,
                    completion_tokens: 4,
                    total_tokens: 40,
                },
                model: "gemini-2.5-flash".into(),
                finish_reason: Some("STOP".into()),
            }
        );
    }

    #[test]
    fn missing_usage_counts_zero_and_missing_total_is_the_sum() {
        let body = br#"{"candidates":[{"content":{"parts":[{"text":"hi"}]}}]}"#;
        let completion = gemini().parse(body).unwrap();
        assert_eq!(completion.usage, Usage::default());
        assert_eq!(completion.model, "");

        let no_total = br#"{"candidates":[{"content":{"parts":[{"text":"hi"}]}}],
            "usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":2}}"#;
        assert_eq!(gemini().parse(no_total).unwrap().usage.total_tokens, 11);
    }

    #[test]
    fn a_blocked_prompt_is_a_bad_request_not_retried() {
        let body = br#"{"promptFeedback":{"blockReason":"SAFETY","safetyRatings":[]},
            "usageMetadata":{"promptTokenCount":8,"totalTokenCount":8}}"#;
        let failure = gemini().parse(body).unwrap_err();
        assert_eq!(failure.retry, Retry::Never);
        assert_eq!(failure.code, ErrorCode::BadRequest);
        assert!(
            failure.message.contains("blocked the prompt: SAFETY"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn a_candidate_without_parts_reports_its_finish_reason() {
        let body = br#"{"candidates":[{"content":{"role":"model"},"finishReason":"MAX_TOKENS"}]}"#;
        let failure = gemini().parse(body).unwrap_err();
        assert_eq!(failure.code, ErrorCode::BadRequest);
        assert!(
            failure.message.contains("MAX_TOKENS"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn malformed_bodies_fail_without_panicking() {
        let bodies: [&[u8]; 9] = [
            b"",
            b"Service Unavailable",
            br#"{"candidates":[{"content":{"parts":[{"text":"tru"#,
            b"{}",
            br#"{"candidates":[]}"#,
            br#"{"candidates":[{"finishReason":"STOP"}]}"#,
            br#"{"candidates":{"content":{}}}"#,
            br#"{"candidates":[{"content":{"parts":[{"text":["a"]}]}}]}"#,
            br#"{"candidates":[{"content":{"parts":[]}}],"usageMetadata":{"promptTokenCount":1.5}}"#,
        ];
        for body in bodies {
            let failure = gemini().parse(body).unwrap_err();
            assert_eq!(failure.code, ErrorCode::Unavailable, "{failure:?}");
            assert!(
                failure.message.starts_with("gemini "),
                "{}",
                failure.message
            );
        }
    }

    #[test]
    fn retry_info_in_the_body_sets_the_delay() {
        let headers = ReplyHeaders(vec![("retry-after".into(), "60".into())]);
        let body = quota_error(
            r#"{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[]},
               {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"12s"}"#,
        );
        let failure = gemini().failure(429, &headers, &body);
        assert_eq!(failure.retry, Retry::After(Some(Duration::from_secs(12))));

        let body = quota_error(
            r#"{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"0.5s"}"#,
        );
        let failure = gemini().failure(503, &ReplyHeaders::default(), &body);
        assert_eq!(
            failure.retry,
            Retry::After(Some(Duration::from_millis(500)))
        );
    }

    #[test]
    fn exhausted_quota_without_retry_info_is_still_retried() {
        let body = quota_error("");
        let failure = gemini().failure(429, &ReplyHeaders::default(), &body);
        assert_eq!(failure.retry, Retry::After(None));
        assert!(failure.message.contains("quota"), "{}", failure.message);
    }

    #[test]
    fn nonsense_retry_delays_fall_back_to_the_headers() {
        let headers = ReplyHeaders(vec![("retry-after".into(), "3".into())]);
        for delay in [r#""soon""#, r#""12""#, r#""-4s""#, "12"] {
            let body = quota_error(&format!(
                r#"{{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{delay}}}"#
            ));
            let failure = gemini().failure(429, &headers, &body);
            assert_eq!(
                failure.retry,
                Retry::After(Some(Duration::from_secs(3))),
                "{delay}"
            );
        }
    }

    #[test]
    fn retry_info_does_not_make_a_bad_request_retryable() {
        let body =
            br#"{"error":{"code":400,"message":"API key not valid.","status":"INVALID_ARGUMENT",
            "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"5s"}]}}"#;
        let failure = gemini().failure(400, &ReplyHeaders::default(), body);
        assert_eq!(failure.retry, Retry::Never);
        assert_eq!(failure.code, ErrorCode::BadRequest);
    }
}
