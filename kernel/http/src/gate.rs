//! What every request passes before the face's service sees it. For a
//! face with a bearer token: the one path, the token, the connection's
//! owner, and the size of its body. For a face that proves its callers
//! itself: the connection's owner, when it serves one user only.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use tower_service::Service;

use crate::connections::Place;
use crate::fleet::{target_of, FleetFace, GREETING_PATH};
use crate::guard::{Ends, Guard};
use crate::plan::Face;
use crate::request_body::RequestBody;
use crate::token::Token;

/// A response's body, as the gate and the services behind it write it.
pub type Body = BoxBody<Bytes, Infallible>;

/// Answers a request that came on the connection with these `ends`,
/// holding `place` among its client's connections.
pub trait Handle: Send + Sync + 'static {
    fn handle(
        &self,
        request: Request<RequestBody>,
        ends: Ends,
        place: &Place,
    ) -> impl Future<Output = Response<Body>> + Send;
}

/// The gate in front of one face's service `S`.
#[derive(Debug)]
pub struct Gate<S> {
    pub service: S,
    pub face: Face,
    pub token: Token,
    pub guard: Arc<Guard>,
    pub fleet: Option<Arc<FleetFace>>,
}

impl<S> Handle for Gate<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    async fn handle(
        &self,
        request: Request<RequestBody>,
        ends: Ends,
        place: &Place,
    ) -> Response<Body> {
        let face = &self.face;
        if let (Some(fleet), GREETING_PATH) = (&self.fleet, request.uri().path()) {
            return greeting(fleet, &request);
        }
        if request.uri().path() != face.path {
            return plain(
                StatusCode::NOT_FOUND,
                format!(
                    "Not Found: {} is served at {}",
                    face.name.to_ascii_uppercase(),
                    face.path
                ),
            );
        }
        if let Some(refusal) = self.refuse_unauthorized(&request) {
            return refusal;
        }
        place.prove();
        if let Some(refusal) = self.guard.refuse_other_users(ends).await {
            return plain(StatusCode::FORBIDDEN, refusal);
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, face.max_body_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.is::<http_body_util::LengthLimitError>() => {
                return plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "Payload Too Large: a request may be at most {} bytes",
                        face.max_body_bytes
                    ),
                );
            }
            Err(err) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    format!("Bad Request: reading the body: {err}"),
                )
            }
        };
        call(
            self.service.clone(),
            Request::from_parts(parts, Full::new(body)),
        )
        .await
    }
}

impl<S> Gate<S> {
    /// A 401 unless the request carries the token.
    fn refuse_unauthorized<B>(&self, request: &Request<B>) -> Option<Response<Body>> {
        let mut values = request.headers().get_all(header::AUTHORIZATION).iter();
        let presented = match (values.next(), values.next()) {
            (Some(value), None) => bearer_credentials(value),
            _ => None,
        };
        let realm = format!(r#"Bearer realm="agentos {}""#, self.face.name);
        let challenge = match presented {
            Some(presented) if self.token.matches(presented) => return None,
            Some(_) => format!(r#"{realm}, error="invalid_token""#),
            None => realm,
        };
        let mut response = plain(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: send Authorization: Bearer <token>".to_owned(),
        );
        // A face's name is a plain word, so the challenge is a valid
        // header value; should it not be, the 401 goes without it.
        if let Ok(challenge) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        Some(response)
    }
}

/// The gate in front of a face that proves its callers itself.
#[derive(Debug)]
pub struct KeyedGate<S> {
    pub service: S,
    pub guard: Arc<Guard>,
}

impl<S> Handle for KeyedGate<S>
where
    S: Service<Request<RequestBody>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    async fn handle(
        &self,
        request: Request<RequestBody>,
        ends: Ends,
        place: &Place,
    ) -> Response<Body> {
        if let Some(refusal) = self.guard.refuse_other_users(ends).await {
            return plain(StatusCode::FORBIDDEN, refusal);
        }
        let response = call(self.service.clone(), request).await;
        // The face answered with something other than a refusal of its
        // caller: the connection carried credentials it knows.
        if !matches!(
            response.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            place.prove();
        }
        response
    }
}

/// `service`'s answer to `request`.
async fn call<S, B>(mut service: S, request: Request<B>) -> Response<Body>
where
    S: Service<Request<B>, Response = Response<Body>, Error = Infallible>,
{
    let answered = match poll_fn(|context| service.poll_ready(context)).await {
        Ok(()) => service.call(request).await,
        Err(never) => Err(never),
    };
    match answered {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The answer to another node's greeting, which carries no token: proven,
/// an empty one proving this node in turn; else 403.
fn greeting<B>(fleet: &FleetFace, request: &Request<B>) -> Response<Body> {
    let target = target_of(request.uri());
    match fleet.proven_forward(request.headers(), request.method(), target, "") {
        Ok(Some(signature)) => {
            let mut response = Response::new(Full::new(Bytes::new()).boxed());
            *response.status_mut() = StatusCode::NO_CONTENT;
            fleet.prove_answer(response.headers_mut(), &signature);
            response
        }
        Ok(None) => plain(
            StatusCode::FORBIDDEN,
            "Forbidden: a greeting is between the fleet's nodes".to_owned(),
        ),
        Err(unproven) => plain(StatusCode::FORBIDDEN, format!("Forbidden: {unproven}")),
    }
}

/// The credentials of `Authorization: Bearer <credentials>`.
fn bearer_credentials(value: &HeaderValue) -> Option<&[u8]> {
    let value = value.as_bytes();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(value[7..].trim_ascii())
}

/// A plain-text response.
pub fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(text)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_credentials_need_the_scheme() {
        let value = HeaderValue::from_static("bearer abc");
        assert_eq!(bearer_credentials(&value), Some(&b"abc"[..]));
        let value = HeaderValue::from_static("Basic abc");
        assert_eq!(bearer_credentials(&value), None);
    }
}
