//! The proxy's thread: one `mio::Poll` for every sandbox's endpoint and
//! every connection through it. Nothing here blocks: names are resolved
//! by the resolver threads, connects are non-blocking, and every wait
//! (a request head, a connect, a ClientHello) has a deadline.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::IpAddr;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use rustls::ClientConfig;
use slab::Slab;

use super::connection::{Conn, Phase};
use super::http::SetHeader;
use super::log_budget::LogBudget;
use super::reply::reply;
use super::resolver::{Answer, Resolver};
use super::settings::{ProxySettings, SandboxId};
use super::splice::SCRATCH_BYTES;
use super::tls::Authority;
use crate::network::policy::{Decision, Policy};
use crate::network::record::{lock, Attempt, Record};

/// What the other threads ask of the loop.
#[derive(Debug)]
pub enum Control {
    Serve {
        id: SandboxId,
        label: String,
        listener: std::net::TcpListener,
        policy: Policy,
        record: Arc<Mutex<Record>>,
    },
    SetPolicy {
        id: SandboxId,
        policy: Policy,
    },
    Forget {
        id: SandboxId,
    },
    Stop,
}

/// The waker's token; listeners' tokens have [`LISTENER`] set; a
/// connection's are its slot times two, plus one for its upstream socket.
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
/// The answer to a CONNECT once the upstream is connected.
pub(super) const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// One sandbox's endpoint.
#[derive(Debug)]
pub(super) struct Sandbox {
    pub(super) label: String,
    /// `None` once it is being forgotten: closed first, so that nothing
    /// connects while its connections close.
    pub(super) listener: Option<TcpListener>,
    pub(super) listener_key: usize,
    pub(super) policy: Policy,
    pub(super) record: Arc<Mutex<Record>>,
    /// Its connections open or opening.
    pub(super) open: usize,
    pub(super) log: LogBudget,
}

/// How a connection ends, for the record.
#[derive(Debug)]
pub(super) enum End {
    /// Both sides closed.
    Closed,
    /// An allowed connection failed or was closed by the proxy.
    Failed(String),
    /// Refused after it was allowed (the TLS server name).
    Refused(String),
}

/// The loop and everything it owns.
pub struct EventLoop {
    pub(super) poll: Poll,
    pub(super) settings: ProxySettings,
    pub(super) credentials: HashMap<String, Vec<SetHeader>>,
    pub(super) authority: Authority,
    pub(super) upstream_tls: Arc<ClientConfig>,
    pub(super) control: Receiver<Control>,
    pub(super) resolver: Resolver,
    pub(super) answers: Receiver<Answer>,
    pub(super) sandboxes: HashMap<SandboxId, Sandbox>,
    pub(super) listeners: Slab<SandboxId>,
    pub(super) conns: Slab<Conn>,
    pub(super) timers: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    pub(super) next_id: u64,
    pub(super) scratch: Vec<u8>,
    pub(super) accept_paused_until: Option<Instant>,
    /// When a shortage of descriptors was last logged.
    pub(super) shortage_logged: Option<Instant>,
    pub(super) next_tick: Instant,
}

impl std::fmt::Debug for EventLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLoop")
            .field("sandboxes", &self.sandboxes.len())
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
    pub answers: Receiver<Answer>,
}

impl EventLoop {
    pub fn new(parts: Parts) -> EventLoop {
        let mut credentials: HashMap<String, Vec<SetHeader>> = HashMap::new();
        for credential in &parts.settings.credentials {
            credentials
                .entry(credential.host.to_ascii_lowercase())
                .or_default()
                .push(SetHeader {
                    name: credential.header.clone(),
                    value: credential.value.clone(),
                });
        }
        EventLoop {
            poll: parts.poll,
            settings: parts.settings,
            credentials,
            authority: parts.authority,
            upstream_tls: parts.upstream_tls,
            control: parts.control,
            resolver: parts.resolver,
            answers: parts.answers,
            sandboxes: HashMap::new(),
            listeners: Slab::new(),
            conns: Slab::new(),
            timers: BinaryHeap::new(),
            next_id: 1,
            scratch: vec![0; SCRATCH_BYTES],
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
                    Token(token) => self.ready(token >> 1, token & 1 == 1, event),
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
        if let Some(Reverse((at, _, _))) = self.timers.peek() {
            wake = wake.min(*at);
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
                Ok(Control::Stop) | Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return false
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return true,
            }
        }
    }

