//! Streamable HTTP to a remote MCP server, on threads of its own: the
//! reactor hands each message the client makes to an [`HttpLink`], whose
//! threads POST it and hand what the server answered back through a
//! channel and the reactor's waker. Nothing here blocks the reactor.
//!
//! Every message is its own POST, accepting `application/json` and
//! `text/event-stream`; an event stream is read until the request's answer
//! (notifications and, in the earlier era, the server's own requests
//! before it are passed on). The headers 2026-07-28 asks for
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) go with every
//! request; the `Mcp-Session-Id` a server of the earlier era gives at its
//! handshake goes with every later one, and a 404 to it means the session
//! is over: the server is started over. The configured headers (its
//! credentials) go with every request and nowhere else.
//!
//! An HTTP error status answers the request with a JSON-RPC error — the
//! server's own when its body holds one, else one naming the status — so
//! the client reads it as any error (a server of the earlier era refuses
//! `server/discover` so). No connection at all, or credentials refused
//! (401, 403), fails the server; a connection that breaks mid-answer fails
//! the request.
//!
//! A link has [`THREADS`] threads: a server that hangs holds up only its
//! own requests, each until its deadline. They are detached: dropping the
//! link ends them once their current request ends. When the kernel stops,
//! a session is ended with an HTTP DELETE ([`HttpLink::end_session`]), so
//! the server need not keep it until it expires.

use std::io::Read;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_primitives::http_agent::{HttpAgent, Timeouts};
use agentos_primitives::pool::{Closed, Fifo, Outbox, Pool};
use agentos_primitives::threads::Named;
use mio::Waker;
use serde_json::Value;

use super::client::Outgoing;
use super::jsonrpc::{self, Incoming, RpcError};
use super::param_headers::header_value;
use super::sse::{Event, SseParser};

/// Requests one remote server may have on the wire at once.
pub const THREADS: usize = 4;
/// Longest wait for a connection (name lookup, TCP, TLS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a notification may take to be accepted.
const NOTIFICATION_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error body is read, and shown.
const ERROR_BODY: u64 = 64 << 10;
const ERROR_SHOWN: usize = 200;
/// The JSON-RPC code of an error made from an HTTP status: JSON-RPC's
/// "server error" range, which 2026-07-28 gives no meaning of its own.
const HTTP_ERROR: i64 = -32000;

/// Where a remote server is.
#[derive(Debug)]
pub struct ServerLocation {
    /// Its MCP endpoint.
    pub url: String,
    /// The configured headers (secrets).
    pub headers: Vec<(String, String)>,
    /// Its URL's `host:port`, as errors name it (the path and query may
    /// hold what the operator did not mean to show).
    pub host: String,
}

impl ServerLocation {
    /// The endpoint at `url`, with `headers`.
    pub fn new(url: &str, headers: Vec<(String, String)>) -> ServerLocation {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        ServerLocation {
            url: url.to_owned(),
            headers,
            host: host.to_owned(),
        }
    }
}

/// What came of one POST.
#[derive(Debug)]
pub struct Delivered {
    /// The server (its place in the kernel's list).
    pub server: usize,
    /// The incarnation of its link that posted it.
    pub incarnation: u64,
    /// The messages the server answered with, in order.
    pub messages: Vec<Incoming>,
    /// What went wrong below JSON-RPC, if anything.
    pub trouble: Option<Trouble>,
}

/// A failure below JSON-RPC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// The request's exchange broke: the request fails, saying why.
    Lost {
        /// The request's id.
        id: u64,
        /// What happened.
        why: String,
    },
    /// The server cannot be used as it is (no connection, credentials
    /// refused, its session gone): it starts over.
    Down(String),
}

/// The kernel's HTTP client for remote servers: one connection pool,
/// redirects refused (a redirect would carry the credentials wherever it
/// points), errors as statuses rather than failures.
pub fn agent() -> ureq::Agent {
    HttpAgent::new(Timeouts {
        connect: Some(CONNECT_TIMEOUT),
        // Each request has its own, from its deadline.
        call: None,
    })
    .statuses_as_answers()
    .user_agent(concat!("agentosd/", env!("CARGO_PKG_VERSION")))
    .build()
}

