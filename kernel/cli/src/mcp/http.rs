//! `agentos mcp --http`: the Streamable HTTP transport.
//!
//! rmcp's `StreamableHttpService` speaks the protocol; this module owns
//! what stands in front of it: the listening socket, the bearer token,
//! which `Host` and `Origin` headers are accepted, the size and shape of a
//! request body, and stopping on SIGINT or SIGTERM.
//!
//! Whoever reaches the endpoint acts as the uid that runs `agentos mcp`,
//! so every request needs a token: one given (`--token-file`, the
//! environment), which its holders may share and which a bind other
//! machines can reach requires; or one the server makes and keeps for its
//! user, with which it serves that user's own connections only. A
//! browser page from a foreign origin is refused either way.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
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
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::server::AgentosServer;
use crate::http_guard::peer::Source as PeerSource;
use crate::http_guard::{
    default_token_path, effective_uid, Client, ConnectionLimit, Held, Place, Token, TokenOrigin,
};

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

/// How long a client may take to send a request's headers; a connection
/// that dawdles longer is closed, so idle sockets cannot pile up.
const HEADER_READ_LIMIT: Duration = Duration::from_secs(30);

/// The connections one client (a local uid, or a remote address) may
/// hold at once; past it, its oldest connection that has not carried the
/// token is closed for the new one, or, when all have, the new one is
/// answered 503 and closed. An MCP client needs one or two; this leaves
/// room for many, and keeps one user's flood from using up the
/// descriptors everyone else needs.
const MAX_CONNECTIONS_PER_CLIENT: usize = 64;

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
    token: Token,
    token_origin: TokenOrigin,
    allowed_origins: Vec<String>,
    /// Empty means any `Host`: only for a wildcard bind, which requires a
    /// given token.
    allowed_hosts: Vec<String>,
    /// With a token this server made, the one uid whose connections are
    /// served: a given token may be shared, a made one is its user's.
    only_uid: Option<u32>,
}

