//! The reactor: one thread, one `mio::Poll`, owning every socket and all
//! kernel state.
//!
//! It never blocks. Readiness events drive connections; blocking work goes
//! to the worker pool and comes back through the waker; deadlines (write
//! stalls, shutdown grace) bound the `poll` timeout. Per connection, requests
//! are read in bounded turns so one busy client cannot starve the others,
//! and replies leave in request order.

mod connection;
mod replies;
mod timers;

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, ErrorCode, ErrorReply, Opcode};
use mio::event::Event;
use mio::net::UnixStream;
use mio::{Events, Interest, Poll, Token, Waker};
use signal_hook::consts::SIGINT;
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use crate::config::Config;
use crate::identity::{peer_cred, Authority};
use crate::socket::KernelSocket;
use crate::syscall::{Caller, Kernel};
use crate::workers::WorkerPool;
use connection::{Connection, ConnectionLimits, ReadTurn};
use timers::Timers;

const LISTENER: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);

/// Bytes one connection may read per turn before others are served.
const READ_BUDGET: usize = 256 * 1024;
/// After running out of file descriptors, try accepting again this soon.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Names a connection across slot reuse: a completion for a connection that
/// has closed (and whose slot now holds another) is recognised and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnKey {
    index: usize,
    serial: u64,
}

/// Where a deferred reply goes: a connection and the request's sequence
/// number on it.
#[derive(Clone, Copy, Debug)]
pub struct ReplyTo {
    conn: ConnKey,
    seq: u64,
}

#[derive(Debug)]
enum Deadline {
    /// Check whether this connection's peer is still not reading replies.
    WriteStall(ConnKey),
    /// Retry accepting after descriptor exhaustion.
    AcceptRetry,
}

/// The event loop of `agentosd`.
pub struct Reactor {
    poll: Poll,
    socket: KernelSocket,
    signals: Signals,
    workers: WorkerPool<ReplyTo>,
    kernel: Kernel,
    authority: Authority,
    connections: Slab<Connection>,
    next_serial: u64,
    /// Connections to serve without waiting for an event: their read budget
    /// ran out, or a limit that paused them was lifted.
    ready: VecDeque<ConnKey>,
    timers: Timers<Deadline>,
    limits: ConnectionLimits,
    max_connections: usize,
    stall_timeout: Duration,
    shutdown_grace: Duration,
    /// Set once a shutdown signal arrived: the loop ends when every
    /// connection is finished or this passes.
    drain_deadline: Option<Instant>,
}

impl Reactor {
    /// Builds the reactor around a bound socket and the shutdown signals,
    /// and starts the workers. Call after binding: binding changes the
    /// process umask, which must happen before any thread exists.
    pub fn new(
        config: Config,
        mut socket: KernelSocket,
        mut signals: Signals,
    ) -> io::Result<Reactor> {
        let poll = Poll::new()?;
        if let Some(listener) = socket.listener() {
            poll.registry()
                .register(listener, LISTENER, Interest::READABLE)?;
        }
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let workers = WorkerPool::start(config.workers, waker)?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        let authority = Authority::new(nix::unistd::geteuid().as_raw(), socket.gid());
        let limits = ConnectionLimits {
            max_request_bytes: config.max_request_bytes,
            max_in_flight: config.max_in_flight as usize,
            write_high_water: config.write_high_water,
            write_buffer_limit: config.write_buffer_limit,
            read_budget: READ_BUDGET,
        };
        Ok(Reactor {
            poll,
            socket,
            signals,
            workers,
            authority,
            connections: Slab::new(),
            next_serial: 0,
            ready: VecDeque::new(),
            timers: Timers::default(),
            limits,
            max_connections: config.max_connections,
            stall_timeout: config.write_stall_timeout(),
            shutdown_grace: config.shutdown_grace(),
            drain_deadline: None,
            kernel: Kernel::new(config),
        })
    }

