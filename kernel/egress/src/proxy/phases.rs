//! What is done with a connection in each phase, in the order a
//! connection goes through them: its request head, the name decided on
//! and resolved, the connect, a tunnel's ClientHello, then bytes moved as
//! they are (splice) or through interception.
//!
//! A phase works on one connection and the little of the loop's it needs
//! ([`At`]), and answers what the loop is to do with the connection next
//! ([`Next`]): wait, look its name up, refuse it or close it. The loop
//! owns every connection and ends them all the same way; the phases own
//! what only they use (the credentials, the certificate authority, the
//! names answered without DNS, the buffer bytes move through).

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use mio::net::TcpStream;
use mio::{Interest, Registry};
use rustls::ClientConfig;

use super::body::Body;
use super::connection::{epoch_ms, Conn, End, Phase, Timer};
use super::http::{self, SetHeader};
use super::intercept::{Intercept, TunnelState};
use super::reply::drain;
use super::resolver::Unresolved;
use super::served::Served;
use super::settings::ProxySettings;
use super::splice::{Pipe, PumpError, SCRATCH_BYTES};
use super::tls::Authority;
use crate::policy::Decision;
use crate::record::Attempt;
use crate::request::{self, Head, ProxyRequest, MAX_HEAD_BYTES};
use crate::sni::{self, ClientHello};

/// The answer to a CONNECT once the upstream is connected.
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// The longest ClientHello held: one TLS record and its header.
const MAX_HELLO_BYTES: usize = 5 + 16384 + 2048;

/// What the phases work with besides the connection.
#[derive(Debug)]
pub struct Phases {
    /// The headers added for each host with a credential (lower case).
    credentials: HashMap<String, Vec<SetHeader>>,
    /// Signs the leaves an intercepted tunnel's client is shown.
    authority: Authority,
    /// How an intercepted tunnel's TLS towards the server is begun.
    upstream_tls: Arc<ClientConfig>,
    /// Names answered without DNS (`[network] resolve`).
    resolve: HashMap<String, Vec<IpAddr>>,
    head_timeout: Duration,
    connect_timeout: Duration,
    /// Where bytes moved by copying pass through.
    scratch: Vec<u8>,
}

/// One connection as a phase works on it, and what of the loop's it may
/// touch.
#[derive(Debug)]
pub struct At<'a> {
    pub conn: &'a mut Conn,
    /// The endpoint it came in on (gone only while it is being forgotten).
    pub served: Option<&'a mut Served>,
    /// Where its upstream socket is watched.
    pub registry: &'a Registry,
    /// Where its deadlines are kept.
    pub timers: &'a mut Timers<Timer>,
}

/// What the loop does with a connection once a phase is done with it.
#[derive(Debug)]
pub enum Next {
    /// Nothing for now: it waits for its sockets or its deadline.
    Wait,
    /// Its name goes to the resolver (its phase is `Resolving`).
    Resolve,
    /// Refused before anything was allowed: the status and reason go to
    /// the client, the attempt (with the address refused, if one was) to
    /// the record.
    Refuse(u16, String, Option<IpAddr>),
    /// Closed as the end says, the client told the status first if one is
    /// given (and the end's reason).
    Close(End, Option<u16>),
}

impl Next {
    fn close(end: End) -> Next {
        Next::Close(end, None)
    }

    /// An allowed connection ends before the client was answered: the
    /// record says why, then the client hears `status` and why.
    fn fail(status: u16, reason: String) -> Next {
        Next::Close(End::Failed(reason), Some(status))
    }
}

impl Phases {
    /// The phases as `settings` configure them; an intercepted tunnel is
    /// signed by `authority` and begun towards the server with
    /// `upstream_tls`.
    pub fn new(
        settings: &ProxySettings,
        authority: Authority,
        upstream_tls: Arc<ClientConfig>,
    ) -> Phases {
        let mut credentials: HashMap<String, Vec<SetHeader>> = HashMap::new();
        for credential in &settings.credentials {
            credentials
                .entry(credential.host.to_ascii_lowercase())
                .or_default()
                .push(SetHeader {
                    name: credential.header.clone(),
                    value: credential.value.clone(),
                });
        }
        Phases {
            credentials,
            authority,
            upstream_tls,
            resolve: settings.resolve.clone(),
            head_timeout: settings.head_timeout,
            connect_timeout: settings.connect_timeout,
            scratch: vec![0; SCRATCH_BYTES],
        }
    }

