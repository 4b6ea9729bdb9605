//! `agentos mcp --http`: the Streamable HTTP transport.
//!
//! rmcp's `StreamableHttpService` speaks the protocol; this module owns
//! what stands in front of it: the listening socket, the bearer token,
//! which `Host` and `Origin` headers are accepted, the size and shape of a
//! request body, and stopping on SIGINT or SIGTERM.
//!
//! Whoever reaches the endpoint acts as the uid that runs `agentos mcp`,
//! so a bind that other machines can reach requires a token; without one,
//! a loopback bind serves that uid's own connections only (any local user
//! can reach a loopback port); and a browser page from a foreign origin is
//! refused either way.

use std::convert::Infallible;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::loopback_peer;
use super::server::AgentosServer;

/// The largest request body read. The kernel takes requests up to 1 MiB
/// by default; this leaves room for JSON escaping and the envelope, and
/// bounds what one request can make the server hold.
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The one path the endpoint answers on.
pub const ENDPOINT_PATH: &str = "/mcp";

/// Where the token comes from when `--token-file` is not given. A token
/// is never taken on the command line: argv is visible to every user in
/// `ps`.
pub const TOKEN_ENV: &str = "AGENTOS_MCP_TOKEN";

/// A token file is one token and a line end: anything longer is a
/// wrong file.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// A token shorter than this is refused as guessable.
const MIN_TOKEN_BYTES: usize = 16;

/// How long a client may take to send a request's headers; a connection
/// that dawdles longer is closed, so idle sockets cannot pile up.
const HEADER_READ_LIMIT: Duration = Duration::from_secs(30);

/// How long in-flight requests get to finish after SIGINT or SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `--http` and the flags that go with it.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `host:port`, `:port` or `port`.
    pub listen: String,
    pub token_file: Option<PathBuf>,
    /// Browser origins allowed besides the loopback ones.
    pub allow_origins: Vec<String>,
    /// `Host` header values allowed besides the defaults.
    pub allow_hosts: Vec<String>,
}

/// Everything decided before the socket opens: a bad flag fails here,
/// before anything listens.
#[derive(Debug)]
pub struct HttpPlan {
    address: SocketAddr,
    token: Option<Token>,
    allowed_origins: Vec<String>,
    /// Empty means any `Host`: only for a wildcard bind, which requires a
    /// token.
    allowed_hosts: Vec<String>,
    /// Without a token, the one uid whose connections are served.
    only_uid: Option<u32>,
}

impl HttpPlan {
    pub fn new(options: &HttpOptions) -> anyhow::Result<HttpPlan> {
        let address = parse_listen_address(&options.listen)?;
        let token = match &options.token_file {
            Some(path) => Some(Token::from_file(path)?),
            None => match std::env::var_os(TOKEN_ENV) {
                Some(value) => Some(Token::new(
                    value.into_encoded_bytes(),
                    &format!("${TOKEN_ENV}"),
                )?),
                None => None,
            },
        };
        let loopback = address.ip().is_loopback();
        if !loopback && token.is_none() {
            bail!(
                "--http {}: a bind other machines can reach needs a token: give --token-file PATH \
                 or set {TOKEN_ENV}",
                options.listen
            );
        }
        for origin in &options.allow_origins {
            check_origin(origin)?;
        }
        let mut allowed_origins = Vec::new();
        if loopback {
            // Pages served from this machine; the port is any, as a local
            // development server's is.
            for scheme in ["http", "https"] {
                for host in ["localhost", "127.0.0.1", "[::1]"] {
                    allowed_origins.push(format!("{scheme}://{host}:*"));
                }
            }
        }
        allowed_origins.extend(options.allow_origins.iter().cloned());

        let mut allowed_hosts = Vec::new();
        if !address.ip().is_unspecified() || !options.allow_hosts.is_empty() {
            allowed_hosts.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
            if !address.ip().is_unspecified() {
                allowed_hosts.push(address.ip().to_string());
            }
            allowed_hosts.extend(options.allow_hosts.iter().cloned());
        }
        let only_uid = token.is_none().then(super::effective_uid);
        Ok(HttpPlan {
            address,
            token,
            allowed_origins,
            allowed_hosts,
            only_uid,
        })
    }