/// One incarnation of a remote server's connection: its threads and its
/// session.
#[derive(Debug)]
pub struct HttpLink {
    jobs: Pool<Fifo<Vec<Outgoing>>>,
    shared: Arc<Shared>,
}

/// What a link's threads share.
#[derive(Debug)]
struct Shared {
    agent: ureq::Agent,
    endpoint: Arc<ServerLocation>,
    /// The session a server of the earlier era gave at its handshake.
    session: Mutex<Option<String>>,
    server: usize,
    incarnation: u64,
}

impl HttpLink {
    /// Starts the threads of incarnation `incarnation` of server `server`;
    /// what they deliver goes to `delivered`, and the reactor is woken.
    pub fn open(
        agent: &ureq::Agent,
        endpoint: Arc<ServerLocation>,
        (server, incarnation): (usize, u64),
        delivered: &Sender<Delivered>,
        waker: &Arc<Waker>,
    ) -> std::io::Result<HttpLink> {
        let shared = Arc::new(Shared {
            agent: agent.clone(),
            endpoint,
            session: Mutex::new(None),
            server,
            incarnation,
        });
        let posting = Arc::clone(&shared);
        let jobs = Pool::start(
            Named::new(format!("mcp-http-{server}")),
            THREADS,
            Fifo::unbounded(),
            Outbox::new(delivered.clone(), Arc::clone(waker)),
            move |sequence: Vec<Outgoing>, delivered: &Outbox<Delivered>| {
                post_all(&posting, &sequence, delivered)
            },
        )?;
        Ok(HttpLink { jobs, shared })
    }

    /// Ends the session the server gave, if it gave one, with an HTTP
    /// DELETE in `protocol_version`, within `timeout` (this blocks).
    pub fn end_session(&self, protocol_version: Option<&str>, timeout: Duration) {
        let Some(session) = lock(&self.shared.session).take() else {
            return;
        };
        let endpoint = &self.shared.endpoint;
        let mut request = self
            .shared
            .agent
            .delete(&endpoint.url)
            .header("mcp-session-id", session.as_str());
        if let Some(version) = protocol_version {
            request = request.header("mcp-protocol-version", version);
        }
        for (name, value) in &endpoint.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let ended = request
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call();
        match ended {
            Ok(response) => log::debug!(
                "MCP server at {}: session ended (HTTP {})",
                endpoint.host,
                response.status().as_u16()
            ),
            Err(err) => log::debug!(
                "MCP server at {}: its session could not be ended: {err}",
                endpoint.host
            ),
        }
    }

    /// Hands messages to the next free thread, which posts them one after
    /// the other, in order.
    pub fn post(&self, sequence: Vec<Outgoing>) {
        // The pool closes only when the link is dropped, or when the
        // kernel no longer reads what is delivered.
        let _ = self.jobs.submit(sequence);
    }
}

/// POSTs messages one after the other, delivering what answers each as
/// soon as it has.
fn post_all(
    shared: &Shared,
    sequence: &[Outgoing],
    delivered: &Outbox<Delivered>,
) -> Result<(), Closed> {
    for message in sequence {
        let (messages, trouble) = exchange(shared, message);
        if messages.is_empty() && trouble.is_none() {
            continue;
        }
        delivered.send(Delivered {
            server: shared.server,
            incarnation: shared.incarnation,
            messages,
            trouble,
        })?;
    }
    Ok(())
}

