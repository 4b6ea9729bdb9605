//! An intercepted tunnel: TLS ended at the proxy with a leaf for the host
//! (signed by the per-boot CA the sandbox trusts), TLS begun again to the
//! real server (verified against the roots), and every request head in
//! between given the host's credential. rustls's sans-IO connections are
//! driven by the event loop on the same non-blocking sockets as a plain
//! tunnel. A request the proxy refuses ends the tunnel: the client hears
//! the refusal inside its TLS, and the server nothing more.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::{InvalidDnsNameError, ServerName};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

use super::http::{Refusal, Requests, SetHeader};
use super::reply;

/// Plaintext held for one side before the other is read no further.
const HELD_PLAINTEXT: usize = 64 * 1024;

/// Both TLS sessions of an intercepted tunnel.
pub struct Intercept {
    client: ServerConnection,
    upstream: ClientConnection,
    requests: Requests,
    /// Written to the client before its TLS: the `200` to the CONNECT.
    preamble: Vec<u8>,
    /// Plaintext read but not yet taken by the other side's TLS.
    to_upstream: Vec<u8>,
    to_client: Vec<u8>,
    client_side: Side,
    upstream_side: Side,
    /// A request was refused: nothing more is read from either side.
    refused: bool,
    /// TLS bytes written to and read from the upstream socket.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl std::fmt::Debug for Intercept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercept")
            .field("requests", &self.requests.count)
            .field("bytes_out", &self.bytes_out)
            .field("bytes_in", &self.bytes_in)
            .finish_non_exhaustive()
    }
}

/// How far one side's TLS session has come to its end.
#[derive(Debug, Default, Clone, Copy)]
struct Side {
    /// It has sent all it will (close_notify or a closed socket).
    ended: bool,
    /// The proxy has sent it close_notify.
    notified: bool,
    /// ... and shut its socket's write side after the last bytes went.
    shut: bool,
}

/// Whether the tunnel is still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelState {
    Open,
    Done,
    /// A request was refused, for this reason; the tunnel is ending, its
    /// answer not yet written (the refusal is recorded first).
    Refused(String),
}

/// Why an intercepted tunnel cannot be set up or go on (the record keeps
/// it as the connection's end): which side, and its socket's or its TLS's
/// error.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    /// The host cannot be named in a ClientHello.
    #[error("{host} is not a TLS server name: {error}")]
    ServerName {
        host: String,
        error: InvalidDnsNameError,
    },
    /// The session towards the server cannot be begun.
    #[error("TLS towards {host}: {error}")]
    Upstream { host: String, error: rustls::Error },
    /// The session towards the client cannot be begun or written to.
    #[error("TLS towards the client: {0}")]
    TowardsClient(Broken),
    /// What the client sent cannot be read.
    #[error("TLS from the client: {0}")]
    FromClient(Broken),
    /// The session towards the server cannot be written to.
    #[error("TLS towards the server: {0}")]
    TowardsServer(io::Error),
    /// What the server sent cannot be read.
    #[error("TLS from the server: {0}")]
    FromServer(Broken),
    /// Writing to the client's socket.
    #[error("client: {0}")]
    Client(io::Error),
    /// Writing to the server's socket.
    #[error("server: {0}")]
    Server(io::Error),
}

