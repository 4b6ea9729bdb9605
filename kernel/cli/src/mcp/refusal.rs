//! JSON-RPC errors the HTTP face answers itself, before or instead of
//! the MCP service: a body it cannot read, a session it cannot reach.

use agentos_http::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use rmcp::model::{ErrorData, JsonRpcVersion2_0, RequestId};
use serde::Serialize;

/// A JSON-RPC error answering a request.
#[derive(Serialize)]
struct JsonRpcRefusal {
    jsonrpc: JsonRpcVersion2_0,
    id: Option<RequestId>,
    error: ErrorData,
}

/// A JSON-RPC error answering request `id` (null when its own is not to
/// be had), with HTTP `status`.
pub fn refusal(status: StatusCode, id: Option<RequestId>, error: ErrorData) -> Response<Body> {
    let refusal = JsonRpcRefusal {
        jsonrpc: JsonRpcVersion2_0,
        id,
        error,
    };
    // Nothing in it can fail to serialise; an empty body says as much
    // as the status does, should it ever.
    let json = serde_json::to_vec(&refusal).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(json)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