/// POSTs one message and reads what answers it.
fn exchange(shared: &Shared, message: &Outgoing) -> (Vec<Incoming>, Option<Trouble>) {
    let endpoint = &shared.endpoint;
    let deadline = match message.request {
        Some((_, deadline)) => deadline,
        None => Instant::now() + NOTIFICATION_TIMEOUT,
    };
    let timeout = deadline.saturating_duration_since(Instant::now());
    if timeout.is_zero() {
        // The client has given up on it already.
        return (Vec::new(), None);
    }
    let mut request = shared
        .agent
        .post(&endpoint.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(version) = &message.protocol_version {
        request = request.header("mcp-protocol-version", version.as_str());
    }
    if let Some(method) = &message.method {
        request = request.header("mcp-method", header_value(method));
    }
    if let Some(name) = &message.name {
        request = request.header("mcp-name", header_value(name));
    }
    for (name, value) in &message.param_headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let session = lock(&shared.session).clone();
    if let Some(session) = &session {
        request = request.header("mcp-session-id", session.as_str());
    }
    for (name, value) in &endpoint.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let sent = request
        .config()
        .timeout_global(Some(timeout))
        .build()
        .send(&message.body[..]);
    let id = message.request.map(|(id, _)| id);
    let mut response = match sent {
        Ok(response) => response,
        Err(err) => return (Vec::new(), transport_trouble(&endpoint.host, id, &err)),
    };
    let status = response.status().as_u16();
    let given_session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if given_session.is_some() {
        *lock(&shared.session) = given_session;
    }
    if status == 401 || status == 403 {
        let why = format!(
            "{} refused the kernel's credentials (HTTP {status}); check the server's `headers`",
            endpoint.host
        );
        return (Vec::new(), Some(Trouble::Down(why)));
    }
    if status == 404 && session.is_some() {
        *lock(&shared.session) = None;
        let why = format!("{} ended its session (HTTP 404)", endpoint.host);
        return (Vec::new(), Some(Trouble::Down(why)));
    }
    let Some(id) = id else {
        if !(200..300).contains(&status) {
            log::debug!(
                "MCP server at {}: a notification was refused with HTTP {status}",
                endpoint.host
            );
        }
        return (Vec::new(), None);
    };
    if !(200..300).contains(&status) {
        return (vec![status_error(id, status, &mut response)], None);
    }
    let event_stream = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let read = if event_stream {
        read_events(id, &mut response)
    } else {
        read_json(id, &mut response)
    };
    match read {
        Ok(messages) => (messages, None),
        Err((messages, why)) => (messages, Some(Trouble::Lost { id, why })),
    }
}

/// The answer in a JSON body: one message, or (as 2025-03-26 allowed) a
/// batch of them.
fn read_json(
    id: u64,
    response: &mut ureq::http::Response<ureq::Body>,
) -> Result<Vec<Incoming>, (Vec<Incoming>, String)> {
    let limit = super::MAX_MESSAGE as u64;
    let mut body = Vec::new();
    let read = response
        .body_mut()
        .as_reader()
        .take(limit + 1)
        .read_to_end(&mut body);
    if let Err(err) = read {
        return Err((
            Vec::new(),
            format!("reading the server's answer failed: {err}"),
        ));
    }
    if body.len() as u64 > limit {
        let bytes = body.len();
        return Ok(vec![Incoming::Oversized {
            id: Some(id),
            bytes,
        }]);
    }
    let text = String::from_utf8_lossy(&body);
    let text = text.trim();
    if text.is_empty() {
        return Err((
            Vec::new(),
            "the server accepted the request but sent no answer".to_owned(),
        ));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(batch)) => Ok(batch
            .iter()
            .map(|message| jsonrpc::parse(&message.to_string()))
            .collect()),
        // An error with no id (as for a request it could not parse) in
        // the body that answers request `id` is that request's error.
        Ok(Value::Object(message)) if message.get("id").is_none_or(Value::is_null) => {
            match message.get("error").filter(|e| e.is_object()) {
                Some(error) => Ok(vec![Incoming::Response {
                    id,
                    outcome: Err(jsonrpc::rpc_error(error)),
                }]),
                None => Ok(vec![jsonrpc::parse(text)]),
            }
        }
        _ => Ok(vec![jsonrpc::parse(text)]),
    }
}

/// The messages of an event stream, up to the answer to request `id`.
fn read_events(
    id: u64,
    response: &mut ureq::http::Response<ureq::Body>,
) -> Result<Vec<Incoming>, (Vec<Incoming>, String)> {
    let mut parser = SseParser::new(super::MAX_MESSAGE);
    let mut reader = response.body_mut().as_reader();
    let mut messages = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let mut events = Vec::new();
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) => {
                return Err((messages, format!("the server's event stream broke: {err}")));
            }
        };
        parser.push(&chunk[..n], &mut events);
        for event in events.drain(..) {
            let message = match event {
                Event::Data(data) if data.trim().is_empty() => continue,
                Event::Data(data) => jsonrpc::parse(data.trim()),
                // On a request's own stream, most likely its answer.
                Event::Oversized(bytes) => Incoming::Oversized {
                    id: Some(id),
                    bytes,
                },
            };
            let answered = answers(&message, id);
            messages.push(message);
            if answered {
                return Ok(messages);
            }
        }
    }
    parser.finish();
    Err((
        messages,
        "the server's event stream ended without an answer".to_owned(),
    ))
}