    /// A connection was accepted: its head must come within the head
    /// timeout.
    pub fn accepted(&self, conn: &mut Conn, timers: &mut Timers<Timer>) {
        conn.set_deadline(Instant::now() + self.head_timeout, timers);
    }

    /// Connection `conn`'s deadline has passed: what that means in its
    /// phase.
    pub fn timed_out(&self, conn: &Conn) -> Next {
        let head_ms = self.head_timeout.as_millis();
        match conn.phase {
            Phase::Head => Next::Refuse(
                408,
                format!("no whole request head within {head_ms} ms"),
                None,
            ),
            Phase::Resolving | Phase::Connecting => {
                let (host, port) = conn.target();
                let reason = format!(
                    "{host}:{port} was not reached within {} ms",
                    self.connect_timeout.as_millis()
                );
                if conn.recorded {
                    Next::fail(504, reason)
                } else {
                    Next::Refuse(504, reason, None)
                }
            }
            Phase::Hello => Next::close(End::Refused(format!(
                "no whole TLS ClientHello within {head_ms} ms"
            ))),
            Phase::Intercept => {
                Next::close(End::Failed(format!("no TLS handshake within {head_ms} ms")))
            }
            Phase::Splice => Next::Wait,
        }
    }

    /// Reads the client's request head, and acts on it once it is whole.
    pub fn read_head(&mut self, at: &mut At<'_>) -> Next {
        let conn = &mut *at.conn;
        // Only new bytes (and the three before them) can end the head: a
        // head trickled a byte at a time is not scanned whole each time.
        let mut scan_from = conn.held.len().saturating_sub(3);
        let mut ended = false;
        let mut chunk = [0u8; 4096];
        loop {
            let room = (MAX_HEAD_BYTES + 1)
                .saturating_sub(conn.held.len())
                .min(chunk.len());
            if room == 0 {
                break;
            }
            match conn.client.read(&mut chunk[..room]) {
                // Gone before asking for anything: nothing to record.
                Ok(0) => return Next::close(End::Closed),
                Ok(n) => {
                    conn.held.extend_from_slice(&chunk[..n]);
                    // Its end decides the head, and so does a byte no
                    // head may hold: that one is refused at once.
                    ended = !matches!(request::head_end(&conn.held, scan_from), Ok(None));
                    scan_from = conn.held.len().saturating_sub(3);
                    if ended {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Next::close(End::Closed),
            }
        }
        if !ended && conn.held.len() < MAX_HEAD_BYTES {
            return Next::Wait;
        }
        match request::read_head(&conn.held) {
            Head::Incomplete => Next::Wait,
            Head::Refused(status, reason) => Next::Refuse(status, reason, None),
            Head::Complete(request, length) => {
                let mut rest = conn.held.split_off(length.min(conn.held.len()));
                let head = std::mem::take(&mut conn.held);
                // A plain request's head is rewritten when it is sent, and
                // only its body follows it: a request pipelined behind it
                // could name another host, and a server need not honour
                // the `Connection: close` it is sent. For CONNECT, what
                // follows the head is the tunnel's first bytes.
                if let ProxyRequest::Forward { framing, .. } = &request {
                    let mut body = Body::new(*framing);
                    match body.take(&rest) {
                        Ok(n) => rest.truncate(n),
                        Err(error) => {
                            conn.request = Some(request);
                            return Next::Refuse(400, error.to_string(), None);
                        }
                    }
                    conn.to_upstream.bound(body);
                    conn.head = head;
                }
                conn.held = rest;
                self.asked(at, request)
            }
        }
    }

    /// The head is read: decide on the name, then resolve it.
    fn asked(&mut self, at: &mut At<'_>, request: ProxyRequest) -> Next {
        let now = Instant::now();
        let conn = &mut *at.conn;
        conn.request = Some(request);
        conn.asked = now;
        conn.at_ms = epoch_ms();
        conn.phase = Phase::Resolving;
        let (host, port) = conn.target();
        let (host, port) = (host.to_owned(), port);
        // A name the policy never allows is refused before it is looked
        // up: the names a sandbox asks for never reach DNS otherwise.
        let refused = at
            .served
            .as_deref()
            .and_then(|served| served.policy().decide_name(&host, port));
        if let Some(Decision::Refused(reason)) = refused {
            return Next::Refuse(403, reason, None);
        }
        conn.set_deadline(now + self.connect_timeout, at.timers);
        if let Ok(address) = host.parse::<IpAddr>() {
            self.resolved(at, Ok(vec![address]))
        } else if let Some(addresses) = self.resolve.get(&host) {
            let addresses = addresses.clone();
            self.resolved(at, Ok(addresses))
        } else {
            Next::Resolve
        }
    }

    /// Decides on each address in turn; connects to the first allowed.
    pub fn resolved(
        &mut self,
        at: &mut At<'_>,
        addresses: Result<Vec<IpAddr>, Unresolved>,
    ) -> Next {
        let conn = &mut *at.conn;
        conn.lookup = None;
        let (host, port) = conn.target();
        let host = host.to_owned();
        let addresses = match addresses {
            Ok(addresses) if !addresses.is_empty() => addresses,
            Ok(_) => return Next::Refuse(502, format!("{host} has no addresses"), None),
            Err(why) => return Next::Refuse(502, why.to_string(), None),
        };
        let Some(served) = at.served.as_deref_mut() else {
            return Next::close(End::Closed);
        };
        let mut first_refusal = None;
        let mut candidates = VecDeque::new();
        for address in &addresses {
            match served.policy().decide(&host, *address, port) {
                Decision::Allowed => candidates.push_back(SocketAddr::new(*address, port)),
                Decision::Refused(why) => {
                    first_refusal.get_or_insert(why);
                }
            }
        }
        if candidates.is_empty() {
            let reason = first_refusal.unwrap_or_else(|| "refused".into());
            return Next::Refuse(403, reason, Some(addresses[0]));
        }
        conn.candidates = candidates;
        conn.address = conn.candidates.front().copied();
        conn.recorded = true;
        served.allowed(Attempt {
            id: conn.id,
            at_ms: conn.at_ms,
            host,
            port,
            address: conn.address.map(|a| a.ip().to_string()),
            allowed: true,
            reason: None,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0,
        });
        connect_next(at, None)
    }

    /// The upstream socket is ready while connecting: connected, or failed.
    pub fn connecting(&mut self, at: &mut At<'_>) -> Next {
        let conn = &mut *at.conn;
        let Some(upstream) = conn.upstream.as_mut() else {
            return Next::Wait;
        };
        match upstream.take_error() {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => {
                conn.upstream = None;
                return connect_next(at, Some(e));
            }
        }
        match upstream.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return Next::Wait,
            Err(e) => {
                conn.upstream = None;
                return connect_next(at, Some(e));
            }
        }
        let _ = upstream.set_nodelay(true);
        let _ = conn.client.set_nodelay(true);
        conn.deadline = None;
        let request = conn.request.clone();
        match request {
            Some(ProxyRequest::Connect { host, .. }) => {
                if let Some(set) = self.credentials.get(&host).cloned() {
                    self.start_intercept(at, &host, set)
                } else {
                    conn.to_client.queue(ESTABLISHED, false);
                    conn.phase = Phase::Hello;
                    self.hello(at)
                }
            }
            Some(ProxyRequest::Forward {
                method,
                host,
                port,
                target,
                ..
            }) => {
                let authority = if port == 80 {
                    bracketed(&host)
                } else {
                    format!("{}:{port}", bracketed(&host))
                };
                // Credentials go only inside TLS the proxy verified: never
                // in the clear, where anything on the path reads them.
                let head = http::forward_head(&conn.head, &method, &target, &authority, &[]);
                conn.head = Vec::new();
                let body = std::mem::take(&mut conn.held);
                conn.to_upstream.queue(&head, true);
                conn.to_upstream.queue(&body, true);
                conn.phase = Phase::Splice;
                self.splice(at, true, true)
            }
            None => Next::close(End::Closed),
        }
    }

    /// A tunnel's first bytes from the client are held until they show
    /// where its TLS goes; bytes from upstream flow meanwhile.
    pub fn hello(&mut self, at: &mut At<'_>) -> Next {
        let conn = &mut *at.conn;
        let (Some(upstream), client) = (conn.upstream.as_mut(), &mut conn.client) else {
            return Next::Wait;
        };
        if let Err(e) = conn.to_client.pump(upstream, client, &mut self.scratch) {
            return Next::close(End::Failed(format!("connection lost: {e}")));
        }
        let mut ended = false;
        let mut chunk = [0u8; 4096];
        while conn.held.len() < MAX_HELLO_BYTES {
            let room = (MAX_HELLO_BYTES - conn.held.len()).min(chunk.len());
            match conn.client.read(&mut chunk[..room]) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => conn.held.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Next::close(End::Failed(format!("connection lost: {e}"))),
            }
        }
        let (host, _) = conn.target();
        let verdict = match sni::read_client_hello(&conn.held) {
            _ if conn.held.is_empty() && !ended => return Next::Wait,
            ClientHello::NotTls => Ok(()),
            _ if conn.held.is_empty() => Ok(()),
            ClientHello::Incomplete if conn.held.len() >= MAX_HELLO_BYTES || ended => {
                Err("a TLS ClientHello that does not end".to_owned())
            }
            ClientHello::Incomplete => {
                if conn.deadline.is_none() {
                    conn.set_deadline(Instant::now() + self.head_timeout, at.timers);
                }
                return Next::Wait;
            }
            ClientHello::ServerName(name)
                if name.trim_end_matches('.').eq_ignore_ascii_case(host) =>
            {
                Ok(())
            }
            ClientHello::ServerName(name) => Err(format!(
                "TLS server name {name} does not match CONNECT host {host}"
            )),
            ClientHello::NoServerName if host.parse::<IpAddr>().is_ok() => Ok(()),
            ClientHello::NoServerName => Err(format!(
                "a TLS ClientHello without a server name, for CONNECT host {host}"
            )),
            ClientHello::Malformed(why) => Err(format!("a malformed TLS ClientHello: {why}")),
        };
        match verdict {
            Ok(()) => {
                let held = std::mem::take(&mut conn.held);
                conn.to_upstream.queue(&held, true);
                conn.deadline = None;
                conn.phase = Phase::Splice;
                self.splice(at, true, true)
            }
            Err(reason) => Next::close(End::Refused(reason)),
        }
    }

