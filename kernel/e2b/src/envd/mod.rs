//! envd's Connect services, as a sandbox's requests reach them on port
//! 49983: `process.Process` and `filesystem.Filesystem`, each method onto
//! the kernel's ops on the sandbox's session.

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod session;

use agentos_http::Body;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{header, HeaderMap, Request, Response};
use hyper::body::Incoming;

use self::connect::{stream_error, unary, ConnectError};
use self::process::Empty;
use self::session::Session;
use crate::face::Face;

/// The users a request may name: the sandbox has one, and runs every
/// process as it whichever is named.
const USERS: [&str; 2] = ["user", "root"];

/// The answer to an envd call on `session`.
pub async fn answer(face: &Face, session: Session, request: Request<Incoming>) -> Response<Body> {
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
        "/process.Process/Start" => match stream_request(body).await {
            Ok(asked) => process::start(session, headers, asked).await,
            Err(err) => stream_error(err),
        },
        "/process.Process/Connect" => match stream_request(body).await {
            Ok(asked) => process::connect(session, headers, asked).await,
            Err(err) => stream_error(err),
        },
        "/process.Process/StreamInput" => process::stream_input(&session, body).await,
        "/process.Process/List" => process::list(&session).await,
        "/process.Process/SendInput" => match process::read(body).await {
            Ok(asked) => process::send_input(&session, asked).await,
            Err(refused) => refused,
        },
        "/process.Process/CloseStdin" => match process::read(body).await {
            Ok(asked) => process::close_stdin(&session, asked).await,
            Err(refused) => refused,
        },
        "/process.Process/SendSignal" => match process::read(body).await {
            Ok(asked) => process::send_signal(&session, asked).await,
            Err(refused) => refused,
        },
        "/process.Process/Update" => match process::read(body).await {
            Ok(asked) => process::update(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/WatchDir" => match stream_request(body).await {
            Ok(asked) => filesystem::watch_dir(session, headers, asked).await,
            Err(err) => stream_error(err),
        },
        "/filesystem.Filesystem/Stat" => match process::read(body).await {
            Ok(asked) => filesystem::stat(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/ListDir" => match process::read(body).await {
            Ok(asked) => filesystem::list_dir(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/MakeDir" => match process::read(body).await {
            Ok(asked) => filesystem::make_dir(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/Move" => match process::read(body).await {
            Ok(asked) => filesystem::move_entry(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/Remove" => match process::read(body).await {
            Ok(asked) => filesystem::remove(&session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/CreateWatcher" => match process::read(body).await {
            Ok(asked) => filesystem::create_watcher(face, &session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/GetWatcherEvents" => match process::read(body).await {
            Ok(asked) => filesystem::watcher_events(face, &session, asked).await,
            Err(refused) => refused,
        },
        "/filesystem.Filesystem/RemoveWatcher" => match process::read(body).await {
            Ok(asked) => filesystem::remove_watcher(face, &session, asked).await,
            Err(refused) => refused,
        },
        other => unary::<Empty>(Err(ConnectError::new(
            "unimplemented",
            format!("{other} is not a method agentos e2b serves"),
        ))),
    }
}

/// A server-stream request's one message.
async fn stream_request<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, ConnectError> {
    connect::EnvelopeReader::new(body)
        .next()
        .await?
        .ok_or_else(|| ConnectError::invalid("the request holds no message"))
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
