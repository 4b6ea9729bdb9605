//! The code interpreter (port 49999): `/execute` runs code in a context
//! and streams what it prints, shows and raises; `/contexts` makes,
//! lists, restarts and removes contexts. A context is a Python process
//! of the sandbox's session keeping its globals between executions.
//!
//! Its errors are plain text, as the code interpreter's are (the SDKs
//! take a 404's text as the message of their not-found error).

pub mod contexts;
pub mod execute;

use agentos_http::Body;
use agentos_http::RequestBody;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde::Serialize;
use tokio::sync::mpsc;

use self::contexts::{Context, NewContext};
use self::execute::ExecuteRequest;
use crate::envd::connect::{channel_body, ConnectError};
use crate::envd::session::Session;
use crate::face::Face;

/// The largest request body read (code to run, mostly).
const MAX_BODY_BYTES: usize = 8 << 20;
/// Answer lines held unsent for a slow client (each at most a results
/// file's 8 MiB): a slow reader holds the context back, not the face's
/// memory.
const ANSWER_BACKLOG: usize = 4;

/// A plain-text answer.
fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A JSON answer.
fn json(value: &impl Serialize) -> Response<Body> {
    crate::answer::json(StatusCode::OK, value)
}

/// A kernel refusal as the code interpreter answers errors.
fn refused(err: ConnectError) -> Response<Body> {
    text(err.status(), err.message)
}

/// The answer to a code interpreter request on `session`.
pub async fn answer(
    face: &Face,
    session: Session,
    request: Request<RequestBody>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => return text(StatusCode::BAD_REQUEST, format!("reading the body: {err}")),
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (&parts.method, segments.as_slice()) {
        (&Method::GET, ["health"]) => text(StatusCode::OK, "OK"),
        (&Method::POST, ["execute"]) => execute(face, session, &body).await,
        (&Method::GET, ["contexts"]) => match contexts::list(&session).await {
            Ok(listed) => json(&listed),
            Err(err) => refused(err),
        },
        (&Method::POST, ["contexts"]) => {
            let made = match read::<NewContext>(&body) {
                Ok(asked) => contexts::create(&session, asked).await,
                Err(err) => Err(err),
            };
            made.map_or_else(refused, |context| json(&context))
        }
        (&Method::DELETE, ["contexts", id]) => {
            let killed = match found(&session, id).await {
                Ok(context) => contexts::kill(&session, &context).await,
                Err(err) => Err(err),
            };
            killed.map_or_else(refused, |()| json(&()))
        }
        (&Method::POST, ["contexts", id, "restart"]) => {
            let restarted = match found(&session, id).await {
                Ok(context) => contexts::restart(&session, &context).await,
                Err(err) => Err(err),
            };
            restarted.map_or_else(refused, |()| json(&()))
        }
        (method, _) => text(
            StatusCode::NOT_FOUND,
            format!("{method} {path} is not a route of the code interpreter"),
        ),
    }
}

/// A JSON body as `T` (an empty one is `{}`).
fn read<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    crate::answer::json_or_empty(body)
        .map_err(|err| ConnectError::invalid(format!("the request body: {err}")))
}

/// The context `id`, or not found, worded as the code interpreter words
/// it.
async fn found(session: &Session, id: &str) -> Result<Context, ConnectError> {
    contexts::find(session, id)
        .await?
        .ok_or_else(|| ConnectError::new("not_found", format!("Context {id} not found")))
}

/// `POST /execute`: the context named, or the language's default one
/// (python's when neither is named), in its turn.
async fn execute(face: &Face, session: Session, body: &[u8]) -> Response<Body> {
    let asked: ExecuteRequest = match read(body) {
        Ok(asked) => asked,
        Err(err) => return refused(err),
    };
    let context = match (&asked.context_id, &asked.language) {
        (Some(_), Some(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "Only one of context_id or language can be provided",
            )
        }
        (Some(id), None) => found(&session, id).await,
        (None, language) => match contexts::language_of(language.as_deref()) {
            Ok(language) => contexts::default_of(&session, &language).await,
            Err(err) => Err(err),
        },
    };
    let context = match context {
        Ok(context) => context,
        Err(err) => return refused(err),
    };
    let turn = face
        .context_locks()
        .of(session.tenant.delegate, &session.id, &context.id);
    let (sender, receiver) = mpsc::channel(ANSWER_BACKLOG);
    tokio::spawn(async move {
        // A client that goes while it waits for the context's turn leaves
        // nothing behind: its code is dropped, never run.
        let _turn = tokio::select! {
            turn = turn.lock_owned() => turn,
            () = sender.closed() => return,
        };
        // Its output so far is another execution's: this one's starts
        // where the context stands now that its turn has come.
        let context = match contexts::find(&session, &context.id).await {
            Ok(Some(now)) => now,
            _ => context,
        };
        execute::run(session, context, asked, sender).await;
    });
    let mut response = Response::new(channel_body(receiver));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}
