//! What THINK says of itself: HELLO's `llm` (ready, the local model
//! starting, the provider unreachable since when, or unavailable and why),
//! kept up to date by each finished call; and the model names the local
//! provider answers to.

use std::time::SystemTime;

use agentos_proto::payload::LlmInfo;
use agentos_proto::{ErrorCode, ErrorReply};

use super::call::CallDone;
use super::provider;
use super::Llm;
use crate::clock::rfc3339;
use crate::config::llm::ProviderKind;

impl Llm {
    /// What HELLO says about THINK.
    pub fn info(&self) -> LlmInfo {
        let starting = self.local.as_ref().is_some_and(|local| !local.is_ready());
        let refused = self.local.as_ref().and_then(|local| local.refusal());
        let (state, reason) = if let Some(reason) = &self.unavailable {
            ("unavailable", Some(reason.clone()))
        } else if let Some(reason) = refused {
            (
                "unavailable",
                Some(format!("the local model will not be served: {reason}")),
            )
        } else if starting {
            ("starting", Some("the local model is loading".to_owned()))
        } else if let Some((since, error)) = &self.unreachable {
            (
                "unreachable",
                Some(format!("unreachable since {}: {error}", rfc3339(*since))),
            )
        } else {
            ("ready", None)
        };
        LlmInfo {
            provider: self.kind.as_str().to_owned(),
            model: self.model.clone(),
            ready: state == "ready",
            reason,
            state: Some(state.to_owned()),
            unreachable_since: self.unreachable.as_ref().map(|(since, _)| rfc3339(*since)),
            last_error: self.unreachable.as_ref().map(|(_, error)| error.clone()),
            calls: self.total.calls,
            tokens: self.total.tokens,
        }
    }

    /// Keeps HELLO's word on whether the provider can be reached: a call
    /// that could not connect marks it unreachable (from the first such
    /// call on), an answered call marks it reachable again.
    pub(super) fn note_reachability(&mut self, done: &CallDone) {
        match &done.result {
            Ok(_) => {
                if let Some((since, _)) = self.unreachable.take() {
                    log::info!(
                        "THINK: the provider answers again (unreachable since {})",
                        rfc3339(since)
                    );
                }
            }
            Err(failure) if done.unreachable => {
                let since = self
                    .unreachable
                    .as_ref()
                    .map_or_else(SystemTime::now, |(since, _)| *since);
                if self.unreachable.is_none() {
                    log::warn!("THINK: the provider is unreachable: {}", failure.message);
                }
                self.unreachable = Some((since, failure.message.clone()));
            }
            Err(_) => {}
        }
    }

    /// Refuses a model the kernel's own local model server does not serve:
    /// it would answer with its one model whatever the name, and the
    /// caller would take the answer for another model's. A remote provider
    /// judges the names itself (an unknown one is its 404).
    pub(super) fn check_served(&self, asked: &str) -> Result<(), ErrorReply> {
        if self.kind != ProviderKind::Local || asked.eq_ignore_ascii_case(&self.model) {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorCode::BadRequest,
            format!(
                "THINK field `model`: the local provider serves only {} (asked for {:?}); \
                 leave `model` out, or configure a provider that serves it \
                 (AGENTOS_LLM_PROVIDER, llm.provider)",
                self.model,
                provider::shorten(asked, 100)
            ),
        ))
    }
}
