//! A THINK's `chat {model}` span, as the GenAI semantic conventions have
//! an inference span: opened when the THINK is queued, ended when it is
//! answered or fails. The conversation goes in only when the tracer
//! records content, in the conventions' message shape.

use serde::Serialize;

use super::provider::{Chat, Completion, Failure};
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;

/// One part of a message: its text.
#[derive(Debug, Serialize)]
struct Part<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    content: &'a str,
}

impl Part<'_> {
    fn text(content: &str) -> Part<'_> {
        Part {
            kind: "text",
            content,
        }
    }
}

/// A message of the conversation.
#[derive(Debug, Serialize)]
struct InputMessage<'a> {
    role: &'a str,
    parts: [Part<'a>; 1],
}

/// The model's answer.
#[derive(Debug, Serialize)]
struct OutputMessage<'a> {
    role: &'static str,
    parts: [Part<'a>; 1],
    finish_reason: &'a str,
}

/// `value` as a span attribute's JSON text.
fn json_text(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("messages of strings always serialise")
}

/// A `chat {model}` span for `chat`, sent to `provider`, under `parent`,
/// with tracing on.
pub fn open_chat_span(
    tracer: &Tracer,
    provider: &str,
    chat: &Chat,
    parent: Option<&TraceContext>,
    agent: Option<&SpanAgent>,
) -> Option<OpenSpan> {
    let name = format!("chat {}", chat.model);
    let mut span = tracer.open(name, SpanKind::Client, parent)?;
    span.agent(agent);
    span.text("gen_ai.operation.name", "chat");
    span.text("gen_ai.provider.name", provider);
    span.text("gen_ai.request.model", chat.model.clone());
    span.int("gen_ai.request.max_tokens", i64::from(chat.max_tokens));
    if let Some(temperature) = chat.temperature {
        span.float("gen_ai.request.temperature", temperature);
    }
    if tracer.record_content {
        if let Some(system) = &chat.system {
            let parts = [Part::text(system)];
            span.text("gen_ai.system_instructions", json_text(&parts));
        }
        let messages: Vec<InputMessage<'_>> = chat
            .messages
            .iter()
            .map(|m| InputMessage {
                role: &m.role,
                parts: [Part::text(&m.content)],
            })
            .collect();
        span.text("gen_ai.input.messages", json_text(&messages));
    }
    Some(span)
}

/// Ends a THINK's span with what came of it, after `queue_ms` in the
/// queue.
pub fn end_chat_span(
    tracer: &Tracer,
    mut span: OpenSpan,
    result: &Result<Completion, Failure>,
    queue_ms: u64,
) {
    span.int("agentos.think.queue_ms", queue_ms as i64);
    let error = match result {
        Ok(completion) => {
            span.text("gen_ai.response.model", completion.model.clone());
            if let Some(reason) = &completion.finish_reason {
                span.texts("gen_ai.response.finish_reasons", &[reason]);
            }
            span.int(
                "gen_ai.usage.input_tokens",
                completion.usage.prompt_tokens as i64,
            );
            span.int(
                "gen_ai.usage.output_tokens",
                completion.usage.completion_tokens as i64,
            );
            if tracer.record_content {
                let output = [OutputMessage {
                    role: "assistant",
                    parts: [Part::text(&completion.content)],
                    finish_reason: completion.finish_reason.as_deref().unwrap_or(""),
                }];
                span.text("gen_ai.output.messages", json_text(&output));
            }
            None
        }
        Err(failure) => {
            span.text("error.type", failure.code.as_str());
            Some(failure.message.clone())
        }
    };
    tracer.end(span, error);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn messages_are_in_the_conventions_shape() {
        let parts = [Part::text("be brief")];
        let expected = json!([{"type": "text", "content": "be brief"}]);
        assert_eq!(json_text(&parts), expected.to_string());
        let messages = [InputMessage {
            role: "user",
            parts: [Part::text("say \"hi\"\n")],
        }];
        let expected = json!([{
            "role": "user",
            "parts": [{"type": "text", "content": "say \"hi\"\n"}],
        }]);
        assert_eq!(json_text(&messages), expected.to_string());
        let output = [OutputMessage {
            role: "assistant",
            parts: [Part::text("hi")],
            finish_reason: "stop",
        }];
        let expected = json!([{
            "role": "assistant",
            "parts": [{"type": "text", "content": "hi"}],
            "finish_reason": "stop",
        }]);
        assert_eq!(json_text(&output), expected.to_string());
    }
}