    /// Moves bytes on a tunnel or a forwarded request, the ways asked.
    pub fn splice(
        &mut self,
        at: &mut At<'_>,
        towards_upstream: bool,
        towards_client: bool,
    ) -> Next {
        let conn = &mut *at.conn;
        let Some(upstream) = conn.upstream.as_mut() else {
            return Next::Wait;
        };
        let scratch = &mut self.scratch;
        let mut result = Ok(());
        // A side is read only while its peer takes what it gets.
        if towards_upstream || conn.to_upstream.is_blocked() {
            result = conn
                .to_upstream
                .pump(&mut conn.client, upstream, scratch)
                .map(drop);
        }
        if result.is_ok() && (towards_client || conn.to_client.is_blocked()) {
            result = conn
                .to_client
                .pump(upstream, &mut conn.client, scratch)
                .map(drop);
        }
        match result {
            // A plain request's body the proxy cannot frame as any server
            // would: the client hears why, unless the server has begun
            // its answer already.
            Err(PumpError::Body(e)) => {
                let answered = conn.to_client.moved > 0 || conn.to_client.is_blocked();
                let status = (!answered).then_some(400);
                return Next::Close(End::Refused(e.to_string()), status);
            }
            // A peer that resets or stops reading ends a connection as
            // surely as one that closes it: clients do it all the time
            // once they have what they wanted.
            Err(PumpError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ) =>
            {
                return Next::close(End::Closed)
            }
            Err(e) => return Next::close(End::Failed(format!("connection lost: {e}"))),
            Ok(()) => {}
        }
        let done = |pipe: &Pipe| pipe.eof && pipe.shut && !pipe.is_blocked();
        if done(&conn.to_upstream) && done(&conn.to_client) {
            Next::close(End::Closed)
        } else {
            Next::Wait
        }
    }

