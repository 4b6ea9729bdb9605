//! The reactor: one thread, one `mio::Poll`, owning every socket and all
//! kernel state.
//!
//! It never blocks. Readiness events drive connections; blocking work goes
//! to the worker pool and comes back through the waker; deadlines (write
//! stalls, shutdown grace) bound the `poll` timeout. Per connection, requests
//! are read in bounded turns so one busy client cannot starve the others,
//! and replies leave in request order.

mod accept;
mod capacity;
mod connection;
mod connections;
mod idle;
mod replies;

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use mio::event::Event;
use mio::{Events, Interest, Poll, Token, Waker};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use crate::address::{ConnKey, ReplyTo};
use crate::config::{Config, ConfigError};
use crate::identity::Authority;
use crate::kernel::{Kernel, StartError};
use crate::service::ServiceManager;
use crate::socket::KernelSocket;
use crate::workers::WorkerPool;
use accept::{Accept, Door, Entrant};
use capacity::Capacity;
use connection::{Connection, ConnectionLimits, ReadTurn};
use connections::Connections;

const LISTENER: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
/// The kernel's own sources take tokens from here on; connections take
/// the slots below.
const KERNEL_TOKENS: usize = 1 << 40;

/// Bytes one connection may read per turn before others are served.
const READ_BUDGET: usize = 256 * 1024;
/// Per write-stall window, a backed-up client must accept this much of its
/// pending replies (or all of them): trickling a byte at a time does not
/// keep a connection and its buffers alive.
const MIN_DRAIN: u64 = 64 * 1024;

#[derive(Debug)]
enum Deadline {
    /// Check that this connection's peer reads its replies fast enough.
    WriteStall(ConnKey),
    /// Check that the frame this connection is sending completes in time.
    FrameTimeout(ConnKey),
    /// Retry accepting after a failure.
    AcceptRetry,
    /// Release quiet connections' buffers and return freed memory.
    IdleSweep,
}

/// The event loop of `agentosd`.
pub struct Reactor {
    poll: Poll,
    socket: KernelSocket,
    signals: Signals,
    workers: WorkerPool<ReplyTo>,
    kernel: Kernel,
    /// Who comes in, within the connection caps.
    door: Door,
    connections: Connections,
    /// Connections to serve without waiting for an event: their read budget
    /// ran out, or a limit that paused them was lifted.
    ready: VecDeque<ConnKey>,
    timers: Timers<Deadline>,
    /// An idle sweep is scheduled.
    sweep_pending: bool,
    /// Connections closed since the last sweep (their memory is free but
    /// not yet returned).
    closed_since_sweep: usize,
    limits: ConnectionLimits,
    stall_timeout: Duration,
    frame_timeout: Duration,
    shutdown_grace: Duration,
    /// Set once a shutdown signal arrived: the loop ends when every
    /// connection is finished or this passes.
    drain_deadline: Option<Instant>,
    /// Reads the configuration again, for SIGHUP.
    reload: ConfigSource,
    /// systemd, when the kernel runs as its service.
    service: ServiceManager,
}

/// Where the configuration comes from, read again on SIGHUP.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, ConfigError>>;