    fn serve(
        &mut self,
        id: SandboxId,
        label: String,
        listener: std::net::TcpListener,
        policy: Policy,
        record: Arc<Mutex<Record>>,
    ) {
        // A sandbox served again replaces its old endpoint.
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
        self.sandboxes.insert(
            id,
            Sandbox {
                label,
                listener: Some(listener),
                listener_key,
                policy,
                record,
                open: 0,
                log: LogBudget::default(),
            },
        );
        // Connections may have queued before the listener was registered.
        self.accept(id);
    }

    fn set_policy(&mut self, id: SandboxId, policy: Policy) {
        let Some(sandbox) = self.sandboxes.get_mut(&id) else {
            return;
        };
        sandbox.policy = policy;
        let refused: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.sandbox == id && conn.recorded)
            .filter(|(_, conn)| {
                let (host, port) = conn.target();
                conn.address.is_some_and(|address| {
                    matches!(
                        sandbox.policy.decide(host, address.ip(), port),
                        Decision::Refused(_)
                    )
                })
            })
            .map(|(key, _)| key)
            .collect();
        for key in refused {
            let reason = "policy changed".to_owned();
            if self.conns[key].phase == Phase::Connecting {
                // Not answered yet: the client learns why.
                self.fail(key, 403, reason);
            } else {
                self.close(key, End::Failed(reason));
            }
        }
    }

    fn forget(&mut self, id: SandboxId) {
        let Some(mut sandbox) = self.sandboxes.remove(&id) else {
            return;
        };
        if let Some(mut listener) = sandbox.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        self.listeners.remove(sandbox.listener_key);
        let keys: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, conn)| conn.sandbox == id)
            .map(|(key, _)| key)
            .collect();
        // Their record is the sandbox's still: write it before it goes.
        self.sandboxes.insert(id, sandbox);
        for key in keys {
            self.close(key, End::Failed("the sandbox's proxy was stopped".into()));
        }
        self.sandboxes.remove(&id);
    }

    /// Accepts what waits on sandbox `id`'s endpoint.
    fn accept(&mut self, id: SandboxId) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            let Some(sandbox) = self.sandboxes.get_mut(&id) else {
                return;
            };
            let Some(listener) = sandbox.listener.as_ref() else {
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
                    log::warn!("network: {}'s proxy endpoint: {e}", sandbox.label);
                    return;
                }
            };
            if sandbox.open >= self.settings.max_connections {
                let reason = format!(
                    "{} connections are open already, the most a sandbox may have",
                    self.settings.max_connections
                );
                let attempt = self.attempt_for(None, "", 0, None, Some(reason.clone()));
                let sandbox = self.sandboxes.get_mut(&id).expect("looked up above");
                note_refused(sandbox, attempt, &reason);
                let mut stream = stream;
                reply(&mut stream, 503, &reason);
                continue;
            }
            sandbox.open += 1;
            let now = Instant::now();
            self.next_id += 1;
            let conn_id = self.next_id;
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            let mut conn = Conn::new(conn_id, id, stream, now);
            if let Err(e) = self.poll.registry().register(
                &mut conn.client,
                Token(key << 1),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                log::warn!("network: registering a proxy connection: {e}");
                sandbox.open -= 1;
                continue;
            }
            entry.insert(conn);
            self.set_deadline(key, now + self.settings.head_timeout);
        }
    }

    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn set_deadline(&mut self, key: usize, at: Instant) {
        if let Some(conn) = self.conns.get_mut(key) {
            conn.deadline = Some(at);
            self.timers.push(Reverse((at, conn.id, key)));
        }
    }

    /// Readiness on connection `key`'s client or upstream socket.
    fn ready(&mut self, key: usize, upstream: bool, event: &mio::event::Event) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        match conn.phase {
            Phase::Head if !upstream => self.read_head(key),
            Phase::Connecting if upstream => self.connecting(key),
            Phase::Hello => self.hello(key),
            Phase::Splice => {
                let towards_upstream = (upstream && event.is_writable())
                    || (!upstream && (event.is_readable() || event.is_read_closed()));
                let towards_client = (!upstream && event.is_writable())
                    || (upstream && (event.is_readable() || event.is_read_closed()));
                self.splice(
                    key,
                    towards_upstream || event.is_error(),
                    towards_client || event.is_error(),
                );
            }
            Phase::Intercept => self.intercept(key),
            _ => {}
        }
    }

    /// Refuses connection `key` before anything was allowed: the status
    /// and reason to the client, the attempt to the record.
    pub(super) fn refuse(
        &mut self,
        key: usize,
        status: u16,
        reason: String,
        address: Option<IpAddr>,
    ) {
        let conn = &self.conns[key];
        let (host, port) = conn.target();
        let (host, port, at_ms, id, sandbox) =
            (host.to_owned(), port, conn.at_ms, conn.id, conn.sandbox);
        let attempt = self.attempt_for(
            Some((id, at_ms)),
            &host,
            port,
            address,
            Some(reason.clone()),
        );
        // Recorded before the client hears: what it does next (a run that
        // ends at once) finds the refusal in the record.
        if let Some(sandbox) = self.sandboxes.get_mut(&sandbox) {
            note_refused(sandbox, attempt, &reason);
        }
        reply(&mut self.conns[key].client, status, &reason);
        self.close(key, End::Closed);
    }

    pub(super) fn attempt_for(
        &mut self,
        id: Option<(u64, u64)>,
        host: &str,
        port: u16,
        address: Option<IpAddr>,
        reason: Option<String>,
    ) -> Attempt {
        let (id, at_ms) = match id {
            Some((id, at_ms)) if at_ms != 0 => (id, at_ms),
            Some((id, _)) => (id, epoch_ms()),
            None => (self.fresh_id(), epoch_ms()),
        };
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

    /// Closes connection `key`: both sockets, and its end in the record
    /// and the log.
    pub(super) fn close(&mut self, key: usize, end: End) {
        self.close_answering(key, end, None);
    }

    /// Ends allowed connection `key` before the client was answered: the
    /// record says why, then the client hears `status` and why.
    pub(super) fn fail(&mut self, key: usize, status: u16, reason: String) {
        self.close_answering(key, End::Failed(reason), Some(status));
    }

    pub(super) fn close_answering(&mut self, key: usize, end: End, status: Option<u16>) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        if let Some(lookup) = conn.lookup.take() {
            lookup.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        // The client hears last, when the record has the end: what it does
        // next (a run that ends at once) finds it there.
        let answer = |conn: &mut Conn| {
            if let (Some(status), End::Failed(why) | End::Refused(why)) = (status, &end) {
                reply(&mut conn.client, status, why);
            }
        };
        let _ = self.poll.registry().deregister(&mut conn.client);
        if let Some(upstream) = conn.upstream.as_mut() {
            let _ = self.poll.registry().deregister(upstream);
        }
        let Some(sandbox) = self.sandboxes.get_mut(&conn.sandbox) else {
            return answer(&mut conn);
        };
        sandbox.open = sandbox.open.saturating_sub(1);
        if !conn.recorded {
            return answer(&mut conn);
        }
        let (out, inn) = conn.bytes();
        let duration_ms = conn.asked.elapsed().as_millis() as u64;
        let (host, port) = conn.target();
        let (host, port) = (host.to_owned(), port);
        let address = conn.address.map_or_else(String::new, |a| a.to_string());
        {
            let mut record = lock(&sandbox.record);
            record.finished(
                conn.id,
                out - conn.reported.0,
                inn - conn.reported.1,
                duration_ms,
            );
            match &end {
                End::Closed => {}
                End::Failed(why) => record.ended(conn.id, why.clone()),
                End::Refused(why) => record.refused_after(conn.id, why.clone()),
            }
        }
        answer(&mut conn);
        match end {
            End::Refused(why) => {
                if sandbox.log.allow() {
                    log::warn!(
                        "network: {} refused {host}:{port} ({address}): {why}",
                        sandbox.label
                    );
                }
            }
            End::Closed | End::Failed(_) => {
                // Only lines that would be written count against the budget.
                if log::log_enabled!(log::Level::Info) && sandbox.log.allow() {
                    let why = match &end {
                        End::Failed(why) => format!(", {why}"),
                        _ => String::new(),
                    };
                    log::info!(
                        "network: {} {host}:{port} ({address}) {out} bytes out, {inn} in, {duration_ms} ms{why}",
                        sandbox.label
                    );
                }
            }
        }
    }

    /// Deadlines that have passed, and the once-a-second tick.
    fn expire(&mut self) {
        let now = Instant::now();
        while let Some(&Reverse((at, id, key))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            if conn.id != id || conn.deadline.is_none_or(|deadline| deadline > now) {
                continue;
            }
            match conn.phase {
                Phase::Head => {
                    let reason = format!(
                        "no whole request head within {} ms",
                        self.settings.head_timeout.as_millis()
                    );
                    self.refuse(key, 408, reason, None);
                }
                Phase::Resolving | Phase::Connecting => {
                    let (host, port) = conn.target();
                    let reason = format!(
                        "{host}:{port} was not reached within {} ms",
                        self.settings.connect_timeout.as_millis()
                    );
                    if conn.recorded {
                        self.fail(key, 504, reason);
                    } else {
                        self.refuse(key, 504, reason, None);
                    }
                }
                Phase::Hello => {
                    let reason = format!(
                        "no whole TLS ClientHello within {} ms",
                        self.settings.head_timeout.as_millis()
                    );
                    self.close(key, End::Refused(reason));
                }
                Phase::Intercept => {
                    let reason = format!(
                        "no TLS handshake within {} ms",
                        self.settings.head_timeout.as_millis()
                    );
                    self.close(key, End::Failed(reason));
                }
                Phase::Splice => {}
            }
        }
        if let Some(at) = self.accept_paused_until {
            if at <= now {
                self.accept_paused_until = None;
                let ids: Vec<SandboxId> = self.sandboxes.keys().copied().collect();
                for id in ids {
                    self.accept(id);
                }
            }
        }
        if self.next_tick <= now {
            self.next_tick = now + TICK;
            self.tick();
        }
    }

    /// Live byte counts to the records; flood summaries to the log.
    fn tick(&mut self) {
        for (_, conn) in self.conns.iter_mut() {
            if !conn.recorded {
                continue;
            }
            let (out, inn) = conn.bytes();
            if (out, inn) == conn.reported {
                continue;
            }
            if let Some(sandbox) = self.sandboxes.get(&conn.sandbox) {
                let duration_ms = conn.asked.elapsed().as_millis() as u64;
                lock(&sandbox.record).finished(
                    conn.id,
                    out - conn.reported.0,
                    inn - conn.reported.1,
                    duration_ms,
                );
                conn.reported = (out, inn);
            }
        }
        for sandbox in self.sandboxes.values_mut() {
            if let Some(suppressed) = sandbox.log.summary() {
                log::warn!(
                    "network: {}: {suppressed} more connection log lines in the last second were left out",
                    sandbox.label
                );
            }
        }
    }
}

/// Records a refused attempt and logs it (within the sandbox's budget).
fn note_refused(sandbox: &mut Sandbox, attempt: Attempt, reason: &str) {
    if sandbox.log.allow() {
        let what = match (&attempt.host, &attempt.address) {
            // Refused before its head named anything.
            (host, _) if host.is_empty() => "a connection".to_owned(),
            (host, Some(address)) => format!("{host}:{} ({address})", attempt.port),
            (host, None) => format!("{host}:{}", attempt.port),
        };
        log::warn!("network: {} refused {what}: {reason}", sandbox.label);
    }
    lock(&sandbox.record).attempted(attempt);
}

pub(super) fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
