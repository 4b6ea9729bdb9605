//! E2B's control API (`E2B_API_URL`): sandboxes made, listed, read,
//! ended, timed, paused and connected to, each a session of the calling
//! key's delegate.

pub mod context;
pub mod create;
pub mod lifecycle;
pub mod list;
pub mod metrics;
pub mod shapes;

use agentos_http::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use serde::de::DeserializeOwned;

pub use self::context::Control;
use self::lifecycle::{ConnectBody, PauseBody, TimeoutBody};
use self::list::ListQuery;
use self::metrics::Range;
use crate::answer::{json, no_content, ApiError};

/// The longest sandbox id taken from a path; E2B's are 20 characters.
const MAX_SANDBOX_ID_LEN: usize = 64;

/// Which route a request is.
enum Route<'p> {
    Create,
    List,
    Connect(&'p str),
    Detail(&'p str),
    Kill(&'p str),
    Timeout(&'p str),
    Pause(&'p str),
    Metrics(&'p str),
    ManyMetrics,
}

/// The route `method` and `path` name, if any.
fn route<'p>(method: &Method, path: &'p str) -> Option<Route<'p>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let route = match (method, parts.as_slice()) {
        (&Method::POST, ["v2", "sandboxes"]) => Route::Create,
        (&Method::GET, ["v2", "sandboxes"]) => Route::List,
        (&Method::POST, ["v2", "sandboxes", id, "connect"]) => Route::Connect(id),
        (&Method::GET, ["sandboxes", "metrics"]) => Route::ManyMetrics,
        (&Method::GET, ["sandboxes", id]) => Route::Detail(id),
        (&Method::DELETE, ["sandboxes", id]) => Route::Kill(id),
        (&Method::POST, ["sandboxes", id, "timeout"]) => Route::Timeout(id),
        (&Method::POST, ["sandboxes", id, "pause"]) => Route::Pause(id),
        (&Method::GET, ["sandboxes", id, "metrics"]) => Route::Metrics(id),
        _ => return None,
    };
    Some(route)
}

/// The sandbox a control request names, if it names one.
pub fn sandbox_of<'p>(method: &Method, path: &'p str) -> Option<&'p str> {
    match route(method, path)? {
        Route::Connect(id)
        | Route::Detail(id)
        | Route::Kill(id)
        | Route::Timeout(id)
        | Route::Pause(id)
        | Route::Metrics(id) => Some(id),
        Route::Create | Route::List | Route::ManyMetrics => None,
    }
}

/// A sandbox id as a path gives it: one a session could be named, or
/// none (a 404, as for an id that names nothing).
fn sandbox_id(id: &str) -> Result<&str, ApiError> {
    let fits = !id.is_empty()
        && id.len() <= MAX_SANDBOX_ID_LEN
        && id
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit());
    if !fits {
        return Err(ApiError::not_found(id));
    }
    Ok(id)
}

/// A JSON body read as `T`; an empty one is `T`'s default where it has
/// one (connect and pause may come with none).
fn body_of<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    crate::answer::json_or_empty(body)
        .map_err(|err| ApiError::bad_request(format!("the request body: {err}")))
}

/// The answer to a control request of the tenant's.
pub async fn answer(
    cx: &Control<'_>,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let Some(route) = route(method, path) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("{method} {path} is not a route of agentos e2b"),
        )
        .into_response();
    };
    let answered = match route {
        Route::Create => create::create_once(cx, headers, &body).await,
        Route::List => match ListQuery::parse(query) {
            Ok(asked) => list::list(cx, &asked).await.map(|(page, next)| {
                let mut response = json(StatusCode::OK, &page);
                if let Some(next) = next.and_then(|next| next.parse().ok()) {
                    response.headers_mut().insert("x-next-token", next);
                }
                response
            }),
            Err(err) => Err(err),
        },
        Route::Connect(id) => match (sandbox_id(id), body_of::<ConnectBody>(&body)) {
            (Ok(id), Ok(asked)) => lifecycle::connect(cx, id, asked)
                .await
                .map(|(status, access)| json(status, &access)),
            (Err(err), _) | (_, Err(err)) => Err(err),
        },
        Route::Detail(id) => match sandbox_id(id) {
            Ok(id) => lifecycle::detail(cx, id)
                .await
                .map(|detail| json(StatusCode::OK, &detail)),
            Err(err) => Err(err),
        },
        Route::Kill(id) => match sandbox_id(id) {
            Ok(id) => lifecycle::kill(cx, id).await.map(|()| no_content()),
            Err(err) => Err(err),
        },
        Route::Timeout(id) => match (sandbox_id(id), body_of::<TimeoutBody>(&body)) {
            (Ok(id), Ok(asked)) => lifecycle::set_timeout(cx, id, asked)
                .await
                .map(|()| no_content()),
            (Err(err), _) | (_, Err(err)) => Err(err),
        },
        Route::Pause(id) => match (sandbox_id(id), body_of::<PauseBody>(&body)) {
            (Ok(id), Ok(asked)) => lifecycle::pause(cx, id, asked).await.map(|()| no_content()),
            (Err(err), _) | (_, Err(err)) => Err(err),
        },
        Route::Metrics(id) => match (sandbox_id(id), Range::parse(query)) {
            (Ok(id), Ok(range)) => metrics::of_sandbox(cx, id, &range)
                .await
                .map(|samples| json(StatusCode::OK, &samples)),
            (Err(err), _) | (_, Err(err)) => Err(err),
        },
        Route::ManyMetrics => metrics::of_sandboxes(cx, query)
            .await
            .map(|samples| json(StatusCode::OK, &samples)),
    };
    answered.unwrap_or_else(ApiError::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_the_sdks_and_ids_are_lower_case_letters_and_digits() {
        assert!(matches!(
            route(&Method::POST, "/v2/sandboxes"),
            Some(Route::Create)
        ));
        assert!(matches!(
            route(&Method::POST, "/v2/sandboxes/abc/connect"),
            Some(Route::Connect("abc"))
        ));
        assert!(matches!(
            route(&Method::DELETE, "/sandboxes/abc"),
            Some(Route::Kill("abc"))
        ));
        assert!(route(&Method::PUT, "/sandboxes/abc").is_none());
        assert!(route(&Method::GET, "/sandboxes/abc/logs").is_none());
        assert!(route(&Method::GET, "/v2/sandboxes/").is_none());
        for bad in ["", "ABC", "a.b", "..", "a%2Fb", &"a".repeat(65)] {
            assert_eq!(
                sandbox_id(bad).unwrap_err().status,
                StatusCode::NOT_FOUND,
                "{bad}"
            );
        }
        assert!(body_of::<PauseBody>(b"").is_ok());
        assert!(body_of::<PauseBody>(b"{\"colour\":1}").is_err());
    }
}
