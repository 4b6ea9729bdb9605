//! A THINK request: who asks, the provider-neutral chat the call threads
//! send, and the request while it waits and while it is at the provider.

use std::time::Instant;

use agentos_proto::payload::{ChatMessage, ThinkRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::connection::Connection;
use super::provider::Chat;
use super::quota::{Paid, Priced};
use super::reload::Limits;
use super::scheduler::FlowId;
use crate::address::ReplyTo;
use crate::config::llm::ProviderKind;
use crate::permissions::Budget;
use crate::telemetry::tracer::{OpenSpan, SpanAgent};

/// Who is asking, as the kernel knows them.
#[derive(Clone, Debug)]
pub struct Asker {
    /// The caller's identity id: its flow in the fair queue.
    pub id: u32,
    /// Its fair-queueing weight.
    pub weight: u32,
    /// The budgets it draws on: its own, if it has one, then its
    /// ancestors'. Every token it uses is charged to each.
    pub budgets: Vec<Budget>,
    /// The agent whose work it is, for the span.
    pub agent: Option<SpanAgent>,
    /// The principal whose `[llm.quota]` it spends, as every node names
    /// it: an operator or a delegate, never an agent.
    pub quota: Option<String>,
}

/// A THINK waiting in the queue, or held for its principal's quota.
#[derive(Debug)]
pub struct Pending {
    /// Its caller's flow in the fair queue, and weight.
    pub flow: FlowId,
    pub weight: u32,
    /// The owners of the budgets it is charged to.
    pub budgets: Vec<u32>,
    /// What it set aside in them.
    pub reserved: u64,
    pub prompt_tokens: u64,
    /// What it paid of its principal's quota.
    pub paid: Option<Paid>,
    /// Where the answer goes; its connection's closing drops the request.
    pub reply_to: ReplyTo,
    pub chat: Chat,
    /// The request named no model: the one configured when it is sent
    /// goes (a reload may change it while the request waits).
    pub default_model: bool,
    pub enqueued: Instant,
    pub deadline: Instant,
    /// Its `chat {model}` span, with tracing on.
    pub span: Option<OpenSpan>,
}

impl Priced for Pending {
    fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    fn max_tokens(&mut self) -> &mut u32 {
        &mut self.chat.max_tokens
    }
}

/// A THINK at the provider.
#[derive(Debug)]
pub struct InFlight {
    pub flow: FlowId,
    pub budgets: Vec<u32>,
    pub paid: Option<Paid>,
    pub reply_to: ReplyTo,
    pub estimate: u64,
    pub prompt_estimate: u64,
    pub queue_ms: u64,
    /// When it was handed to a call thread.
    pub sent: Instant,
    pub model: String,
    /// The provider it went to (see [`Connection::generation`]).
    pub generation: u64,
    /// Its `chat {model}` span, with tracing on.
    pub span: Option<OpenSpan>,
}

/// The provider-neutral request, with the kernel's defaults and limits
/// applied and the model checked against what `connection` serves.
pub fn chat_for(
    limits: &Limits,
    connection: &Connection,
    request: ThinkRequest,
) -> Result<Chat, ErrorReply> {
    let max_tokens = request.max_tokens.unwrap_or(limits.default_max_tokens);
    if max_tokens > limits.max_tokens_limit {
        return Err(ErrorReply::new(
            ErrorCode::LimitExceeded,
            format!(
                "THINK field `max_tokens` is {max_tokens}, outside the allowed range \
                 1..={}",
                limits.max_tokens_limit
            ),
        ));
    }
    if let Some(asked) = &request.model {
        connection.check_served(asked)?;
    }
    let mut messages = request.messages.unwrap_or_default();
    if let Some(prompt) = request.prompt.filter(|p| !p.trim().is_empty()) {
        messages.push(ChatMessage {
            role: "user".into(),
            content: prompt,
        });
    }
    Ok(Chat {
        // The local model under the name it is served by, however the
        // request spelt it.
        model: match request.model {
            Some(model) if connection.kind() != ProviderKind::Local => model,
            _ => connection.model().to_owned(),
        },
        system: request.system,
        messages,
        max_tokens,
        temperature: request.temperature,
        stop: request.stop,
    })
}