    fn config(&self, shutdown: CancellationToken) -> StreamableHttpServerConfig {
        let config = StreamableHttpServerConfig::default()
            // No server-side sessions: the server keeps no state per
            // client (EXEC sessions live in the kernel, per uid), so a
            // client that never comes back costs nothing.
            .with_legacy_session_mode(false)
            .with_max_request_body_bytes(MAX_MESSAGE_BYTES)
            .with_cancellation_token(shutdown)
            .with_allowed_origins(self.allowed_origins.clone())
            // An empty list would otherwise mean "no Origin check".
            .enforce_origin_validation();
        if self.allowed_hosts.is_empty() {
            config.disable_allowed_hosts()
        } else {
            config.with_allowed_hosts(self.allowed_hosts.clone())
        }
    }
}

/// `8080`, `:8080` and `localhost:8080` mean 127.0.0.1; otherwise an IP
/// address and a port (`[::1]:8080` for IPv6).
pub fn parse_listen_address(text: &str) -> anyhow::Result<SocketAddr> {
    let invalid = || {
        anyhow::anyhow!(
            "--http {text}: give host:port, :port or port (host an IP address or localhost)"
        )
    };
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| invalid())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| invalid())
}

/// An allowed origin is `scheme://host[:port]` (port `*` for any) or
/// `null`; anything else would silently match nothing.
fn check_origin(origin: &str) -> anyhow::Result<()> {
    if origin == "null" {
        return Ok(());
    }
    let uri = origin
        .strip_suffix(":*")
        .unwrap_or(origin)
        .parse::<http::Uri>()
        .ok();
    let valid = uri.is_some_and(|uri| {
        matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.authority().is_some()
            && uri.path_and_query().is_none_or(|path| path.as_str() == "/")
            && !origin.ends_with('/')
    });
    if !valid {
        bail!("--allow-origin {origin}: give scheme://host, scheme://host:port or scheme://host:*");
    }
    Ok(())
}

