//! The face's one service: every request on an admitted connection comes
//! here, is told apart by its headers (a sandbox's requests carry
//! `E2b-Sandbox-Id`), proven by its key, and answered.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentos_http::fleet::GREETING_PATH;
use agentos_http::{forward, Body, RequestBody};
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Limited};

use crate::answer::no_content;
use crate::answer::ApiError;
use crate::control::{self, Control};
use crate::face::Face;
use crate::fleet::{self, Holder};
use crate::sandbox_api::{self, SANDBOX_ID_HEADER};
use crate::tenant::Tenant;

/// The face as a service of requests.
#[derive(Debug, Clone)]
pub struct E2bService {
    face: Arc<Face>,
}

impl E2bService {
    pub fn new(face: Arc<Face>) -> E2bService {
        E2bService { face }
    }
}

impl tower_service::Service<Request<RequestBody>> for E2bService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let face = self.face.clone();
        Box::pin(async move { Ok(answer(&face, request).await) })
    }
}

/// The answer to one request; to another node's proven forward, with the
/// proof that this node answered it.
async fn answer(face: &Face, request: Request<RequestBody>) -> Response<Body> {
    let sandbox = sandbox_named(&request).map(str::to_owned);
    let forward = match proven_forward(face, &request, sandbox.as_deref()) {
        Ok(forward) => forward,
        Err(refused) => return refused.into_response(),
    };
    let mut response = if forward.is_some() && request.uri().path() == GREETING_PATH {
        no_content()
    } else {
        answer_here_or_there(face, request, sandbox, forward.is_some()).await
    };
    if let (Some(signature), Some(fleet)) = (forward, &face.fleet) {
        fleet.prove_answer(response.headers_mut(), &signature);
    }
    response
}

/// The answer to a request: here, or, for another node's sandbox (unless
/// it was `forwarded` here), by that node's face.
async fn answer_here_or_there(
    face: &Face,
    request: Request<RequestBody>,
    sandbox: Option<String>,
    forwarded: bool,
) -> Response<Body> {
    // A node's forward names this face by the address its node
    // advertises, which need not be one a browser would use.
    if !forwarded {
        if let Some(refused) = refuse_host(face, request.headers()) {
            return refused.into_response();
        }
    }
    if let (false, Some(fleet), Some(sandbox)) = (forwarded, &face.fleet, &sandbox) {
        match fleet::holder(fleet, &face.kernel, sandbox).await {
            Ok(Holder::There(peer)) => {
                let request = request.map(Either::Left);
                return match forward::relay(fleet, &peer, ("sandbox", sandbox), request).await {
                    Ok(answer) => answer,
                    Err(_) => ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "sandbox {sandbox} is on another node of the fleet, which cannot be \
                             reached now"
                        ),
                    )
                    .into_response(),
                };
            }
            Ok(Holder::Here) => {}
            Err(err) => return err.into_response(),
        }
    }
    if request.headers().contains_key(SANDBOX_ID_HEADER) {
        return sandbox_api::answer(face, request).await;
    }
    let signed_files = request.uri().path() == "/files"
        && request
            .uri()
            .query()
            .is_some_and(|query| query.contains("signature="));
    if signed_files {
        return sandbox_api::answer_signed(face, request).await;
    }
    let tenant = match tenant_of(face, request.headers()) {
        Ok(tenant) => tenant,
        Err(err) => return err.into_response(),
    };
    let (parts, body) = request.into_parts();
    // The face's bound on a control request's body; a create is well
    // under it.
    let most = face.site.max_body_bytes;
    let body = match Limited::new(body, most).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a request body may be at most {most} bytes"),
            )
            .into_response()
        }
        Err(err) => {
            return ApiError::bad_request(format!("reading the request body: {err}"))
                .into_response()
        }
    };
    let control = Control { face, tenant };
    let path = parts.uri.path();
    let query = parts.uri.query().unwrap_or("");
    control::answer(&control, &parts.method, path, query, &parts.headers, body).await
}

/// The sandbox a request is for: a sandbox API request's
/// `E2b-Sandbox-Id`, or the one a control request's path names.
fn sandbox_named(request: &Request<RequestBody>) -> Option<&str> {
    if request.headers().contains_key(SANDBOX_ID_HEADER) {
        let mut ids = request.headers().get_all(SANDBOX_ID_HEADER).iter();
        return match (ids.next(), ids.next()) {
            (Some(id), None) => id.to_str().ok(),
            _ => None,
        };
    }
    control::sandbox_of(request.method(), request.uri().path())
}

/// The signature of the request if it is a forward from another node of
/// the fleet, proven; one that claims to be and is not (or reaches a face
/// with no fleet secret) is refused.
fn proven_forward(
    face: &Face,
    request: &Request<RequestBody>,
    sandbox: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let target = agentos_http::fleet::target_of(request.uri());
    agentos_http::fleet::proven_forward(
        face.fleet.as_ref(),
        request.headers(),
        request.method(),
        target,
        sandbox.unwrap_or(""),
    )
    .map_err(|unproven| ApiError::new(StatusCode::FORBIDDEN, unproven.to_string()))
}

/// A 401 unless the request carries one `X-API-KEY` the face knows.
fn tenant_of(face: &Face, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    let mut values = headers.get_all("x-api-key").iter();
    let key = match (values.next(), values.next()) {
        (Some(key), None) => key,
        (None, _) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "send the API key in X-API-KEY",
            ))
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "send one X-API-KEY header",
            ))
        }
    };
    let delegate = face
        .keys
        .delegate_of(key.as_bytes())
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "Invalid API key"))?;
    Ok(Tenant::new(&face.kernel, delegate))
}

/// A 403 for a `Host` the face does not answer to: a page of another
/// site in the user's browser could otherwise reach a loopback face by a
/// name that resolves to 127.0.0.1 (DNS rebinding).
fn refuse_host(face: &Face, headers: &HeaderMap) -> Option<ApiError> {
    let allowed = &face.site.allowed_hosts;
    if allowed.is_empty() {
        return None;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    if allowed
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(name))
    {
        return None;
    }
    Some(ApiError::new(
        StatusCode::FORBIDDEN,
        format!("Host {host:?} is not one this face answers to; start it with --allow-host"),
    ))
}