    /// Runs until a shutdown signal has been handled and every connection
    /// drained (or the grace period ended). Removes the socket on the way out.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = self.poll_timeout();
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => self.deliver_completions(),
                    SIGNALS => self.handle_signals(),
                    Token(index) => self.on_connection_event(index, event),
                }
            }
            self.serve_ready();
            self.fire_timers();
            if let Some(deadline) = self.drain_deadline {
                if self.connections.is_empty() {
                    log::info!("all connections drained");
                    break;
                }
                if Instant::now() >= deadline {
                    log::warn!(
                        "shutdown grace over; closing {} unfinished connection(s)",
                        self.connections.len()
                    );
                    break;
                }
            }
        }
        self.socket.close();
        self.connections.clear();
        self.workers.shutdown();
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.ready.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let timer = self.timers.time_to_next(now);
        let drain = self
            .drain_deadline
            .map(|d| d.saturating_duration_since(now));
        match (timer, drain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn connection(&mut self, key: ConnKey) -> Option<&mut Connection> {
        lookup(&mut self.connections, key)
    }

    fn accept_all(&mut self) {
        loop {
            let Some(listener) = self.socket.listener() else {
                return;
            };
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err)
                    if err.kind() == io::ErrorKind::Interrupted
                        || err.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(err) if matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    log::warn!(
                        "cannot accept: {err}; {} connections open, retrying shortly",
                        self.connections.len()
                    );
                    self.timers
                        .schedule(Instant::now() + ACCEPT_RETRY, Deadline::AcceptRetry);
                    return;
                }
                Err(err) => {
                    log::error!("accept failed: {err}");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: UnixStream) {
        let peer = match peer_cred(&stream) {
            Ok(peer) => peer,
            Err(err) => {
                log::debug!("dropping a connection whose credentials cannot be read: {err}");
                return;
            }
        };
        if self.connections.len() >= self.max_connections {
            log::warn!(
                "refusing a connection from pid {}: {} connections is the configured maximum",
                peer.pid,
                self.max_connections
            );
            refuse(
                &mut stream,
                ErrorCode::Busy,
                &format!(
                    "the kernel is serving its maximum of {} connections; retry later",
                    self.max_connections
                ),
            );
            return;
        }
        let identity = match self.authority.identify(&peer) {
            Ok(identity) => identity,
            Err(reason) => {
                log::warn!("refusing pid {} uid {}: {reason}", peer.pid, peer.uid);
                refuse(&mut stream, ErrorCode::PermissionDenied, &reason);
                return;
            }
        };
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.connections.vacant_entry();
        let index = entry.key();
        if let Err(err) =
            self.poll
                .registry()
                .register(&mut stream, Token(index), Interest::READABLE)
        {
            log::error!("cannot register a new connection: {err}");
            return;
        }
        log::debug!(
            "conn {serial}: accepted pid {} uid {} gid {} as id {}",
            peer.pid,
            peer.uid,
            peer.gid,
            identity.id()
        );
        let caller = Caller { identity };
        entry.insert(Connection::new(stream, serial, caller, peer, &self.limits));
    }

    fn on_connection_event(&mut self, index: usize, event: &Event) {
        let Some(serial) = self.connections.get(index).map(|conn| conn.serial) else {
            return;
        };
        let key = ConnKey { index, serial };
        let hung_up = event.is_read_closed() || event.is_error();
        if event.is_readable() || hung_up {
            self.read(key, hung_up);
        }
        self.settle(key);
    }

    /// One read turn for a connection.
    fn read(&mut self, key: ConnKey, hung_up: bool) {
        let Some(conn) = lookup(&mut self.connections, key) else {
            return;
        };
        if conn.read_closed {
            return;
        }
        match conn.read_turn(key, &mut self.kernel, &self.workers, &self.limits, hung_up) {
            Ok(ReadTurn::BudgetSpent) => enqueue(&mut self.ready, conn, key),
            Ok(ReadTurn::Drained | ReadTurn::Paused | ReadTurn::Closed) => {}
            Err(err) => {
                log::debug!("conn {}: read failed: {err}", conn.serial);
                self.close(key);
            }
        }
    }

    /// After anything happened on a connection: send what can be sent,
    /// enforce the write limits, resume reading if a limit was lifted, and
    /// close it if it is finished.
    fn settle(&mut self, key: ConnKey) {
        let limits = self.limits;
        let stall_timeout = self.stall_timeout;
        let Some(conn) = lookup(&mut self.connections, key) else {
            return;
        };
        if let Err(err) = conn.flush() {
            log::debug!("conn {}: write failed: {err}", conn.serial);
            return self.close(key);
        }
        if conn.is_finished() {
            return self.close(key);
        }
        let unsent = conn.replies.unsent();
        if unsent > limits.write_buffer_limit {
            log::warn!(
                "conn {} (pid {}): {unsent} bytes of replies unread, over the limit; disconnecting",
                conn.serial,
                conn.peer.pid
            );
            return self.close(key);
        }
        let backed_up = unsent > 0;
        if backed_up != conn.wants_write {
            let interest = if backed_up {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if let Err(err) =
                self.poll
                    .registry()
                    .reregister(&mut conn.stream, Token(key.index), interest)
            {
                log::error!("conn {}: cannot change interest: {err}", conn.serial);
                return self.close(key);
            }
            conn.wants_write = backed_up;
        }
        if backed_up && !conn.stall_timer {
            let now = Instant::now();
            conn.stall_timer = true;
            conn.last_write = now;
            self.timers
                .schedule(now + stall_timeout, Deadline::WriteStall(key));
        }
        if conn.paused && conn.accepts_requests(&limits) {
            conn.paused = false;
            enqueue(&mut self.ready, conn, key);
        }
    }

    fn close(&mut self, key: ConnKey) {
        if self.connection(key).is_none() {
            return;
        }
        let mut conn = self.connections.remove(key.index);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        log::debug!(
            "conn {}: closed ({} replies never delivered)",
            conn.serial,
            conn.replies.in_flight()
        );
    }

    fn serve_ready(&mut self) {
        for _ in 0..self.ready.len() {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(conn) = self.connection(key) else {
                continue;
            };
            conn.queued = false;
            self.read(key, false);
            self.settle(key);
        }
    }

    fn deliver_completions(&mut self) {
        let completed: Vec<_> = self.workers.completed().collect();
        let mut touched: Vec<ConnKey> = Vec::with_capacity(completed.len());
        for completion in completed {
            let ReplyTo { conn: key, seq } = completion.address;
            if let Some(conn) = self.connection(key) {
                conn.replies.complete(seq, completion.payload);
                if !touched.contains(&key) {
                    touched.push(key);
                }
            }
        }
        for key in touched {
            self.settle(key);
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(deadline) = self.timers.pop_due(now) {
            match deadline {
                Deadline::AcceptRetry => self.accept_all(),
                Deadline::WriteStall(key) => self.check_stall(key, now),
            }
        }
    }

    fn check_stall(&mut self, key: ConnKey, now: Instant) {
        let stall_timeout = self.stall_timeout;
        let Some(conn) = self.connection(key) else {
            return;
        };
        conn.stall_timer = false;
        if conn.replies.unsent() == 0 {
            return;
        }
        let since = conn.last_write;
        if now.saturating_duration_since(since) >= stall_timeout {
            log::warn!(
                "conn {} (pid {}): peer has read none of its {} bytes of replies for {:?}; \
                 disconnecting",
                conn.serial,
                conn.peer.pid,
                conn.replies.unsent(),
                stall_timeout
            );
            self.close(key);
        } else {
            conn.stall_timer = true;
            self.timers
                .schedule(since + stall_timeout, Deadline::WriteStall(key));
        }
    }

    fn handle_signals(&mut self) {
        let received: Vec<i32> = self.signals.pending().collect();
        for signal in received {
            let name = if signal == SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            if self.drain_deadline.is_some() {
                log::warn!("{name} again: stopping now");
                self.drain_deadline = Some(Instant::now());
                continue;
            }
            self.begin_drain(name);
        }
    }

    /// Stops accepting, stops reading requests, and lets replies to requests
    /// already taken go out within the grace period.
    fn begin_drain(&mut self, signal: &str) {
        log::info!(
            "{signal}: shutting down; finishing {} connection(s) within {:?}",
            self.connections.len(),
            self.shutdown_grace
        );
        if let Some(listener) = self.socket.listener() {
            let _ = self.poll.registry().deregister(listener);
        }
        self.socket.close();
        self.drain_deadline = Some(Instant::now() + self.shutdown_grace);
        let keys: Vec<ConnKey> = self
            .connections
            .iter_mut()
            .map(|(index, conn)| {
                conn.read_closed = true;
                ConnKey {
                    index,
                    serial: conn.serial,
                }
            })
            .collect();
        for key in keys {
            self.settle(key);
        }
    }
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("socket", &self.socket.path())
            .field("connections", &self.connections.len())
            .field("draining", &self.drain_deadline.is_some())
            .finish_non_exhaustive()
    }
}

/// The connection `key` names, if it is still open. Takes the slab rather
/// than the reactor so callers can borrow other reactor fields alongside.
fn lookup(connections: &mut Slab<Connection>, key: ConnKey) -> Option<&mut Connection> {
    connections
        .get_mut(key.index)
        .filter(|conn| conn.serial == key.serial)
}

/// Puts a connection in the ready queue, once.
fn enqueue(ready: &mut VecDeque<ConnKey>, conn: &mut Connection, key: ConnKey) {
    if !conn.queued {
        conn.queued = true;
        ready.push_back(key);
    }
}

/// Tells a connection it cannot be served, then drops it. Best effort: the
/// frame is small and the socket fresh, so it fits in the socket buffer.
fn refuse(stream: &mut UnixStream, code: ErrorCode, reason: &str) {
    let reply = ErrorReply::new(code, reason).to_json();
    let _ = stream.write(&encode_frame(Opcode::EXIT, 0, &reply));
}