/// The bearer token every request must carry.
struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    fn from_file(path: &Path) -> anyhow::Result<Token> {
        let file = std::fs::File::open(path)
            .with_context(|| format!("--token-file {}", path.display()))?;
        let metadata = file.metadata()?;
        // The file is the secret: one that others can read gives the
        // endpoint to them too.
        if metadata.mode() & 0o077 != 0 {
            bail!(
                "--token-file {}: other users can read it; chmod 600 it",
                path.display()
            );
        }
        let mut bytes = Vec::new();
        file.take(MAX_TOKEN_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("--token-file {}", path.display()))?;
        if bytes.len() as u64 > MAX_TOKEN_FILE_BYTES {
            bail!(
                "--token-file {}: longer than {MAX_TOKEN_FILE_BYTES} bytes; it holds one token",
                path.display()
            );
        }
        Token::new(bytes, &format!("--token-file {}", path.display()))
    }

    /// The token in `bytes`, without the line end a file usually has.
    fn new(mut bytes: Vec<u8>, source: &str) -> anyhow::Result<Token> {
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        if bytes.len() < MIN_TOKEN_BYTES {
            bail!("{source}: the token must be at least {MIN_TOKEN_BYTES} characters");
        }
        // It goes in an HTTP header, so it is printable ASCII without
        // spaces, as RFC 6750's b64token is.
        if !bytes.iter().all(|byte| byte.is_ascii_graphic()) {
            bail!("{source}: the token must be printable ASCII without spaces");
        }
        Ok(Token(bytes))
    }

    /// Compares in time that does not depend on where the bytes differ.
    fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_slice().ct_eq(presented))
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// Serves MCP over HTTP on the planned address until SIGINT or SIGTERM.
pub async fn serve(server: AgentosServer, plan: HttpPlan) -> anyhow::Result<()> {
    // Signals are caught before the address is printed, so a client that
    // sees it may stop the server at once.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let listener = TcpListener::bind(plan.address)
        .await
        .with_context(|| format!("--http: cannot listen on {}", plan.address))?;
    let address = listener.local_addr()?;
    let stopping = CancellationToken::new();
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        plan.config(stopping.clone()),
    );
    let gate = Arc::new(Gate {
        mcp,
        token: plan.token,
    });
    eprintln!("agentos mcp: listening on http://{address}{ENDPOINT_PATH}");

    let connections = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of descriptors and the like: wait a little
                        // rather than spin, and keep serving.
                        eprintln!("agentos mcp: accept: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let refusal = match plan.only_uid {
                    Some(uid) => refuse_other_users(uid, peer, address).await,
                    None => None,
                };
                let gate = gate.clone();
                let service = service_fn(move |request| {
                    let gate = gate.clone();
                    let refusal = refusal.clone();
                    async move {
                        Ok::<_, Infallible>(match refusal {
                            Some(refusal) => plain(StatusCode::FORBIDDEN, refusal),
                            None => gate.handle(request).await,
                        })
                    }
                });
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_LIMIT)
                    .serve_connection(TokioIo::new(stream), service);
                let connection = connections.watch(connection);
                tokio::spawn(async move {
                    // A client that hangs up mid-request is its own
                    // business; the server goes on.
                    let _ = connection.await;
                });
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    drop(listener);
    eprintln!("agentos mcp: stopping");
    // Ends the response streams still open, then lets the requests in
    // flight finish, for a while.
    stopping.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.shutdown())
        .await
        .is_err()
    {
        eprintln!("agentos mcp: requests still running after {SHUTDOWN_GRACE:?}; leaving them");
    }
    Ok(())
}

/// Why the connection from `peer` is refused, unless `uid` owns it.
async fn refuse_other_users(uid: u32, peer: SocketAddr, local: SocketAddr) -> Option<String> {
    let owner = tokio::task::spawn_blocking(move || loopback_peer::peer_uid(peer, local)).await;
    match owner {
        Ok(Ok(Some(owner))) if owner == uid => None,
        Ok(Ok(Some(owner))) => Some(format!(
            "Forbidden: without a token this server serves uid {uid} only, and this connection \
             is uid {owner}'s; start it with --token-file to share it"
        )),
        Ok(Ok(None)) => Some("Forbidden: the connection's owner cannot be found".to_owned()),
        Ok(Err(err)) => Some(format!("Forbidden: the connection's owner: {err}")),
        Err(err) => Some(format!("Forbidden: the connection's owner: {err}")),
    }
}

/// What every request passes before rmcp sees it.
struct Gate {
    mcp: StreamableHttpService<AgentosServer, NeverSessionManager>,
    token: Option<Token>,
}