/// Why the reactor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ReactorError {
    /// The event loop, its waker or the worker threads could not be set up.
    #[error("the event loop could not be set up: {0}")]
    Setup(#[from] io::Error),
    /// The kernel could not start.
    #[error(transparent)]
    Kernel(#[from] StartError),
}

impl Reactor {
    /// Builds the reactor around a bound socket and the shutdown signals,
    /// and starts the workers. Call after binding: binding changes the
    /// process umask, which must happen before any thread exists.
    pub fn new(
        config: Config,
        mut socket: KernelSocket,
        mut signals: Signals,
        reload: ConfigSource,
    ) -> Result<Reactor, ReactorError> {
        let poll = Poll::new()?;
        if let Some(listener) = socket.listener() {
            poll.registry()
                .register(listener, LISTENER, Interest::READABLE)?;
        }
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let workers =
            WorkerPool::start(config.workers, config.max_queued_jobs, Arc::clone(&waker))?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        let authority = Authority::new(nix::unistd::geteuid().as_raw(), socket.gid());
        let kernel = Kernel::new(
            config.clone(),
            poll.registry(),
            waker,
            socket.path(),
            KERNEL_TOKENS,
        )?;
        let limits = ConnectionLimits {
            max_request_bytes: config.max_request_bytes,
            max_in_flight: config.max_in_flight as usize,
            write_high_water: config.write_high_water,
            read_budget: READ_BUDGET,
        };
        Ok(Reactor {
            poll,
            socket,
            signals,
            workers,
            door: Door::new(authority, Capacity::new(&config)),
            connections: Connections::default(),
            ready: VecDeque::new(),
            timers: Timers::default(),
            sweep_pending: false,
            closed_since_sweep: 0,
            limits,
            stall_timeout: config.write_stall_timeout(),
            frame_timeout: config.frame_timeout(),
            shutdown_grace: config.shutdown_grace(),
            drain_deadline: None,
            kernel,
            reload,
            service: ServiceManager::from_env(),
        })
    }

    /// Runs until a shutdown signal has been handled and every connection
    /// drained (or the grace period ended). Removes the socket on the way out.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        self.service.ready(&self.status());
        loop {
            let timeout = self.poll_timeout();
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            let woke = Instant::now();
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {
                        self.deliver_completions();
                        self.kernel.on_wake();
                        self.kernel_output();
                    }
                    SIGNALS => self.handle_signals(),
                    token if self.kernel.owns(token) => {
                        self.kernel.on_event(token);
                        self.kernel_output();
                    }
                    token => self.on_connection_event(token, event),
                }
            }
            self.serve_ready();
            self.fire_timers();
            self.count_turn(woke);
            if let Some(deadline) = self.drain_deadline {
                if self.connections.is_empty() && self.kernel.is_idle() {
                    log::info!("all connections drained, all agents stopped");
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
        self.kernel.finish_shutdown();
        self.workers.shutdown();
        Ok(())
    }

    /// Hands the kernel's metrics what only the reactor knows.
    fn count_turn(&mut self, woke: Instant) {
        let counts = &mut self.kernel.reactor_counts;
        counts.turn(woke.elapsed());
        counts.connections = self.door.capacity().total();
        counts.agent_connections = self.door.capacity().agents();
        counts.worker_jobs_queued = self.workers.queued();
    }

    /// Places replies the kernel completed and admits connections it
    /// accepted.
    fn kernel_output(&mut self) {
        let Some(output) = self.kernel.take_output() else {
            return;
        };
        let mut touched: Vec<ConnKey> = Vec::with_capacity(output.replies.len());
        for (to, payload) in output.replies {
            if let ReplyTo::Request { conn: key, seq } = to {
                if let Some(conn) = self.connection(key) {
                    conn.replies.complete(seq, payload.into_json());
                    touched.push(key);
                }
            }
        }
        for key in touched {
            self.settle(key);
        }
        // A run that is over speaks no more: whatever of it still holds its
        // connection (a thread it left in a session) is cut off, and what
        // the connection had under way is withdrawn.
        for run in output.runs_over {
            for key in self.connections.of_ended_run(run) {
                self.close(key);
            }
        }
        for adopted in output.adopted {
            if let Some(entrant) = self.door.adopt(adopted, &mut self.kernel) {
                self.install(entrant);
            }
        }
    }

    /// Accepts every connection waiting on the kernel socket.
    fn accept_all(&mut self) {
        loop {
            let Some(listener) = self.socket.listener() else {
                return;
            };
            match self.door.accept(listener, &mut self.kernel) {
                Accept::In(entrant) => self.install(entrant),
                Accept::TurnedAway => {}
                Accept::Done | Accept::RetryPending => return,
                Accept::RetryAfter(delay) => {
                    let at = Instant::now() + delay;
                    self.timers.schedule(at, Deadline::AcceptRetry);
                    return;
                }
            }
        }
    }

    /// Serves a connection the door let in.
    fn install(&mut self, entrant: Entrant) {
        let identity = entrant.identity;
        let registry = self.poll.registry();
        match self.connections.install(entrant, registry, &self.limits) {
            Some(_) => self.schedule_sweep(Instant::now()),
            None => self.door.left(identity),
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.ready.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = Instant::now();
        let timer = [
            self.timers.time_to_next(now),
            self.kernel.next_deadline(now),
        ]
        .into_iter()
        .flatten()
        .min();
        let drain = self
            .drain_deadline
            .map(|d| d.saturating_duration_since(now));
        match (timer, drain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn connection(&mut self, key: ConnKey) -> Option<&mut Connection> {
        self.connections.get_mut(key)
    }

    fn on_connection_event(&mut self, token: Token, event: &Event) {
        let Some(key) = self.connections.key_of(token) else {
            return;
        };
        if event.is_write_closed() || event.is_error() {
            // The peer is gone in both directions: nobody is left to read a
            // reply, so stop now and drop its queued work.
            log::debug!("conn {}: peer hung up", key.serial);
            return self.close(key);
        }
        if event.is_read_closed() {
            if let Some(conn) = self.connection(key) {
                conn.peer_hung_up = true;
            }
        }
        if event.is_readable() || event.is_read_closed() {
            self.read(key);
        }
        self.settle(key);
    }

    /// One read turn for a connection.
    fn read(&mut self, key: ConnKey) {
        let Some(conn) = self.connections.get_mut(key) else {
            return;
        };
        if conn.read_closed {
            return;
        }
        match conn.read_turn(key, &mut self.kernel, &self.workers, &self.limits) {
            Ok(ReadTurn::BudgetSpent) => enqueue(&mut self.ready, conn, key),
            Ok(ReadTurn::Drained | ReadTurn::Paused | ReadTurn::Closed) => {}
            Err(err) => {
                log::debug!("conn {}: read failed: {err}", conn.serial);
                self.close(key);
            }
        }
        self.kernel_output();
    }

    /// After anything happened on a connection: send what can be sent, arm
    /// its deadlines, resume reading if a limit was lifted, and close it if
    /// it is finished.
    fn settle(&mut self, key: ConnKey) {
        let limits = self.limits;
        let Some(conn) = self.connections.get_mut(key) else {
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
        let backed_up = unsent > 0;
        if backed_up != conn.wants_write {
            let interest = if backed_up {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if let Err(err) = self.poll.registry().reregister(
                &mut conn.stream,
                connections::token_of(key),
                interest,
            ) {
                log::error!("conn {}: cannot change interest: {err}", conn.serial);
                return self.close(key);
            }
            conn.wants_write = backed_up;
        }
        if backed_up && conn.stall_mark.is_none() {
            conn.stall_mark = Some((conn.sent_total, unsent));
            self.timers.schedule(
                Instant::now() + self.stall_timeout,
                Deadline::WriteStall(key),
            );
        }
        if let Some(started) = conn.frame_started.filter(|_| !conn.frame_timer) {
            conn.frame_timer = true;
            self.timers
                .schedule(started + self.frame_timeout, Deadline::FrameTimeout(key));
        }
        if conn.paused && conn.accepts_requests(&limits) {
            conn.paused = false;
            enqueue(&mut self.ready, conn, key);
        }
    }

    fn close(&mut self, key: ConnKey) {
        let Some(mut conn) = self.connections.remove(key) else {
            return;
        };
        self.door.left(conn.caller.identity);
        self.closed_since_sweep += 1;
        self.schedule_sweep(Instant::now());
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let dropped_jobs = self.workers.cancel(conn.serial);
        self.kernel.connection_closed(conn.serial);
        log::debug!(
            "conn {}: closed ({} replies never delivered, {dropped_jobs} queued jobs dropped)",
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
            self.read(key);
            self.settle(key);
        }
    }

    fn deliver_completions(&mut self) {
        let completed: Vec<_> = self.workers.completed().collect();
        let mut touched: Vec<ConnKey> = Vec::with_capacity(completed.len());
        for completion in completed {
            let ReplyTo::Request { conn: key, seq } = completion.address else {
                continue;
            };
            if let Some(conn) = self.connection(key) {
                conn.replies.complete(seq, completion.payload);
                touched.push(key);
            }
        }
        touched.sort_unstable_by_key(|key| (key.index, key.serial));
        touched.dedup();
        for key in touched {
            self.settle(key);
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        self.kernel.on_deadlines(now);
        self.kernel_output();
        while let Some(deadline) = self.timers.pop_due(now) {
            match deadline {
                Deadline::AcceptRetry => {
                    self.door.retry_due();
                    self.accept_all();
                }
                Deadline::WriteStall(key) => self.check_stall(key, now),
                Deadline::FrameTimeout(key) => self.check_frame(key, now),
                Deadline::IdleSweep => self.sweep(now),
            }
        }
    }

    fn schedule_sweep(&mut self, now: Instant) {
        if !self.sweep_pending {
            self.sweep_pending = true;
            self.timers
                .schedule(now + idle::SWEEP_EVERY, Deadline::IdleSweep);
        }
    }

    /// Quiet connections give back their buffers, and the memory of those
    /// released or closed goes back to the system (see [`idle`]).
    fn sweep(&mut self, now: Instant) {
        self.sweep_pending = false;
        let mut released = 0;
        let mut holding = false;
        for (_, conn) in self.connections.iter_mut() {
            released += conn.release_if_quiet();
            holding |= conn.holds_memory();
        }
        if released > 0 || self.closed_since_sweep > 0 {
            self.connections.shrink_if_empty();
            idle::return_free_memory();
            self.closed_since_sweep = 0;
        }
        if holding {
            self.schedule_sweep(now);
        }
    }

    fn check_stall(&mut self, key: ConnKey, now: Instant) {
        let stall_timeout = self.stall_timeout;
        let Some(conn) = self.connection(key) else {
            return;
        };
        let Some((sent_then, unsent_then)) = conn.stall_mark.take() else {
            return;
        };
        let unsent = conn.replies.unsent();
        if unsent == 0 {
            return;
        }
        let progress = conn.sent_total - sent_then;
        if progress < (unsent_then as u64).min(MIN_DRAIN) {
            log::warn!(
                "conn {} (pid {}): peer read {progress} of {unsent_then} bytes of replies in \
                 {stall_timeout:?}; disconnecting",
                conn.serial,
                conn.peer.pid,
            );
            return self.close(key);
        }
        conn.stall_mark = Some((conn.sent_total, unsent));
        self.timers
            .schedule(now + stall_timeout, Deadline::WriteStall(key));
    }

    fn check_frame(&mut self, key: ConnKey, now: Instant) {
        let frame_timeout = self.frame_timeout;
        let Some(conn) = self.connection(key) else {
            return;
        };
        conn.frame_timer = false;
        let Some(started) = conn.frame_started else {
            return;
        };
        if conn.paused || conn.read_closed {
            // The kernel is not reading: the delay is not the peer's.
            conn.frame_started = None;
            return;
        }
        if now.saturating_duration_since(started) >= frame_timeout {
            log::warn!(
                "conn {} (pid {}): a request frame took over {frame_timeout:?} to arrive; \
                 disconnecting",
                conn.serial,
                conn.peer.pid,
            );
            return self.close(key);
        }
        conn.frame_timer = true;
        self.timers
            .schedule(started + frame_timeout, Deadline::FrameTimeout(key));
    }

    fn handle_signals(&mut self) {
        let received: Vec<i32> = self.signals.pending().collect();
        for signal in received {
            let name = signal_name(signal);
            if signal == SIGHUP {
                self.reload_config();
                continue;
            }
            if self.drain_deadline.is_some() {
                log::warn!("{name} again: stopping now");
                self.drain_deadline = Some(Instant::now());
                continue;
            }
            self.begin_drain(name);
        }
    }

    /// SIGHUP: the kernel takes up what is safe to change of its
    /// configuration as read now; a configuration that does not load
    /// changes nothing.
    fn reload_config(&mut self) {
        if self.drain_deadline.is_some() {
            return;
        }
        self.service.reloading();
        match (self.reload)() {
            Ok(config) => {
                self.kernel.reload(config);
                self.kernel_output();
            }
            Err(err) => log::error!("SIGHUP: the configuration was not reloaded: {err}"),
        }
        self.service.ready(&self.status());
    }

    /// What the service manager shows for the kernel.
    fn status(&self) -> String {
        format!("serving {}", self.socket.path().display())
    }

    /// Stops accepting, stops reading requests, and lets replies to requests
    /// already taken go out within the grace period.
    fn begin_drain(&mut self, signal: &str) {
        self.service.stopping();
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
        self.kernel.begin_shutdown(self.shutdown_grace);
        self.kernel_output();
        let keys: Vec<ConnKey> = self
            .connections
            .iter_mut()
            .map(|(key, conn)| {
                conn.read_closed = true;
                key
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

/// The signals the reactor handles: SIGHUP reloads the configuration, the
/// others shut the kernel down cleanly.
pub const HANDLED_SIGNALS: [i32; 4] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT];

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        SIGQUIT => "SIGQUIT",
        _ => "signal",
    }
}

/// Puts a connection in the ready queue, once.
fn enqueue(ready: &mut VecDeque<ConnKey>, conn: &mut Connection, key: ConnKey) {
    if !conn.queued {
        conn.queued = true;
        ready.push_back(key);
    }
}