impl HttpPlan {
    pub fn new(options: &HttpOptions) -> anyhow::Result<HttpPlan> {
        let address = parse_listen_address(&options.listen)?;
        let loopback = address.ip().is_loopback();
        let given = match &options.token_file {
            Some(path) => Some(Token::from_file(path, "--token-file")?),
            None => match std::env::var_os(TOKEN_ENV) {
                Some(value) => Some(Token::new(
                    value.into_encoded_bytes(),
                    &format!("${TOKEN_ENV}"),
                )?),
                None => None,
            },
        };
        for origin in &options.allow_origins {
            check_origin(origin)?;
        }
        let (token, token_origin) = match given {
            Some(token) => (token, TokenOrigin::Given),
            None if !loopback => bail!(
                "--http {}: a bind other machines can reach needs a token: give --token-file PATH \
                 or set {TOKEN_ENV}",
                options.listen
            ),
            // A loopback port is open to every local user, and to
            // sandboxes through the egress proxy: never without a token.
            None => Token::made_or_kept(&default_token_path("mcp")?)?,
        };
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
        let only_uid = (token_origin != TokenOrigin::Given).then(effective_uid);
        Ok(HttpPlan {
            address,
            token,
            token_origin,
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
    let guard = Arc::new(Guard {
        peers: PeerSource::for_listener(address),
        limit: ConnectionLimit::new(MAX_CONNECTIONS_PER_CLIENT),
        only_uid: plan.only_uid,
    });
    let gate = Arc::new(Gate {
        mcp,
        token: plan.token,
        guard: guard.clone(),
    });
    let made = match &plan.token_origin {
        TokenOrigin::Given => None,
        TokenOrigin::Made(path) => Some((path, "made now")),
        TokenOrigin::Kept(path) => Some((path, "made by an earlier start")),
    };
    if let Some((path, when)) = made {
        eprintln!(
            "agentos mcp: every request must carry Authorization: Bearer TOKEN, TOKEN being the \
             content of {} ({when}, readable by you only)",
            path.display()
        );
    }
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
                // Whose the connection is, and whether its client may
                // have one more, is found in the connection's own task:
                // the accept loop never waits on a client.
                let watcher = connections.watcher();
                let (guard, gate) = (guard.clone(), gate.clone());
                tokio::spawn(async move {
                    // The connection's own local address: on a wildcard
                    // bind, the listener's is 0.0.0.0, which no
                    // connection's other end is connected to.
                    let Ok(local) = stream.local_addr() else {
                        return;
                    };
                    let ends = Ends { peer, local };
                    let Some(held) = guard.admit(ends).await else {
                        return refuse_busy(stream, guard.limit.per_client()).await;
                    };
                    let place = held.place();
                    let service = service_fn({
                        let place = place.clone();
                        move |request| {
                            let (gate, place) = (gate.clone(), place.clone());
                            async move {
                                Ok::<_, Infallible>(gate.handle(request, ends, &place).await)
                            }
                        }
                    });
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_LIMIT)
                        .serve_connection(TokioIo::new(stream), service);
                    // A client that hangs up mid-request is its own
                    // business; the server goes on. A connection that a
                    // newer one of its client displaced is closed.
                    tokio::select! {
                        _ = watcher.watch(connection) => {}
                        _ = place.evicted() => {}
                    }
                    drop(held);
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

/// A 503 for a client that holds its share of connections, written
/// without reading its request; then the connection closes.
async fn refuse_busy(mut stream: TcpStream, per_client: usize) {
    let text = format!(
        "Service Unavailable: a client may hold {per_client} connections to this server at once"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    // A client too slow to take a few hundred bytes is not waited for.
    let write = stream.write_all(response.as_bytes());
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Who may hold a connection, and whose requests are served: a place
/// per client up to the limit and, with a token this server made, its
/// own user only.
struct Guard {
    peers: PeerSource,
    limit: Arc<ConnectionLimit>,
    only_uid: Option<u32>,
}

/// A connection's two ends: the client's, and the server's own.
#[derive(Debug, Clone, Copy)]
struct Ends {
    peer: SocketAddr,
    local: SocketAddr,
}

impl Guard {
    /// A place for the connection, unless its client holds its share.
    async fn admit(&self, ends: Ends) -> Option<Held> {
        let client = match self.owner(ends).await {
            Ok(uid) => Client::Uid(uid),
            // Not on this machine, or gone already: counted by address.
            Err(_) => Client::Address(ends.peer.ip()),
        };
        self.limit.hold(client)
    }

    /// Why a request on the connection is refused, unless the server
    /// serves any holder of its token, or its own user holds the client's
    /// end of the connection now.
    async fn refuse_other_users(&self, ends: Ends) -> Option<String> {
        let uid = self.only_uid?;
        match self.owner(ends).await {
            Ok(owner) if owner == uid => None,
            Ok(owner) => Some(format!(
                "Forbidden: this server's token is uid {uid}'s own, and this connection is uid \
                 {owner}'s; start it with --token-file to share it"
            )),
            Err(err) => Some(format!("Forbidden: {err}")),
        }
    }

    /// The uid at the client's end of the connection, asked of the
    /// kernel now (a blocking read, so off the runtime's thread).
    async fn owner(&self, ends: Ends) -> Result<u32, LookupFailed> {
        let peers = self.peers;
        let lookup = move || peers.owner(ends.peer, ends.local);
        Ok(tokio::task::spawn_blocking(lookup).await??)
    }
}

/// Why the owner of a connection is not known.
#[derive(Debug, thiserror::Error)]
enum LookupFailed {
    #[error(transparent)]
    Lookup(#[from] crate::http_guard::peer::LookupError),
    #[error("looking up the connection's owner: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What every request passes before rmcp sees it.
struct Gate {
    mcp: StreamableHttpService<AgentosServer, NeverSessionManager>,
    token: Token,
    guard: Arc<Guard>,
}

impl Gate {
    /// The answer to `request`, which came on the connection with these
    /// `ends`, holding `place` among its client's connections.
    async fn handle(
        &self,
        request: Request<Incoming>,
        ends: Ends,
        place: &Place,
    ) -> Response<Body> {
        if request.uri().path() != ENDPOINT_PATH {
            return plain(
                StatusCode::NOT_FOUND,
                format!("Not Found: MCP is served at {ENDPOINT_PATH}"),
            );
        }
        if let Some(refusal) = self.refuse_unauthorized(&request) {
            return refusal;
        }
        place.prove();
        if let Some(refusal) = self.guard.refuse_other_users(ends).await {
            return plain(StatusCode::FORBIDDEN, refusal);
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

    /// A 401 unless the request carries the token.
    fn refuse_unauthorized<B>(&self, request: &Request<B>) -> Option<Response<Body>> {
        let token = &self.token;
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
