//! TOOL `call`'s reply for what a call to a server came to: the result as
//! the protocol defines it, the server's secrets blotted out of all of it,
//! and never more than a reply may carry.

use agentos_proto::payload::ToolReply;
use agentos_proto::{ErrorCode, ErrorReply, MAX_REPLY_BYTES};
use serde::Deserialize;
use serde_json::Value;

use super::mcp::client::CallOutcome;
use super::secrets::Secrets;
use crate::address::Answer;

/// The reply for `outcome`, a call to `server`.
pub fn reply_for(outcome: CallOutcome, server: &str, secrets: &Secrets) -> Answer {
    let reply: Answer = match outcome {
        CallOutcome::Done {
            mut content,
            structured,
        } => {
            secrets.redact_value(&mut content);
            let mut result = result_of(&content, structured);
            // Again: `result` may be the text parsed as JSON, whose escapes
            // (`\u0073k-...`) can spell a secret the text did not.
            secrets.redact_value(&mut result);
            ToolReply::done(result, content).into()
        }
        CallOutcome::ToolError {
            message,
            mut content,
        } => {
            secrets.redact_value(&mut content);
            ToolReply::tool_error(secrets.redact(&message), content).into()
        }
        CallOutcome::Rejected(why) => {
            let why = secrets.redact(&why);
            ErrorReply::new(ErrorCode::ToolError, format!("{server}: {why}")).into()
        }
        CallOutcome::TimedOut(why) => ErrorReply::new(ErrorCode::Timeout, why).into(),
        CallOutcome::Failed(why) => {
            let why = secrets.redact(&why);
            ErrorReply::new(
                ErrorCode::Unavailable,
                format!("tool server {server}: {why}"),
            )
            .into()
        }
    };
    let bytes = reply.json_len();
    if bytes as u64 > MAX_REPLY_BYTES {
        return ErrorReply::new(
            ErrorCode::LimitExceeded,
            format!(
                "{server} answered, but its result makes a reply of {bytes} bytes, over the {} a \
                 reply may carry",
                MAX_REPLY_BYTES
            ),
        )
        .into();
    }
    reply
}

/// A content block, as far as the kernel reads one: text, or another kind.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    #[serde(other)]
    Other,
}

/// A call's `result`: its structured content if it gave any, else its
/// text parsed as JSON if it is JSON, else the text (several text blocks
/// joined by newlines), else null.
pub fn result_of(content: &Value, structured: Option<Value>) -> Value {
    if let Some(structured) = structured {
        return structured;
    }
    let texts: Vec<String> = content
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|block| match Block::deserialize(block) {
                    Ok(Block::Text { text }) => Some(text),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if texts.is_empty() {
        return Value::Null;
    }
    let text = texts.join("\n");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_prefers_structured_content_then_json_text_then_text() {
        let content = json!([{"type": "text", "text": "{\"sum\": 3}"}]);
        assert_eq!(result_of(&content, Some(json!({"s": 1}))), json!({"s": 1}));
        assert_eq!(result_of(&content, None), json!({"sum": 3}));
        let prose = json!([{"type": "text", "text": "Echo: hi"}, {"type": "text", "text": "more"}]);
        assert_eq!(result_of(&prose, None), json!("Echo: hi\nmore"));
        let image = json!([{"type": "image", "data": "...", "mimeType": "image/png"}]);
        assert_eq!(result_of(&image, None), Value::Null);
    }

    #[test]
    fn a_secret_in_a_result_never_reaches_the_reply() {
        let secrets = Secrets::new(&["sk-abcdef123".to_owned()]);
        let outcome = CallOutcome::Done {
            content: json!([{"type": "text", "text": "{\"KEY\": \"sk-abcdef123\"}"}]),
            structured: None,
        };
        let reply = String::from_utf8(reply_for(outcome, "s", &secrets).into_json()).unwrap();
        assert!(!reply.contains("sk-abcdef123"), "{reply}");
        assert!(reply.contains("[secret]"), "{reply}");
        let failed = CallOutcome::ToolError {
            message: "bad key sk-abcdef123".into(),
            content: json!([{"type": "text", "text": "bad key sk-abcdef123"}]),
        };
        let reply = String::from_utf8(reply_for(failed, "s", &secrets).into_json()).unwrap();
        assert!(!reply.contains("sk-abcdef123"), "{reply}");
    }

    #[test]
    fn a_result_too_big_for_a_reply_is_refused_in_words() {
        let text = "\u{1}".repeat(3 << 20); // six bytes each as JSON
        let outcome = CallOutcome::Done {
            content: json!([{"type": "text", "text": text}]),
            structured: None,
        };
        let reply: Value =
            serde_json::from_slice(&reply_for(outcome, "s", &Secrets::default()).into_json())
                .unwrap();
        assert_eq!(reply["code"], "limit_exceeded", "{}", reply["error"]);
    }
}
