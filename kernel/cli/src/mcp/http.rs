//! `agentos mcp --http`: MCP's Streamable HTTP transport, served behind
//! the HTTP face's gate (`agentos_http`: the socket, the token, whose a
//! connection is, the size of a body).
//!
//! rmcp's `StreamableHttpService` speaks the protocol and checks the
//! `Host` and `Origin` headers; this module configures it for the site,
//! and answers a body that is no JSON-RPC message with a JSON-RPC error,
//! where rmcp would answer with a bare HTTP status.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentos_http::fleet::{proven_forward, target_of, FleetFace};
use agentos_http::{plain, Body, Face, Site};
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use rmcp::model::{ClientJsonRpcMessage, ErrorData, RequestId};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;

use super::kernel::KernelLink;
use super::refusal::refusal;
use super::routing::{self, Routed};
use super::server::AgentosServer;

/// The MCP face: its messages (`agentos mcp: ...`), its token (kept as
/// `mcp-token`, or given in `AGENTOS_MCP_TOKEN`) and its one path.
pub const FACE: Face = Face {
    name: "mcp",
    path: "/mcp",
    token_env: "AGENTOS_MCP_TOKEN",
    // The kernel takes requests up to 1 MiB by default; this leaves room
    // for JSON escaping and the envelope, and bounds what one request can
    // make the server hold.
    max_body_bytes: 4 * 1024 * 1024,
};

/// What the gate passes each request to.
#[derive(Clone)]
pub struct McpEndpoint {
    mcp: StreamableHttpService<AgentosServer, NeverSessionManager>,
    kernel: KernelLink,
    /// The face's part in its node's fleet, if it forwards.
    fleet: Option<Arc<FleetFace>>,
}

impl McpEndpoint {
    /// rmcp's service for `server`, accepting the site's hosts and
    /// origins; in a fleet, forwarding what another node's `fleet` holds.
    pub fn new(
        server: AgentosServer,
        kernel: KernelLink,
        site: &Site,
        fleet: Option<Arc<FleetFace>>,
    ) -> McpEndpoint {
        let config = StreamableHttpServerConfig::default()
            // No server-side sessions: the server keeps no state per
            // client (EXEC sessions live in the kernel, per uid), so a
            // client that never comes back costs nothing.
            .with_legacy_session_mode(false)
            .with_max_request_body_bytes(site.max_body_bytes)
            .with_cancellation_token(site.stopping.clone())
            .with_allowed_origins(site.allowed_origins.clone())
            // An empty list would otherwise mean "no Origin check".
            .enforce_origin_validation();
        let config = if site.allowed_hosts.is_empty() {
            config.disable_allowed_hosts()
        } else {
            config.with_allowed_hosts(site.allowed_hosts.clone())
        };
        let mcp = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        McpEndpoint { mcp, kernel, fleet }
    }

    /// The answer to one request; to another node's proven forward, with
    /// the proof that this node answered it.
    async fn handle(self, request: Request<Full<Bytes>>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        // Only a face in a fleet reads a call's session before serving it:
        // a forward's signature covers it, and it may name another node.
        let (session, subject) = match &self.fleet {
            Some(_) => {
                let session = routing::session_named(&body);
                let subject = routing::subject(session.as_deref(), &body);
                (session, subject)
            }
            None => (None, String::new()),
        };
        let target = target_of(&parts.uri);
        let forward = match proven_forward(
            self.fleet.as_deref(),
            &parts.headers,
            &parts.method,
            target,
            &subject,
        ) {
            Ok(forward) => forward,
            Err(unproven) => return plain(StatusCode::FORBIDDEN, format!("Forbidden: {unproven}")),
        };
        let named = (session.as_deref(), subject.as_str());
        let mut response = self
            .answer_here_or_there(parts, body, named, forward.is_some())
            .await;
        if let (Some(signature), Some(fleet)) = (forward, &self.fleet) {
            fleet.prove_answer(response.headers_mut(), &signature);
        }
        response
    }

    /// The answer to a request: here, or, for another node's session
    /// (unless it was `forwarded` here), by that node's face.
    async fn answer_here_or_there(
        &self,
        parts: Parts,
        body: Bytes,
        named: (Option<&str>, &str),
        forwarded: bool,
    ) -> Response<Body> {
        if parts.method != Method::POST {
            // GET and DELETE carry no message; rmcp answers them (a 405,
            // as there are no sessions to stream or end).
            return self
                .mcp
                .handle(Request::from_parts(parts, Full::new(body)))
                .await;
        }
        if let Some(refusal) = refuse_malformed(&body) {
            return refusal;
        }
        let fleet = self.fleet.as_deref();
        match routing::route(fleet, &self.kernel, (parts, body), named, forwarded).await {
            Routed::Here(here) => self.mcp.handle(here).await,
            Routed::Answered(answer) => answer,
        }
    }
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpEndpoint")
    }
}

impl tower_service::Service<Request<Full<Bytes>>> for McpEndpoint {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let endpoint = self.clone();
        Box::pin(async move { Ok(endpoint.handle(request).await) })
    }
}

/// A request's id, if it has a usable one, whatever else it is.
#[derive(Deserialize)]
struct RequestIdOnly {
    id: Option<RequestId>,
}

/// A JSON-RPC error for a body that is not JSON (-32700) or is JSON but
/// not one JSON-RPC message (-32600).
fn refuse_malformed(body: &[u8]) -> Option<Response<Body>> {
    let err = match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Ok(_) => return None,
        Err(err) => err,
    };
    let error = match err.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ErrorData::parse_error(format!("Parse error: the body is not JSON: {err}"), None)
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => {
            ErrorData::invalid_request(
                "Invalid Request: the body is not a JSON-RPC 2.0 request, notification or \
                 response",
                None,
            )
        }
    };
    // The id, when the body has a usable one, so the client can match
    // the error to its request.
    let id = serde_json::from_slice::<RequestIdOnly>(body)
        .ok()
        .and_then(|only| only.id);
    Some(refusal(StatusCode::BAD_REQUEST, id, error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(response: Response<Body>) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn malformed_bodies_are_json_rpc_errors() {
        let garbage = refuse_malformed(b"{not json").expect("refused");
        assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
        let said: serde_json::Value = serde_json::from_str(&body_of(garbage)).unwrap();
        assert_eq!(
            said,
            serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {
                "code": -32700,
                "message": "Parse error: the body is not JSON: key must be a string at line 1 \
                            column 2"
            }})
        );
        assert!(refuse_malformed(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).is_none());
        let no_method = refuse_malformed(br#"{"jsonrpc":"2.0","id":7}"#).expect("refused");
        let said: serde_json::Value = serde_json::from_str(&body_of(no_method)).unwrap();
        assert_eq!(said["id"], 7);
        assert_eq!(said["error"]["code"], -32600);
    }
}