/// Whether `message` is the answer to request `id` (readable or not).
fn answers(message: &Incoming, id: u64) -> bool {
    match message {
        Incoming::Response { id: answered, .. } | Incoming::Malformed { id: answered, .. } => {
            *answered == id
        }
        Incoming::Oversized { id: answered, .. } => *answered == Some(id),
        _ => false,
    }
}

/// An error status as the answer to request `id`: the JSON-RPC error its
/// body holds (whatever id it gives), or one naming the status.
fn status_error(id: u64, status: u16, response: &mut ureq::http::Response<ureq::Body>) -> Incoming {
    let mut body = Vec::new();
    let _ = response
        .body_mut()
        .as_reader()
        .take(ERROR_BODY)
        .read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    let error = serde_json::from_str::<Value>(text.trim())
        .ok()
        .and_then(|body| body.get("error").filter(|e| e.is_object()).cloned())
        .map(|error| jsonrpc::rpc_error(&error));
    let error = error.unwrap_or_else(|| {
        let reason = ureq::http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        let mut said: String = text.trim().chars().take(ERROR_SHOWN).collect();
        if !said.is_empty() {
            said = format!(": {said}");
        }
        RpcError {
            code: HTTP_ERROR,
            message: format!("HTTP {status} {reason}{said}"),
            data: None,
        }
    });
    Incoming::Response {
        id,
        outcome: Err(error),
    }
}

/// A failure below HTTP: no connection fails the server; one that broke
/// fails the request; a timeout is left to the request's deadline, which
/// the client keeps.
fn transport_trouble(host: &str, id: Option<u64>, err: &ureq::Error) -> Option<Trouble> {
    use std::io::ErrorKind as K;
    use ureq::Error as E;
    use ureq::Timeout as T;
    let unreachable = match err {
        E::ConnectionFailed | E::HostNotFound | E::Timeout(T::Connect | T::Resolve) => true,
        E::Io(io) => matches!(
            io.kind(),
            K::ConnectionRefused
                | K::HostUnreachable
                | K::NetworkUnreachable
                | K::AddrNotAvailable
                | K::NotFound
        ),
        _ => false,
    };
    if unreachable {
        return Some(Trouble::Down(format!("cannot connect to {host}: {err}")));
    }
    match (err, id) {
        (E::Timeout(_), _) => None,
        (E::Tls(_) | E::Pem(_) | E::Rustls(_), _) => Some(Trouble::Down(format!(
            "no secure connection to {host}: {err}"
        ))),
        (_, Some(id)) => Some(Trouble::Lost {
            id,
            why: format!("the exchange with {host} broke: {err}"),
        }),
        (_, None) => {
            log::debug!("MCP server at {host}: a notification was not delivered: {err}");
            None
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_host_and_port_never_the_path() {
        let endpoint = ServerLocation::new("https://mcp.example.com:8443/v1/mcp?key=x", Vec::new());
        assert_eq!(endpoint.host, "mcp.example.com:8443");
    }

    #[test]
    fn no_connection_fails_the_server_a_broken_one_the_request_a_timeout_neither() {
        let refused = ureq::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert!(matches!(
            transport_trouble("127.0.0.1:9", Some(1), &refused),
            Some(Trouble::Down(why)) if why.contains("cannot connect to 127.0.0.1:9")
        ));
        let reset = ureq::Error::Io(std::io::ErrorKind::ConnectionReset.into());
        assert!(matches!(
            transport_trouble("h", Some(7), &reset),
            Some(Trouble::Lost { id: 7, .. })
        ));
        let slow = ureq::Error::Timeout(ureq::Timeout::Global);
        assert_eq!(transport_trouble("h", Some(7), &slow), None);
    }
}
