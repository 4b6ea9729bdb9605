//! What the event loop does in each phase of a connection, in the order
//! a connection goes through them: its request head, the name resolved
//! and decided on, the connect, a tunnel's ClientHello, then bytes moved
//! as they are (splice) or through interception.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Interest, Token};

use super::body::Body;
use super::connection::Phase;
use super::event_loop::{epoch_ms, End, EventLoop, ESTABLISHED};
use super::http::{self, SetHeader};
use super::intercept::{Intercept, Step};
use super::reply::drain;
use super::resolver::{Answer, Question};
use super::splice::{Pipe, PumpError};
use super::SandboxId;
use crate::network::policy::Decision;
use crate::network::record::lock;
use crate::network::record::Attempt;
use crate::network::request::{self, Head, ProxyRequest, MAX_HEAD_BYTES};
use crate::network::sni::{self, ClientHello};

/// The longest ClientHello held: one TLS record and its header.
const MAX_HELLO_BYTES: usize = 5 + 16384 + 2048;

/// Names one sandbox may have waiting for (or in) a lookup at once: a
/// sandbox that asks for names whose DNS never answers holds at most this
/// many of the resolver threads, never all of them.
const LOOKUPS_PER_SANDBOX: usize = 4;

impl EventLoop {
    pub(super) fn read_head(&mut self, key: usize) {
        let conn = &mut self.conns[key];
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
                Ok(0) => {
                    // Gone before asking for anything: nothing to record.
                    self.close(key, End::Closed);
                    return;
                }
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
                Err(_) => {
                    self.close(key, End::Closed);
                    return;
                }
            }
        }
        if !ended && conn.held.len() < MAX_HEAD_BYTES {
            return;
        }
        match request::read_head(&conn.held) {
            Head::Incomplete => {}
            Head::Refused(status, reason) => self.refuse(key, status, reason, None),
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
                            return self.refuse(key, 400, error.to_string(), None);
                        }
                    }
                    conn.to_upstream.bound(body);
                    conn.head = head;
                }
                conn.held = rest;
                self.asked(key, request);
            }
        }
    }

    /// The head is read: resolve the name.
    pub(super) fn asked(&mut self, key: usize, request: ProxyRequest) {
        let now = Instant::now();
        let connect_timeout = self.settings.connect_timeout;
        let conn = &mut self.conns[key];
        conn.request = Some(request);
        conn.asked = now;
        conn.at_ms = epoch_ms();
        conn.phase = Phase::Resolving;
        let (host, port) = conn.target();
        let (host, port) = (host.to_owned(), port);
        let id = conn.id;
        // A name the policy never allows is refused before it is looked
        // up: the names a sandbox asks for never reach DNS otherwise.
        let refused = self
            .sandboxes
            .get(&conn.sandbox)
            .and_then(|sandbox| sandbox.policy.decide_name(&host, port));
        if let Some(Decision::Refused(reason)) = refused {
            return self.refuse(key, 403, reason, None);
        }
        self.set_deadline(key, now + connect_timeout);
        if let Ok(address) = host.parse::<IpAddr>() {
            self.resolved(key, Ok(vec![address]));
        } else if let Some(addresses) = self.settings.resolve.get(&host) {
            let addresses = addresses.clone();
            self.resolved(key, Ok(addresses));
        } else if self.lookups_of(self.conns[key].sandbox) >= LOOKUPS_PER_SANDBOX {
            let reason = format!(
                "{LOOKUPS_PER_SANDBOX} names of this sandbox are being looked up already; {host} \
                 was not"
            );
            self.refuse(key, 503, reason, None);
        } else if let Err(question) = self.resolver.ask(Question {
            key,
            id,
            host,
            port,
            wanted: {
                let wanted = Arc::new(AtomicBool::new(true));
                self.conns[key].lookup = Some(Arc::clone(&wanted));
                wanted
            },
        }) {
            let reason = format!(
                "too many names waiting to be resolved; {} was not",
                question.host
            );
            self.refuse(key, 503, reason, None);
        }
    }

    /// How many of `sandbox`'s names wait for (or are in) a lookup.
    /// (A scan: a sandbox has at most `max_connections` open.)
    fn lookups_of(&self, sandbox: SandboxId) -> usize {
        self.conns
            .iter()
            .filter(|(_, conn)| conn.sandbox == sandbox && conn.lookup.is_some())
            .count()
    }

    pub(super) fn answered(&mut self, answer: Answer) {
        if self
            .conns
            .get(answer.key)
            .is_some_and(|conn| conn.id == answer.id && conn.phase == Phase::Resolving)
        {
            self.resolved(answer.key, answer.addresses);
        }
    }

    /// Decides on each address in turn; connects to the first allowed.
    pub(super) fn resolved(&mut self, key: usize, addresses: Result<Vec<IpAddr>, String>) {
        self.conns[key].lookup = None;
        let conn = &self.conns[key];
        let (host, port) = conn.target();
        let host = host.to_owned();
        let addresses = match addresses {
            Ok(addresses) if !addresses.is_empty() => addresses,
            Ok(_) => return self.refuse(key, 502, format!("{host} has no addresses"), None),
            Err(why) => return self.refuse(key, 502, why, None),
        };
        let Some(sandbox) = self.sandboxes.get(&conn.sandbox) else {
            return self.close(key, End::Closed);
        };
        let mut first_refusal = None;
        let mut candidates = std::collections::VecDeque::new();
        for address in &addresses {
            match sandbox.policy.decide(&host, *address, port) {
                Decision::Allowed => candidates.push_back(SocketAddr::new(*address, port)),
                Decision::Refused(why) => {
                    first_refusal.get_or_insert(why);
                }
            }
        }
        if candidates.is_empty() {
            let reason = first_refusal.unwrap_or_else(|| "refused".into());
            return self.refuse(key, 403, reason, Some(addresses[0]));
        }
        let conn = &mut self.conns[key];
        conn.candidates = candidates;
        conn.address = conn.candidates.front().copied();
        conn.recorded = true;
        let attempt = Attempt {
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
        };
        if let Some(sandbox) = self.sandboxes.get(&conn.sandbox) {
            lock(&sandbox.record).attempted(attempt);
        }
        self.connect_next(key, None);
    }

    /// Starts connecting to the next allowed address; `failed` is why the
    /// last one could not be reached, if one was tried.
    pub(super) fn connect_next(&mut self, key: usize, failed: Option<io::Error>) {
        let conn = &mut self.conns[key];
        let mut last_error = failed;
        while let Some(address) = conn.candidates.pop_front() {
            conn.address = Some(address);
            match TcpStream::connect(address) {
                Ok(mut stream) => {
                    match self.poll.registry().register(
                        &mut stream,
                        Token(key << 1 | 1),
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        Ok(()) => {
                            conn.upstream = Some(stream);
                            conn.phase = Phase::Connecting;
                            return;
                        }
                        Err(e) => last_error = Some(e),
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        let (host, port) = conn.target();
        let reason = format!(
            "{host}:{port} could not be reached: {}",
            last_error.map_or_else(|| "no address".into(), |e| e.to_string())
        );
        self.fail(key, 502, reason);
    }

    /// The upstream socket is ready while connecting: connected, or failed.
    pub(super) fn connecting(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        let Some(upstream) = conn.upstream.as_mut() else {
            return;
        };
        match upstream.take_error() {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => {
                conn.upstream = None;
                return self.connect_next(key, Some(e));
            }
        }
        match upstream.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
            Err(e) => {
                conn.upstream = None;
                return self.connect_next(key, Some(e));
            }
        }
        let _ = upstream.set_nodelay(true);
        let _ = conn.client.set_nodelay(true);
        conn.deadline = None;
        let request = conn.request.clone();
        match request {
            Some(ProxyRequest::Connect { host, .. }) => {
                if let Some(set) = self.credentials.get(&host).cloned() {
                    self.start_intercept(key, &host, set);
                } else {
                    conn.to_client.queue(ESTABLISHED, false);
                    conn.phase = Phase::Hello;
                    self.hello(key);
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
                self.splice(key, true, true);
            }
            None => self.close(key, End::Closed),
        }
    }

    /// A tunnel's first bytes from the client are held until they show
    /// where its TLS goes; bytes from upstream flow meanwhile.
    pub(super) fn hello(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        let (Some(upstream), client) = (conn.upstream.as_mut(), &mut conn.client) else {
            return;
        };
        if let Err(e) = conn.to_client.pump(upstream, client, &mut self.scratch) {
            return self.close(key, End::Failed(format!("connection lost: {e}")));
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
                Err(e) => return self.close(key, End::Failed(format!("connection lost: {e}"))),
            }
        }
        let (host, _) = conn.target();
        let verdict = match sni::read_client_hello(&conn.held) {
            _ if conn.held.is_empty() && !ended => return,
            ClientHello::NotTls => Ok(()),
            _ if conn.held.is_empty() => Ok(()),
            ClientHello::Incomplete if conn.held.len() >= MAX_HELLO_BYTES || ended => {
                Err("a TLS ClientHello that does not end".to_owned())
            }
            ClientHello::Incomplete => {
                if conn.deadline.is_none() {
                    let at = Instant::now() + self.settings.head_timeout;
                    self.set_deadline(key, at);
                }
                return;
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
                self.splice(key, true, true);
            }
            Err(reason) => self.close(key, End::Refused(reason)),
        }
    }

    /// Moves bytes on a tunnel or a forwarded request, the ways asked.
    pub(super) fn splice(&mut self, key: usize, towards_upstream: bool, towards_client: bool) {
        let conn = &mut self.conns[key];
        let Some(upstream) = conn.upstream.as_mut() else {
            return;
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
                return self.close_answering(key, End::Refused(e.to_string()), status);
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
                return self.close(key, End::Closed)
            }
            Err(e) => return self.close(key, End::Failed(format!("connection lost: {e}"))),
            Ok(()) => {}
        }
        let done = |pipe: &Pipe| pipe.eof && pipe.shut && !pipe.is_blocked();
        if done(&conn.to_upstream) && done(&conn.to_client) {
            self.close(key, End::Closed);
        }
    }

    pub(super) fn start_intercept(&mut self, key: usize, host: &str, set: Vec<SetHeader>) {
        let server = match self.authority.server_config(host) {
            Ok(server) => server,
            Err(e) => {
                return self.fail(key, 502, format!("intercepting {host}: {e}"));
            }
        };
        // What the client sent right after its CONNECT head is the start
        // of its TLS.
        let early = std::mem::take(&mut self.conns[key].held);
        let port = self.conns[key].target().1;
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
                let conn = &mut self.conns[key];
                conn.intercept = Some(Box::new(intercept));
                conn.phase = Phase::Intercept;
                // Both handshakes must be done within a head's time.
                let at = Instant::now() + self.settings.head_timeout;
                self.set_deadline(key, at);
                self.intercept(key);
            }
            Err(reason) => self.fail(key, 502, reason),
        }
    }

    pub(super) fn intercept(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        let (Some(intercept), Some(upstream)) = (conn.intercept.as_mut(), conn.upstream.as_mut())
        else {
            return;
        };
        match intercept.drive(&mut conn.client, upstream, &mut self.scratch) {
            Ok(Step::Open) => {
                if conn.deadline.is_some() && !intercept.handshaking() {
                    conn.deadline = None;
                }
            }
            Ok(Step::Refused(reason)) => {
                // Recorded before the client can read the answer, as every
                // refusal is; then the tunnel goes on to its end.
                if let Some(sandbox) = self.sandboxes.get_mut(&conn.sandbox) {
                    lock(&sandbox.record).refused_after(conn.id, reason.clone());
                    if sandbox.log.allow() {
                        let (host, port) = conn.target();
                        log::warn!(
                            "network: {} refused a request to {host}:{port}: {reason}",
                            sandbox.label
                        );
                    }
                }
                self.intercept(key);
            }
            Ok(Step::Done) => {
                // Bytes from the client left unread would make the close a
                // reset, which can lose the last answer (a refusal's).
                drain(&mut conn.client);
                self.close(key, End::Closed);
            }
            Err(reason) => self.close(key, End::Failed(reason)),
        }
    }
}

/// `[v6]` for an IPv6 address, the host as it is otherwise.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}
