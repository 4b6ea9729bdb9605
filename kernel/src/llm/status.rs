//! What THINK says of itself: HELLO's `llm` — ready, the local model
//! starting, the provider not answering or unreachable since when, or
//! unavailable and why —
//! read from the connection, which each finished call keeps up to date.

use agentos_proto::payload::LlmInfo;

use super::connection::Connection;
use super::ledger::Use;
use crate::clock::rfc3339;

/// What HELLO says about THINK over `connection`, having answered `total`.
pub fn info(connection: &Connection, total: Use) -> LlmInfo {
    let local = connection.local();
    let starting = local.is_some_and(|local| !local.is_ready());
    let refused = local.and_then(|local| local.refusal());
    let unreachable = connection.unreachable();
    let (state, reason) = if let Some(reason) = connection.unavailable() {
        ("unavailable", Some(reason.to_owned()))
    } else if let Some(reason) = refused {
        (
            "unavailable",
            Some(format!("the local model will not be served: {reason}")),
        )
    } else if starting {
        ("starting", Some("the local model is loading".to_owned()))
    } else if let Some((since, what)) = connection.not_answering() {
        (
            "not_answering",
            Some(format!("not answering since {}: {what}", rfc3339(*since))),
        )
    } else if let Some((since, error)) = unreachable {
        (
            "unreachable",
            Some(format!("unreachable since {}: {error}", rfc3339(*since))),
        )
    } else {
        ("ready", None)
    };
    LlmInfo {
        provider: connection.kind().as_str().to_owned(),
        model: connection.model().to_owned(),
        ready: state == "ready",
        reason,
        state: Some(state.to_owned()),
        unreachable_since: unreachable.map(|(since, _)| rfc3339(*since)),
        last_error: unreachable.map(|(_, error)| error.clone()),
        calls: total.calls,
        tokens: total.tokens,
    }
}
