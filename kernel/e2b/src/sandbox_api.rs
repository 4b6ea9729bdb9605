//! A sandbox's own API (`E2B_SANDBOX_URL`): requests that name the
//! sandbox (`E2b-Sandbox-Id`) and its port (`E2b-Sandbox-Port`: envd on
//! 49983, the code interpreter on 49999), proven by the sandbox's access
//! token rather than an API key. The token names the delegate it was
//! made for, so the request is that key's, and a token made for another
//! sandbox is refused before the kernel is asked anything.

use agentos_http::Body;
use agentos_proto::payload::SessionState;
use http::{HeaderMap, Method, Request, Response, StatusCode};

use agentos_http::RequestBody;

use crate::answer::{no_content, ApiError};
use crate::envd::files::{self, FilesQuery};
use crate::envd::{self, session::Session};
use crate::face::Face;
use crate::interpreter;
use crate::query::query_pairs;
use crate::tenant::Tenant;
use crate::tokens::Purpose;

/// The header a sandbox's requests name it by.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The header naming the sandbox's port.
const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
/// The header carrying the sandbox's access token.
const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// The header carrying its traffic token.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// envd's port.
const ENVD_PORT: &str = "49983";
/// The code interpreter's port.
const INTERPRETER_PORT: &str = "49999";

/// The answer to a request to a sandbox.
pub async fn answer(face: &Face, request: Request<RequestBody>) -> Response<Body> {
    match answered(face, request).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn answered(face: &Face, request: Request<RequestBody>) -> Result<Response<Body>, ApiError> {
    let headers = request.headers();
    let id = one_header(headers, SANDBOX_ID_HEADER).unwrap_or_default();
    let port = one_header(headers, SANDBOX_PORT_HEADER).unwrap_or(ENVD_PORT);
    // Proven first: nothing is answered but a 401 to a caller without
    // the sandbox's token.
    let tenant = tenant_of(face, headers, id, port)?;
    if port != ENVD_PORT && port != INTERPRETER_PORT {
        return Err(not_running(format!(
            "The sandbox {id} has no port {port} open"
        )));
    }
    let path = request.uri().path();
    let envd = path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/");
    if port == ENVD_PORT && envd {
        if request.method() != Method::POST {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "Connect calls are POST",
            ));
        }
        let session = Session {
            tenant,
            id: id.to_owned(),
        };
        return Ok(envd::answer(face, session, request).await);
    }
    if port == INTERPRETER_PORT {
        let session = Session {
            tenant,
            id: id.to_owned(),
        };
        return Ok(interpreter::answer(face, session, request).await);
    }
    if port == ENVD_PORT && path == "/files" {
        let session = Session {
            tenant,
            id: id.to_owned(),
        };
        return files(face, session, request).await;
    }
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/health") => {
            let session = tenant
                .sandbox(id)
                .await
                .map_err(|_| not_running(format!("The sandbox {id} was not found")))?;
            match session.state {
                SessionState::Running | SessionState::Ready => Ok(no_content()),
                _ => Err(not_running(format!("The sandbox {id} is paused"))),
            }
        }
        (method, path) => Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{method} {path} is not a route of envd that agentos e2b serves"),
        )),
    }
}

/// A signed `/files` URL's request: no sandbox named, no token, only a
/// signature its sandbox's token made.
pub async fn answer_signed(face: &Face, request: Request<RequestBody>) -> Response<Body> {
    let query = request.uri().query().unwrap_or("").to_owned();
    let found = crate::signed::sandbox_of(face, request.method(), &query).await;
    let answered = match found {
        Ok(session) => files(face, session, request).await,
        Err(err) => Err(err),
    };
    answered.unwrap_or_else(ApiError::into_response)
}

/// `/files`: a download or an upload.
async fn files(
    face: &Face,
    session: Session,
    request: Request<RequestBody>,
) -> Result<Response<Body>, ApiError> {
    let mut asked = FilesQuery::default();
    for (name, value) in query_pairs(request.uri().query().unwrap_or("")) {
        match name.as_str() {
            "path" => asked.path = Some(value),
            "username" if matches!(value.as_str(), "" | "user" | "root") => {}
            "username" => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!("error looking up user '{value}'"),
                ))
            }
            _ => {}
        }
    }
    let (parts, body) = request.into_parts();
    match parts.method {
        Method::GET => files::download(session, asked).await,
        Method::POST => {
            let most = face.sizing.max_upload_bytes;
            files::upload(session, &parts.headers, asked, body, most).await
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "/files takes GET and POST",
        )),
    }
}

/// The tenant whose token the request carries, for sandbox `id`; a 401
/// for a missing token or one not made for `id`. The code interpreter's
/// requests may carry the sandbox's traffic token instead (its SDKs send
/// the access token on `/execute` only).
fn tenant_of(face: &Face, headers: &HeaderMap, id: &str, port: &str) -> Result<Tenant, ApiError> {
    let presented = match one_header(headers, ACCESS_TOKEN_HEADER) {
        Some(token) => Some((Purpose::Envd, token)),
        None if port == INTERPRETER_PORT => {
            one_header(headers, TRAFFIC_TOKEN_HEADER).map(|token| (Purpose::Traffic, token))
        }
        None => None,
    };
    let (purpose, token) =
        presented.ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "send X-Access-Token"))?;
    // A token speaks for a key the face still has: one whose key was
    // removed no longer reaches its sandboxes.
    let delegate = face
        .tokens
        .verify_for(purpose, token, id)
        .filter(|delegate| face.keys.delegates().contains(delegate))
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "invalid access token"))?;
    Ok(Tenant::new(&face.kernel, delegate))
}

/// The one value of header `name`, as text.
fn one_header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    }
}

/// What E2B's proxy answers for a sandbox that is not there to answer:
/// the SDKs read a 502 as "not running".
fn not_running(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, message)
}
