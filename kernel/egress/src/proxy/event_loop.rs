//! The proxy's thread: one `mio::Poll` for every endpoint and every
//! connection through one. Nothing here blocks: names are resolved by the
//! resolver threads, connects are non-blocking, and every wait (a request
//! head, a connect, a ClientHello) has a deadline.
//!
//! The loop owns the endpoints it serves ([`Served`]) and the connections
//! ([`Conn`]): it accepts them, hands each readiness to the connection's
//! phase ([`Phases`]), does what the phase answers ([`Next`]), and ends
//! every connection the same way, its end in the endpoint's record before
//! the client hears.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use rustls::ClientConfig;
use slab::Slab;

use super::connection::{epoch_ms, Conn, End, Phase, Timer};
use super::phases::{At, Next, Phases};
use super::reply::reply;
use super::resolver::{Question, Resolution, Resolver};
use super::served::Served;
use super::settings::{EndpointId, ProxySettings};
use super::tls::Authority;
use crate::policy::{Decision, Policy};
use crate::record::{Attempt, Record};

/// What the other threads ask of the loop.
#[derive(Debug)]
pub enum Control {
    Serve {
        id: EndpointId,
        label: String,
        listener: std::net::TcpListener,
        policy: Policy,
        record: Arc<Mutex<Record>>,
    },
    SetPolicy {
        id: EndpointId,
        policy: Policy,
    },
    Forget {
        id: EndpointId,
    },
    Stop,
}

/// The waker's token; listeners' tokens have [`LISTENER`] set; a
/// connection's are [`Conn::token`]s.
pub const WAKER: Token = Token(usize::MAX);
const LISTENER: usize = 1 << (usize::BITS - 2);

/// How long accepting pauses after the process ran out of descriptors:
/// retrying at once would spin, since the pending connection stays.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// A shortage that goes on is logged this often, not every pause.
const SHORTAGE_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often live byte counts reach the records and floods are summed up
/// in the log.
const TICK: Duration = Duration::from_secs(1);

/// Names one endpoint may have waiting for (or in) a lookup at once: a
/// sandbox that asks for names whose DNS never answers holds at most this
/// many of the resolver threads, never all of them.
const LOOKUPS_PER_ENDPOINT: usize = 4;

/// The loop and everything it owns.
pub struct EventLoop {
    poll: Poll,
    /// Connections one endpoint may have open (or opening) at once.
    max_connections: usize,
    phases: Phases,
    control: Receiver<Control>,
    resolver: Resolver,
    answers: Receiver<Resolution>,
    served: HashMap<EndpointId, Served>,
    /// Each listener's endpoint, by the slot its token carries.
    listeners: Slab<EndpointId>,
    conns: Slab<Conn>,
    timers: Timers<Timer>,
    next_id: u64,
    accept_paused_until: Option<Instant>,
    /// When a shortage of descriptors was last logged.
    shortage_logged: Option<Instant>,
    next_tick: Instant,
}

impl std::fmt::Debug for EventLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLoop")
            .field("endpoints", &self.served.len())
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

/// What the loop is started with.
pub struct Parts {
    pub poll: Poll,
    pub settings: ProxySettings,
    pub authority: Authority,
    pub upstream_tls: Arc<ClientConfig>,
    pub control: Receiver<Control>,
    pub resolver: Resolver,
    pub answers: Receiver<Resolution>,
}

impl EventLoop {
    pub fn new(parts: Parts) -> EventLoop {
        EventLoop {
            poll: parts.poll,
            max_connections: parts.settings.max_connections,
            phases: Phases::new(&parts.settings, parts.authority, parts.upstream_tls),
            control: parts.control,
            resolver: parts.resolver,
            answers: parts.answers,
            served: HashMap::new(),
            listeners: Slab::new(),
            conns: Slab::new(),
            timers: Timers::default(),
            next_id: 1,
            accept_paused_until: None,
            shortage_logged: None,
            next_tick: Instant::now() + TICK,
        }
    }

