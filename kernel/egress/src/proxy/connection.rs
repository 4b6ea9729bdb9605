//! One client connection through the proxy, as the event loop keeps it:
//! which phase it is in, what it asked for, where it goes, and the bytes
//! on their way. What each phase does is in `phases`; how a connection
//! ends is an [`End`], which the loop writes to the endpoint's record.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use agentos_primitives::timers::Timers;
use mio::net::TcpStream;
use mio::Token;

use super::intercept::Intercept;
use super::settings::EndpointId;
use super::splice::Pipe;
use crate::request::ProxyRequest;

/// Where a connection is, in the order it goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the request head (within `head_timeout`).
    Head,
    /// The name is with a resolver thread.
    Resolving,
    /// Connecting upstream (within `connect_timeout` of the head).
    Connecting,
    /// A tunnel is up; the client's first bytes are held until they show
    /// a TLS server name that matches the host (or are not TLS).
    Hello,
    /// Bytes move both ways as they are.
    Splice,
    /// TLS is ended and begun again to add a credential.
    Intercept,
}

/// How a connection ends, for the record.
#[derive(Debug)]
pub enum End {
    /// Both sides closed.
    Closed,
    /// An allowed connection failed or was closed by the proxy.
    Failed(String),
    /// Refused after it was allowed (the TLS server name).
    Refused(String),
}

/// What a connection's timer carries: its id, then its slot, so that a
/// timer left by an earlier connection in the same slot is told apart.
pub type Timer = (u64, usize);

/// A client connection.
#[derive(Debug)]
pub struct Conn {
    /// Unique in a boot: the record's attempt id, and what timers and
    /// resolver answers carry so that a reused slot is not mistaken.
    pub id: u64,
    /// Its slot in the loop's connections, which its sockets' tokens
    /// carry.
    pub key: usize,
    pub endpoint: EndpointId,
    pub client: TcpStream,
    pub upstream: Option<TcpStream>,
    pub phase: Phase,
    /// The head while it is read; then the client's bytes after it, held.
    pub held: Vec<u8>,
    /// A plain request's head, as the client sent it, until it is
    /// rewritten and sent upstream.
    pub head: Vec<u8>,
    pub request: Option<ProxyRequest>,
    /// Addresses still to try, all allowed by the policy.
    pub candidates: VecDeque<SocketAddr>,
    /// The address connected to (or being connected to).
    pub address: Option<SocketAddr>,
    /// Whether an allowed attempt is in the record (so its end is too).
    pub recorded: bool,
    /// When it asked (its head was read), and the same in ms since epoch.
    pub asked: Instant,
    pub at_ms: u64,
    pub deadline: Option<Instant>,
    pub to_upstream: Pipe,
    pub to_client: Pipe,
    pub intercept: Option<Box<Intercept>>,
    /// Bytes already added to the record, out and in.
    pub reported: (u64, u64),
    /// Its name's lookup, while one is queued or under way: cleared when
    /// the connection goes, so a resolver thread skips it.
    pub lookup: Option<Arc<AtomicBool>>,
}

impl Conn {
    /// Connection `id` in slot `key`, accepted on `endpoint` at `now`.
    pub fn new(id: u64, key: usize, endpoint: EndpointId, client: TcpStream, now: Instant) -> Conn {
        Conn {
            id,
            key,
            endpoint,
            client,
            upstream: None,
            phase: Phase::Head,
            held: Vec::new(),
            head: Vec::new(),
            request: None,
            candidates: VecDeque::new(),
            address: None,
            recorded: false,
            asked: now,
            at_ms: 0,
            deadline: None,
            to_upstream: Pipe::default(),
            to_client: Pipe::default(),
            intercept: None,
            reported: (0, 0),
            lookup: None,
        }
    }

    /// The token of a connection's client socket (`upstream` false) or
    /// upstream socket: its slot times two, plus one for the upstream.
    pub fn token(key: usize, upstream: bool) -> Token {
        Token(key << 1 | usize::from(upstream))
    }

    /// The slot, and whether it is the upstream socket's, that a
    /// connection's token names.
    pub fn of_token(token: usize) -> (usize, bool) {
        (token >> 1, token & 1 == 1)
    }

    /// The host and port asked for (empty before the head is read).
    pub fn target(&self) -> (&str, u16) {
        match &self.request {
            Some(ProxyRequest::Connect { host, port })
            | Some(ProxyRequest::Forward { host, port, .. }) => (host, *port),
            None => ("", 0),
        }
    }

    /// Bytes moved so far: to the upstream, and from it.
    pub fn bytes(&self) -> (u64, u64) {
        match &self.intercept {
            Some(intercept) => (intercept.bytes_out, intercept.bytes_in),
            None => (self.to_upstream.moved, self.to_client.moved),
        }
    }

    /// It must be past its present wait by `at`: a timer for it goes into
    /// `timers` (an earlier one, left there, finds the deadline moved).
    pub fn set_deadline(&mut self, at: Instant, timers: &mut Timers<Timer>) {
        self.deadline = Some(at);
        timers.schedule(at, (self.id, self.key));
    }
}

/// Now, in milliseconds since the Unix epoch, as the record keeps times.
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
