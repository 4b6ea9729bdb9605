//! envd's Connect services, as a sandbox's requests reach them on port
//! 49983: `process.Process` and `filesystem.Filesystem`, each method onto
//! the kernel's ops on the sandbox's session.

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod session;

use std::future::Future;

use agentos_http::Body;
use agentos_http::RequestBody;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{header, HeaderMap, Request, Response};
use serde::de::DeserializeOwned;

use self::connect::{stream_error, unary, ConnectError};
use self::process::Empty;
use self::session::Session;
use crate::face::Face;

/// The users a request may name: the sandbox has one, and runs every
/// process as it whichever is named.
const USERS: [&str; 2] = ["user", "root"];

/// The answer to an envd call on `session`.
pub async fn answer(
    face: &Face,
    session: Session,
    request: Request<RequestBody>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let method = parts.uri.path().to_owned();
    let streaming = matches!(
        method.as_str(),
        "/process.Process/Start"
            | "/process.Process/Connect"
            | "/process.Process/StreamInput"
            | "/filesystem.Filesystem/WatchDir"
    );
    if let Err(err) = check_user(&parts.headers) {
        return if streaming {
            stream_error(err)
        } else {
            unary::<Empty>(Err(err))
        };
    }
    let headers = &parts.headers;
    match method.as_str() {
        "/process.Process/Start" => {
            stream_call(body, |asked| process::start(session, headers, asked)).await
        }
        "/process.Process/Connect" => {
            stream_call(body, |asked| process::connect(session, headers, asked)).await
        }
        "/process.Process/StreamInput" => process::stream_input(&session, body).await,
        "/process.Process/List" => process::list(&session).await,
        "/process.Process/SendInput" => {
            unary_call(body, |asked| process::send_input(&session, asked)).await
        }
        "/process.Process/CloseStdin" => {
            unary_call(body, |asked| process::close_stdin(&session, asked)).await
        }
        "/process.Process/SendSignal" => {
            unary_call(body, |asked| process::send_signal(&session, asked)).await
        }
        "/process.Process/Update" => {
            unary_call(body, |asked| process::update(&session, asked)).await
        }
        "/filesystem.Filesystem/WatchDir" => {
            stream_call(body, |asked| filesystem::watch_dir(session, headers, asked)).await
        }
        "/filesystem.Filesystem/Stat" => {
            unary_call(body, |asked| filesystem::stat(&session, asked)).await
        }
        "/filesystem.Filesystem/ListDir" => {
            unary_call(body, |asked| filesystem::list_dir(&session, asked)).await
        }
        "/filesystem.Filesystem/MakeDir" => {
            unary_call(body, |asked| filesystem::make_dir(&session, asked)).await
        }
        "/filesystem.Filesystem/Move" => {
            unary_call(body, |asked| filesystem::move_entry(&session, asked)).await
        }
        "/filesystem.Filesystem/Remove" => {
            unary_call(body, |asked| filesystem::remove(&session, asked)).await
        }
        "/filesystem.Filesystem/CreateWatcher" => {
            unary_call(body, |asked| {
                filesystem::create_watcher(face, &session, asked)
            })
            .await
        }
        "/filesystem.Filesystem/GetWatcherEvents" => {
            unary_call(body, |asked| {
                filesystem::watcher_events(face, &session, asked)
            })
            .await
        }
        "/filesystem.Filesystem/RemoveWatcher" => {
            unary_call(body, |asked| {
                filesystem::remove_watcher(face, &session, asked)
            })
            .await
        }
        other => unary::<Empty>(Err(ConnectError::new(
            "unimplemented",
            format!("{other} is not a method agentos e2b serves"),
        ))),
    }
}

/// How long a one-message request's last chunk is waited for.
const REST_OF_REQUEST: std::time::Duration = std::time::Duration::from_millis(200);

/// A unary method: its request read, then handled; one that cannot be
/// read is `invalid_argument`.
async fn unary_call<T, F>(body: RequestBody, handle: impl FnOnce(T) -> F) -> Response<Body>
where
    T: DeserializeOwned,
    F: Future<Output = Response<Body>>,
{
    match connect::unary_request(body).await {
        Ok(asked) => handle(asked).await,
        Err(err) => unary::<Empty>(Err(err)),
    }
}

/// A server-stream method: its request's one message read, then
/// handled; a stream's errors are in its end message.
async fn stream_call<T, F>(body: RequestBody, handle: impl FnOnce(T) -> F) -> Response<Body>
where
    T: DeserializeOwned,
    F: Future<Output = Response<Body>>,
{
    let mut reader = connect::EnvelopeReader::new(body);
    let asked = match reader.next().await {
        Ok(Some(asked)) => asked,
        Ok(None) => return stream_error(ConnectError::invalid("the request holds no message")),
        Err(err) => return stream_error(err),
    };
    reader.finish(REST_OF_REQUEST).await;
    handle(asked).await
}

/// An `Authorization: Basic` user must be one the sandbox has.
fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(());
    };
    let named = value
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix("Basic "))
        .and_then(|encoded| STANDARD.decode(encoded.trim()).ok())
        .and_then(|decoded| String::from_utf8(decoded).ok())
        .map(|pair| pair.split(':').next().unwrap_or_default().to_owned());
    match named {
        Some(user) if user.is_empty() || USERS.contains(&user.as_str()) => Ok(()),
        Some(user) => Err(ConnectError::new(
            "unauthenticated",
            format!("invalid username: '{user}'"),
        )),
        None => Err(ConnectError::new(
            "unauthenticated",
            "Authorization: give Basic base64(user:)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn only_the_sandboxs_users_may_be_named() {
        let mut headers = HeaderMap::new();
        assert!(check_user(&headers).is_ok());
        for (value, ok) in [
            ("Basic dXNlcjo=", true),  // user:
            ("Basic cm9vdDo=", true),  // root:
            ("Basic Ym9iOg==", false), // bob:
            ("Bearer x", false),
            ("Basic !!!", false),
        ] {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(check_user(&headers).is_ok(), ok, "{value}");
        }
    }
}