    /// A tunnel to a host with a credential: TLS is ended here and begun
    /// again towards the server, with `set` added to each request.
    fn start_intercept(&mut self, at: &mut At<'_>, host: &str, set: Vec<SetHeader>) -> Next {
        let server = match self.authority.server_config(host) {
            Ok(server) => server,
            Err(e) => return Next::fail(502, format!("intercepting {host}: {e}")),
        };
        let conn = &mut *at.conn;
        // What the client sent right after its CONNECT head is the start
        // of its TLS.
        let early = std::mem::take(&mut conn.held);
        let port = conn.target().1;
        let authority = if port == 443 {
            host.to_owned()
        } else {
            format!("{host}:{port}")
        };
        match Intercept::new(
            host,
            authority,
            server,
            self.upstream_tls.clone(),
            set,
            ESTABLISHED,
            &early,
        ) {
            Ok(intercept) => {
                conn.intercept = Some(Box::new(intercept));
                conn.phase = Phase::Intercept;
                // Both handshakes must be done within a head's time.
                conn.set_deadline(Instant::now() + self.head_timeout, at.timers);
                self.intercept(at)
            }
            Err(reason) => Next::fail(502, reason.to_string()),
        }
    }

    /// Drives an intercepted tunnel's two TLS sessions as far as they go.
    pub fn intercept(&mut self, at: &mut At<'_>) -> Next {
        loop {
            let conn = &mut *at.conn;
            let (Some(intercept), Some(upstream)) =
                (conn.intercept.as_mut(), conn.upstream.as_mut())
            else {
                return Next::Wait;
            };
            match intercept.drive(&mut conn.client, upstream, &mut self.scratch) {
                Ok(TunnelState::Open) => {
                    if conn.deadline.is_some() && !intercept.handshaking() {
                        conn.deadline = None;
                    }
                    return Next::Wait;
                }
                Ok(TunnelState::Refused(reason)) => {
                    // Recorded before the client can read the answer, as
                    // every refusal is; then the tunnel goes on to its end.
                    if let Some(served) = at.served.as_deref_mut() {
                        served.refused_in_tunnel(conn, &reason);
                    }
                }
                Ok(TunnelState::Done) => {
                    // Bytes from the client left unread would make the close
                    // a reset, which can lose the last answer (a refusal's).
                    drain(&mut conn.client);
                    return Next::close(End::Closed);
                }
                Err(reason) => return Next::close(End::Failed(reason.to_string())),
            }
        }
    }
}

/// Starts connecting to the next allowed address; `failed` is why the
/// last one could not be reached, if one was tried.
fn connect_next(at: &mut At<'_>, failed: Option<io::Error>) -> Next {
    let conn = &mut *at.conn;
    let mut last_error = failed;
    while let Some(address) = conn.candidates.pop_front() {
        conn.address = Some(address);
        match TcpStream::connect(address) {
            Ok(mut stream) => match at.registry.register(
                &mut stream,
                Conn::token(conn.key, true),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                Ok(()) => {
                    conn.upstream = Some(stream);
                    conn.phase = Phase::Connecting;
                    return Next::Wait;
                }
                Err(e) => last_error = Some(e),
            },
            Err(e) => last_error = Some(e),
        }
    }
    let (host, port) = conn.target();
    let reason = format!(
        "{host}:{port} could not be reached: {}",
        last_error.map_or_else(|| "no address".into(), |e| e.to_string())
    );
    Next::fail(502, reason)
}

/// `[v6]` for an IPv6 address, the host as it is otherwise.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}