    /// Runs until told to stop (or every handle is gone).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        loop {
            let timeout = self.next_wake().saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("network: the proxy's poll failed: {e}");
                    return;
                }
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    Token(token) if token & LISTENER != 0 => {
                        if let Some(&id) = self.listeners.get(token & !LISTENER) {
                            self.accept(id);
                        }
                    }
                    Token(token) => {
                        let (key, upstream) = Conn::of_token(token);
                        self.ready(key, upstream, event);
                    }
                }
            }
            if !self.controls() {
                return;
            }
            while let Ok(answer) = self.answers.try_recv() {
                self.answered(answer);
            }
            self.expire();
        }
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self.next_tick;
        if let Some(at) = self.timers.next_at() {
            wake = wake.min(at);
        }
        if let Some(at) = self.accept_paused_until {
            wake = wake.min(at);
        }
        wake
    }

    /// Handles control messages; false once told to stop.
    fn controls(&mut self) -> bool {
        loop {
            match self.control.try_recv() {
                Ok(Control::Serve {
                    id,
                    label,
                    listener,
                    policy,
                    record,
                }) => self.serve(id, label, listener, policy, record),
                Ok(Control::SetPolicy { id, policy }) => self.set_policy(id, policy),
                Ok(Control::Forget { id }) => self.forget(id),
                Ok(Control::Stop) | Err(TryRecvError::Disconnected) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    fn serve(
        &mut self,
        id: EndpointId,
        label: String,
        listener: std::net::TcpListener,
        policy: Policy,
        record: Arc<Mutex<Record>>,
    ) {
        // An endpoint served again replaces its old listener.
        self.forget(id);
        if let Err(e) = listener.set_nonblocking(true) {
            log::error!("network: {label}'s proxy endpoint: {e}");
            return;
        }
        let mut listener = TcpListener::from_std(listener);
        let listener_key = self.listeners.insert(id);
        if let Err(e) = self.poll.registry().register(
            &mut listener,
            Token(LISTENER | listener_key),
            Interest::READABLE,
        ) {
            log::error!("network: {label}'s proxy endpoint: {e}");
            self.listeners.remove(listener_key);
            return;
        }
        let served = Served::new(label, listener, listener_key, policy, record);
        self.served.insert(id, served);
        // Connections may have queued before the listener was registered.
        self.accept(id);
    }

    fn set_policy(&mut self, id: EndpointId, policy: Policy) {
        let Some(served) = self.served.get_mut(&id) else {
            return;
        };
        served.set_policy(policy);
        let refused: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.endpoint == id && conn.recorded)
            .filter(|(_, conn)| {
                let (host, port) = conn.target();
                conn.address.is_some_and(|address| {
                    matches!(
                        served.policy().decide(host, address.ip(), port),
                        Decision::Refused(_)
                    )
                })
            })
            .map(|(key, _)| key)
            .collect();
        for key in refused {
            let reason = "policy changed".to_owned();
            // Not answered yet: the client learns why.
            let status = (self.conns[key].phase == Phase::Connecting).then_some(403);
            self.close(key, End::Failed(reason), status);
        }
    }

    fn forget(&mut self, id: EndpointId) {
        let Some(served) = self.served.get_mut(&id) else {
            return;
        };
        let listener_key = served.stop_listening(self.poll.registry());
        self.listeners.remove(listener_key);
        let keys: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.endpoint == id)
            .map(|(key, _)| key)
            .collect();
        // Their record is the endpoint's still: written before it goes.
        for key in keys {
            let end = End::Failed("the sandbox's proxy was stopped".into());
            self.close(key, end, None);
        }
        self.served.remove(&id);
    }

    /// Accepts what waits on endpoint `id`'s listener.
    fn accept(&mut self, id: EndpointId) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            let Some(served) = self.served.get_mut(&id) else {
                return;
            };
            let Some(listener) = served.listener() else {
                return;
            };
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    let now = Instant::now();
                    if self
                        .shortage_logged
                        .is_none_or(|at| now.duration_since(at) >= SHORTAGE_LOG_EVERY)
                    {
                        log::warn!("network: the proxy cannot accept now ({e}); it pauses");
                        self.shortage_logged = Some(now);
                    }
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    log::warn!("network: {}'s proxy endpoint: {e}", served.label());
                    return;
                }
            };
            if served.open() >= self.max_connections {
                let reason = format!(
                    "{} connections are open already, the most a sandbox may have",
                    self.max_connections
                );
                self.next_id += 1;
                let attempt = attempt(self.next_id, epoch_ms(), "", 0, None, Some(reason.clone()));
                served.refused(attempt, &reason);
                let mut stream = stream;
                reply(&mut stream, 503, &reason);
                continue;
            }
            served.opened();
            self.next_id += 1;
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            let mut conn = Conn::new(self.next_id, key, id, stream, Instant::now());
            if let Err(e) = self.poll.registry().register(
                &mut conn.client,
                Conn::token(key, false),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                log::warn!("network: registering a proxy connection: {e}");
                served.not_opened();
                continue;
            }
            self.phases.accepted(&mut conn, &mut self.timers);
            entry.insert(conn);
        }
    }

    /// Readiness on connection `key`'s client or upstream socket.
    fn ready(&mut self, key: usize, upstream: bool, event: &mio::event::Event) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        match conn.phase {
            Phase::Head if !upstream => self.step(key, Phases::read_head),
            Phase::Connecting if upstream => self.step(key, Phases::connecting),
            Phase::Hello => self.step(key, Phases::hello),
            Phase::Splice => {
                let towards_upstream = (upstream && event.is_writable())
                    || (!upstream && (event.is_readable() || event.is_read_closed()));
                let towards_client = (!upstream && event.is_writable())
                    || (upstream && (event.is_readable() || event.is_read_closed()));
                let (towards_upstream, towards_client) = (
                    towards_upstream || event.is_error(),
                    towards_client || event.is_error(),
                );
                self.step(key, |phases, at| {
                    phases.splice(at, towards_upstream, towards_client)
                });
            }
            Phase::Intercept => self.step(key, Phases::intercept),
            _ => {}
        }
    }

    /// The resolver's answer, if its connection still waits for it.
    fn answered(&mut self, answer: Resolution) {
        let Resolution { key, id, addresses } = answer;
        if self
            .conns
            .get(key)
            .is_some_and(|conn| conn.id == id && conn.phase == Phase::Resolving)
        {
            self.step(key, |phases, at| phases.resolved(at, addresses));
        }
    }

    /// Runs `phase` on connection `key`, then does what it answers.
    fn step(&mut self, key: usize, phase: impl FnOnce(&mut Phases, &mut At<'_>) -> Next) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let served = self.served.get_mut(&conn.endpoint);
        let mut at = At {
            conn,
            served,
            registry: self.poll.registry(),
            timers: &mut self.timers,
        };
        match phase(&mut self.phases, &mut at) {
            Next::Wait => {}
            Next::Resolve => self.resolve(key),
            Next::Refuse(status, reason, address) => self.refuse(key, status, reason, address),
            Next::Close(end, status) => self.close(key, end, status),
        }
    }

    /// Connection `key`'s name goes to a resolver thread, unless its
    /// endpoint has its share of them already or their queue is full.
    fn resolve(&mut self, key: usize) {
        let conn = &self.conns[key];
        let (host, port) = conn.target();
        let endpoint = conn.endpoint;
        let lookups = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.endpoint == endpoint && conn.lookup.is_some())
            .count();
        if lookups >= LOOKUPS_PER_ENDPOINT {
            let reason = format!(
                "{LOOKUPS_PER_ENDPOINT} names of this sandbox are being looked up already; {host} \
                 was not"
            );
            return self.refuse(key, 503, reason, None);
        }
        let wanted = Arc::new(AtomicBool::new(true));
        let question = Question {
            key,
            id: conn.id,
            host: host.to_owned(),
            port,
            wanted: Arc::clone(&wanted),
        };
        self.conns[key].lookup = Some(wanted);
        if let Err(question) = self.resolver.ask(question) {
            let reason = format!(
                "too many names waiting to be resolved; {} was not",
                question.host
            );
            self.refuse(key, 503, reason, None);
        }
    }

    /// Refuses connection `key` before anything was allowed: the status
    /// and reason to the client, the attempt to the record.
    fn refuse(&mut self, key: usize, status: u16, reason: String, address: Option<IpAddr>) {
        let conn = &self.conns[key];
        let (host, port) = conn.target();
        let at_ms = if conn.at_ms != 0 {
            conn.at_ms
        } else {
            epoch_ms()
        };
        let attempt = attempt(conn.id, at_ms, host, port, address, Some(reason.clone()));
        // Recorded before the client hears: what it does next (a run that
        // ends at once) finds the refusal in the record.
        if let Some(served) = self.served.get_mut(&conn.endpoint) {
            served.refused(attempt, &reason);
        }
        reply(&mut self.conns[key].client, status, &reason);
        self.close(key, End::Closed, None);
    }

    /// Closes connection `key`: both sockets, and its end in the record
    /// and the log. With a `status`, the client then hears it, and why the
    /// connection failed or was refused.
    fn close(&mut self, key: usize, end: End, status: Option<u16>) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        if let Some(lookup) = conn.lookup.take() {
            lookup.store(false, Ordering::Relaxed);
        }
        let _ = self.poll.registry().deregister(&mut conn.client);
        if let Some(upstream) = conn.upstream.as_mut() {
            let _ = self.poll.registry().deregister(upstream);
        }
        if let Some(served) = self.served.get_mut(&conn.endpoint) {
            served.closed(&conn, &end);
        }
        // The client hears last, when the record has the end: what it does
        // next (a run that ends at once) finds it there.
        if let (Some(status), End::Failed(why) | End::Refused(why)) = (status, &end) {
            reply(&mut conn.client, status, why);
        }
    }

    /// Deadlines that have passed, and the once-a-second tick.
    fn expire(&mut self) {
        let now = Instant::now();
        while let Some((id, key)) = self.timers.pop_due(now) {
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            if conn.id != id || conn.deadline.is_none_or(|deadline| deadline > now) {
                continue;
            }
            match self.phases.timed_out(conn) {
                Next::Wait | Next::Resolve => {}
                Next::Refuse(status, reason, address) => self.refuse(key, status, reason, address),
                Next::Close(end, status) => self.close(key, end, status),
            }
        }
        if let Some(at) = self.accept_paused_until {
            if at <= now {
                self.accept_paused_until = None;
                let ids: Vec<EndpointId> = self.served.keys().copied().collect();
                for id in ids {
                    self.accept(id);
                }
            }
        }
        if self.next_tick <= now {
            self.next_tick = now + TICK;
            self.tick(now);
        }
    }

    /// Live byte counts to the records; flood summaries to the log.
    fn tick(&mut self, now: Instant) {
        for (_, conn) in self.conns.iter_mut() {
            if !conn.recorded {
                continue;
            }
            if let Some(served) = self.served.get_mut(&conn.endpoint) {
                served.progress(conn);
            }
        }
        for served in self.served.values_mut() {
            served.tick(now);
        }
    }
}

/// An attempt as it is decided: allowed if there is no `reason`.
fn attempt(
    id: u64,
    at_ms: u64,
    host: &str,
    port: u16,
    address: Option<IpAddr>,
    reason: Option<String>,
) -> Attempt {
    Attempt {
        id,
        at_ms,
        host: host.to_owned(),
        port,
        address: address.map(|a| a.to_string()),
        allowed: reason.is_none(),
        reason,
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: 0,
    }
}