impl Gate {
    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        if request.uri().path() != ENDPOINT_PATH {
            return plain(
                StatusCode::NOT_FOUND,
                format!("Not Found: MCP is served at {ENDPOINT_PATH}"),
            );
        }
        if let Some(refusal) = self.refuse_unauthorized(&request) {
            return refusal;
        }
        if request.method() != Method::POST {
            // GET and DELETE carry no body; rmcp answers them (a 405,
            // as there are no sessions to stream or end).
            return self.mcp.handle(request).await;
        }
        let (parts, body) = request.into_parts();
        let body = match Limited::new(body, MAX_MESSAGE_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.is::<http_body_util::LengthLimitError>() => {
                return plain(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "Payload Too Large: a request may be at most {MAX_MESSAGE_BYTES} bytes"
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
        if let Some(refusal) = refuse_malformed(&body) {
            return refusal;
        }
        self.mcp
            .handle(Request::from_parts(parts, Full::new(body)))
            .await
    }

    /// A 401 unless the request carries the token (when there is one).
    fn refuse_unauthorized<B>(&self, request: &Request<B>) -> Option<Response<Body>> {
        let token = self.token.as_ref()?;
        let mut values = request.headers().get_all(header::AUTHORIZATION).iter();
        let presented = match (values.next(), values.next()) {
            (Some(value), None) => bearer_credentials(value),
            _ => None,
        };
        let challenge = match presented {
            Some(presented) if token.matches(presented) => return None,
            Some(_) => r#"Bearer realm="agentos mcp", error="invalid_token""#,
            None => r#"Bearer realm="agentos mcp""#,
        };
        let mut response = plain(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: send Authorization: Bearer <token>".to_owned(),
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        Some(response)
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

/// A JSON-RPC error for a body that is not JSON (-32700) or is JSON but
/// not one JSON-RPC message (-32600): rmcp would answer both with a bare
/// HTTP status.
fn refuse_malformed(body: &[u8]) -> Option<Response<Body>> {
    let err = match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Ok(_) => return None,
        Err(err) => err,
    };
    let (code, message) = match err.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            (-32700, format!("Parse error: the body is not JSON: {err}"))
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => (
            -32600,
            "Invalid Request: the body is not a JSON-RPC 2.0 request, notification or response"
                .to_owned(),
        ),
    };
    // The id, when the body has a usable one, so the client can match
    // the error to its request.
    let id = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| value.get("id").cloned())
        .filter(|id| id.is_string() || id.is_number())
        .unwrap_or(Value::Null);
    let error = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    });
    let mut response = Response::new(Full::new(Bytes::from(error.to_string())).boxed());
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Some(response)
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
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
    fn a_port_alone_means_loopback() {
        for text in ["8080", ":8080", "localhost:8080"] {
            assert_eq!(
                parse_listen_address(text).unwrap(),
                "127.0.0.1:8080".parse().unwrap()
            );
        }
        assert_eq!(
            parse_listen_address("[::1]:0").unwrap(),
            "[::1]:0".parse().unwrap()
        );
        assert_eq!(
            parse_listen_address("0.0.0.0:9").unwrap(),
            "0.0.0.0:9".parse().unwrap()
        );
        for bad in ["", "host:80", "127.0.0.1", "127.0.0.1:99999", ":x"] {
            assert!(parse_listen_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_must_be_scheme_host_port() {
        for good in [
            "https://app.example",
            "http://localhost:3000",
            "https://app.example:*",
            "null",
        ] {
            assert!(check_origin(good).is_ok(), "{good}");
        }
        for bad in [
            "app.example",
            "ftp://x",
            "https://app.example/path",
            "https://a/",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_token_is_long_printable_and_compared_whole() {
        assert!(Token::new(b"short".to_vec(), "t").is_err());
        assert!(Token::new(b"has a space in it, sixteen+".to_vec(), "t").is_err());
        let token = Token::new(b"0123456789abcdef\n".to_vec(), "t").unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b"0123456789abcde"));
        assert!(!token.matches(b"0123456789abcdef0"));
    }

    #[test]
    fn bearer_credentials_need_the_scheme() {
        let value = HeaderValue::from_static("bearer abc");
        assert_eq!(bearer_credentials(&value), Some(&b"abc"[..]));
        let value = HeaderValue::from_static("Basic abc");
        assert_eq!(bearer_credentials(&value), None);
    }

    #[test]
    fn malformed_bodies_are_json_rpc_errors() {
        let garbage = refuse_malformed(b"{not json").expect("refused");
        assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
        assert!(refuse_malformed(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#).is_none());
        assert!(refuse_malformed(br#"{"jsonrpc":"2.0","id":7}"#).is_some());
    }
}
