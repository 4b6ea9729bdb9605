//! `agentos mcp --http` on a node of a fleet (docs/fleet.md, "Sessions
//! through any node's MCP face"): a tool call's `session` may name its
//! node, `NAME@NODE`. One naming this node is served here as session
//! `NAME`; one naming another node is forwarded, whole, to that node's face
//! ([`agentos_http::forward`]), which serves it as its own and proves its
//! answer. A proven forward is answered where it lands: naming a node
//! other than this one, it is refused, never sent on.
//!
//! A forward's signature covers the session and the whole body (its
//! SHA-256), so a proof cannot be replayed with another message. The
//! client's bearer token goes with it and is checked by the face it
//! reaches, so the nodes' faces share their token, and every node's face
//! acts as the user who runs it there.

use agentos_http::fleet::{FleetFace, Wanted};
use agentos_http::{forward, Body};
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use rmcp::model::{ErrorData, RequestId};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::kernel::KernelLink;
use super::refusal::refusal;

/// The part of a message this module reads: a tool call's `session`.
#[derive(Deserialize)]
struct Message {
    id: Option<RequestId>,
    method: Option<String>,
    params: Option<Params>,
}

#[derive(Deserialize)]
struct Params {
    arguments: Option<Arguments>,
}

#[derive(Deserialize)]
struct Arguments {
    session: Option<Value>,
}

/// The `session` a `tools/call` message names, if it names one as a
/// string: what a forward of it is signed for.
pub fn session_named(body: &[u8]) -> Option<String> {
    let message: Message = serde_json::from_slice(body).ok()?;
    if message.method.as_deref() != Some("tools/call") {
        return None;
    }
    match message.params?.arguments?.session? {
        Value::String(session) => Some(session),
        _ => None,
    }
}

/// Where a request goes.
#[derive(Debug)]
pub enum Routed {
    /// Served here.
    Here(Request<Full<Bytes>>),
    /// Answered: by another node's face, or refused.
    Answered(Response<Body>),
}

/// What a forward of the message `body`, whose tool call names `session`,
/// is signed for: the session, and the body's SHA-256.
pub fn subject(session: Option<&str>, body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{} sha256:{hex}", session.unwrap_or(""))
}

/// The request to serve here, its session's `@NODE` taken off when it
/// names this node; or the answer, when another node's face answered it
/// or it is refused. `session` is what the message's tool call names,
/// `subject` what a forward of it is signed for; `forwarded`, that
/// another node's face sent it, proven.
pub async fn route(
    fleet: Option<&FleetFace>,
    kernel: &KernelLink,
    (parts, body): (Parts, Bytes),
    (session, subject): (Option<&str>, &str),
    forwarded: bool,
) -> Routed {
    let (Some(fleet), Some(session)) = (fleet, session) else {
        return Routed::Here(Request::from_parts(parts, Full::new(body)));
    };
    let Some((name, node)) = session.rsplit_once('@') else {
        return Routed::Here(Request::from_parts(parts, Full::new(body)));
    };
    let id = || {
        serde_json::from_slice::<Message>(&body)
            .ok()
            .and_then(|m| m.id)
    };
    let refused = |status, error| Routed::Answered(refusal(status, id(), error));
    if node == fleet.node() {
        let body = without_node(&body, name).unwrap_or(body);
        return Routed::Here(Request::from_parts(parts, Full::new(body)));
    }
    if forwarded {
        let error = format!(
            "session {session:?} is not on node {} (a forward is answered where it lands, never \
             sent on)",
            fleet.node()
        );
        return refused(
            StatusCode::NOT_FOUND,
            ErrorData::invalid_params(error, None),
        );
    }
    let peer = match fleet.peer(kernel, Wanted::Named(node)).await {
        Ok(Some(peer)) => peer,
        Ok(None) => {
            let error = format!(
                "argument session: {session:?} names node {node:?}, which is not another node of \
                 this fleet (`agentos nodes` lists them; this one is {})",
                fleet.node()
            );
            return refused(StatusCode::OK, ErrorData::invalid_params(error, None));
        }
        Err(err) => {
            let error = format!("session {session:?}: the fleet's nodes cannot be told now: {err}");
            let error = ErrorData::internal_error(error, None);
            return refused(StatusCode::SERVICE_UNAVAILABLE, error);
        }
    };
    let relayed = Request::from_parts(parts, Either::Right(Full::new(body.clone())));
    match forward::relay(fleet, &peer, ("session", subject), relayed).await {
        Ok(answer) => Routed::Answered(answer),
        Err(_) => {
            let error = format!(
                "session {session:?} is on another node of the fleet, which cannot be reached now"
            );
            refused(
                StatusCode::BAD_GATEWAY,
                ErrorData::internal_error(error, None),
            )
        }
    }
}

/// `body` with its tool call's session `name` alone.
fn without_node(body: &[u8], name: &str) -> Option<Bytes> {
    let mut message: Value = serde_json::from_slice(body).ok()?;
    let session = message.pointer_mut("/params/arguments/session")?;
    *session = Value::String(name.to_owned());
    serde_json::to_vec(&message).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tool_calls_string_session_is_read() {
        let call = |session: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"exec",
                "arguments":{{"code":"print(1)","session":{session}}}}}}}"#
            )
        };
        assert_eq!(
            session_named(call(r#""s1@n2""#).as_bytes()).as_deref(),
            Some("s1@n2")
        );
        assert_eq!(session_named(call("7").as_bytes()), None);
        let listing = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"arguments":{"session":"s@n"}}}"#;
        assert_eq!(session_named(listing.as_bytes()), None);
    }

    #[test]
    fn this_nodes_name_is_taken_off_and_nothing_else_changes() {
        let body = br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"exec","arguments":{"code":"x@y","session":"s1@n1"}}}"#;
        let served: Value = serde_json::from_slice(&without_node(body, "s1").unwrap()).unwrap();
        assert_eq!(served["params"]["arguments"]["session"], "s1");
        assert_eq!(served["params"]["arguments"]["code"], "x@y");
        assert_eq!(served["id"], "a");
    }
}