/// What broke a TLS session: its socket, or the TLS it read.
#[derive(Debug, thiserror::Error)]
pub enum Broken {
    #[error(transparent)]
    Socket(#[from] io::Error),
    #[error(transparent)]
    Tls(#[from] rustls::Error),
}

impl Intercept {
    /// Sets up both sessions for `host` (reached at `authority`, its
    /// port added unless 443); `preamble` goes to the client first, in
    /// the clear; `early` is what the client sent already.
    pub fn new(
        host: &str,
        authority: String,
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        set: Vec<SetHeader>,
        preamble: &[u8],
        early: &[u8],
    ) -> Result<Intercept, InterceptError> {
        let name =
            ServerName::try_from(host.to_owned()).map_err(|error| InterceptError::ServerName {
                host: host.to_owned(),
                error,
            })?;
        let mut towards_client =
            ServerConnection::new(server).map_err(|e| InterceptError::TowardsClient(e.into()))?;
        let mut early = early;
        while !early.is_empty() {
            towards_client
                .read_tls(&mut early)
                .map_err(|e| InterceptError::FromClient(e.into()))?;
            towards_client
                .process_new_packets()
                .map_err(|e| InterceptError::FromClient(e.into()))?;
        }
        Ok(Intercept {
            client: towards_client,
            upstream: ClientConnection::new(client, name).map_err(|error| {
                InterceptError::Upstream {
                    host: host.to_owned(),
                    error,
                }
            })?,
            requests: Requests::new(authority, set),
            preamble: preamble.to_vec(),
            to_upstream: Vec::new(),
            to_client: Vec::new(),
            client_side: Side::default(),
            upstream_side: Side::default(),
            refused: false,
            bytes_out: 0,
            bytes_in: 0,
        })
    }

    /// Moves whatever can move now, both ways. An error ends the tunnel
    /// and says why.
    pub fn drive(
        &mut self,
        client: &mut TcpStream,
        upstream: &mut TcpStream,
        scratch: &mut [u8],
    ) -> Result<TunnelState, InterceptError> {
        if !self
            .flush_preamble(client)
            .map_err(InterceptError::Client)?
        {
            return Ok(TunnelState::Open);
        }
        loop {
            let mut progress = false;

            // The client's requests, rewritten, towards the server.
            if self.to_upstream.len() < HELD_PLAINTEXT && !self.client_side.ended {
                let (read, ended) =
                    read_tls(&mut self.client, client).map_err(InterceptError::FromClient)?;
                progress |= read > 0 || ended;
                self.client_side.ended |= ended;
            }
            while !self.refused && self.to_upstream.len() < HELD_PLAINTEXT {
                match self.client.reader().read(scratch) {
                    Ok(0) => {
                        self.client_side.ended = true;
                        break;
                    }
                    Ok(n) => {
                        if let Err(refusal) =
                            self.requests.feed(&scratch[..n], &mut self.to_upstream)
                        {
                            return Ok(self.refuse(&refusal));
                        }
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        self.client_side.ended = true;
                        break;
                    }
                }
            }
            progress |= give(&mut self.to_upstream, &mut self.upstream.writer())
                .map_err(InterceptError::TowardsServer)?;

            // The server's replies, as they are, towards the client.
            if self.to_client.len() < HELD_PLAINTEXT && !self.upstream_side.ended {
                let before = self.bytes_in;
                let (read, ended) =
                    read_tls(&mut self.upstream, upstream).map_err(InterceptError::FromServer)?;
                self.bytes_in = before + read as u64;
                progress |= read > 0 || ended;
                self.upstream_side.ended |= ended;
            }
            while !self.refused && self.to_client.len() < HELD_PLAINTEXT {
                match self.upstream.reader().read(scratch) {
                    Ok(0) => {
                        self.upstream_side.ended = true;
                        break;
                    }
                    Ok(n) => {
                        self.to_client.extend_from_slice(&scratch[..n]);
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        self.upstream_side.ended = true;
                        break;
                    }
                }
            }
            progress |= give(&mut self.to_client, &mut self.client.writer())
                .map_err(|e| InterceptError::TowardsClient(e.into()))?;

            // An end read on one side is passed on once its bytes went.
            if self.client_side.ended && self.to_upstream.is_empty() && !self.upstream_side.notified
            {
                self.upstream.send_close_notify();
                self.upstream_side.notified = true;
                progress = true;
            }
            if self.upstream_side.ended && self.to_client.is_empty() && !self.client_side.notified {
                self.client.send_close_notify();
                self.client_side.notified = true;
                progress = true;
            }

            let written = write_tls(&mut self.upstream, upstream, &mut self.upstream_side)
                .map_err(InterceptError::Server)?;
            self.bytes_out += written as u64;
            progress |= written > 0;
            progress |= write_tls(&mut self.client, client, &mut self.client_side)
                .map_err(InterceptError::Client)?
                > 0;

            if self.client_side.shut && self.upstream_side.shut {
                return Ok(TunnelState::Done);
            }
            if !progress {
                return Ok(TunnelState::Open);
            }
        }
    }

    /// Ends the tunnel on a refused request: what was not yet handed to
    /// the server's TLS is dropped, neither side is read any more, and the
    /// client hears the refusal after what the server had sent, then the
    /// end (close_notify both ways).
    fn refuse(&mut self, refusal: &Refusal) -> TunnelState {
        let reason = refusal.to_string();
        self.refused = true;
        self.to_upstream.clear();
        self.client_side.ended = true;
        self.upstream_side.ended = true;
        self.to_client
            .extend_from_slice(&reply::answer(refusal.status(), &reason));
        TunnelState::Refused(reason)
    }

    /// Whether either TLS handshake is still under way.
    pub fn handshaking(&self) -> bool {
        self.client.is_handshaking() || self.upstream.is_handshaking()
    }

    fn flush_preamble(&mut self, client: &mut TcpStream) -> io::Result<bool> {
        while !self.preamble.is_empty() {
            match client.write(&self.preamble) {
                Ok(n) => {
                    self.preamble.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Reads TLS bytes from `socket` while the session wants them; how many,
/// and whether the socket ended.
fn read_tls<C>(
    session: &mut rustls::ConnectionCommon<C>,
    socket: &mut TcpStream,
) -> Result<(usize, bool), Broken> {
    let mut total = 0;
    while session.wants_read() {
        match session.read_tls(socket) {
            Ok(0) => return Ok((total, true)),
            Ok(n) => {
                total += n;
                session.process_new_packets()?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok((total, false))
}

/// Writes the session's pending TLS bytes to `socket`; once it has been
/// sent close_notify and has nothing left, shuts the socket's write side.
fn write_tls<C>(
    session: &mut rustls::ConnectionCommon<C>,
    socket: &mut TcpStream,
    side: &mut Side,
) -> io::Result<usize> {
    let mut total = 0;
    while session.wants_write() {
        match session.write_tls(socket) {
            Ok(n) => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if side.notified && !side.shut {
        side.shut = true;
        match socket.shutdown(Shutdown::Write) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Hands `plain` to a session's writer as far as it takes it.
fn give(plain: &mut Vec<u8>, writer: &mut rustls::Writer<'_>) -> io::Result<bool> {
    if plain.is_empty() {
        return Ok(false);
    }
    let n = writer.write(plain)?;
    plain.drain(..n);
    Ok(n > 0)
}
