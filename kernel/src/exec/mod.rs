//! EXEC: agent-written code run in pooled, isolated sandboxes. Only what a
//! run prints comes back, each stream capped in fixed memory ([`output`]).
//!
//! An exec host is a sandbox of the runtime (the exec-host shape) whose
//! workload is a Python zygote ([`host`], `zygote.py`): it keeps run
//! children forked from its warm image, each already isolated and waiting
//! for code, and hands them to the kernel over the channel its claim
//! brought ([`wire`]). A request takes the oldest ready child, sends it the
//! code, and is answered once the child has said how it ended and its
//! output pipes have closed ([`run`]); a child serves one run and is gone,
//! and the host prepares another. A timeout kills the run's whole PID
//! namespace through the pidfd the child sent first.
//!
//! Everything here runs on the reactor thread and never blocks.

pub mod files;
pub mod host;
mod hosts;
pub mod output;
pub mod run;
mod sessions;
pub mod wire;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{to_json, ExecRequest, Language};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use slab::Slab;

use crate::address::{Reply, ReplyTo};
use crate::cgroup::CgroupLimits;
use crate::config::Config;
use crate::identity::Identity;
use crate::sandbox::runtime::Sandboxes;
use crate::timers::Timers;
use host::HostSetup;
use hosts::Host;
use run::{Kill, RunChild, Running, Stage, Stream};
pub use sessions::SessionOwner;
use sessions::{Session, SessionKey};

/// How many tokens EXEC's sources may take, from its base.
pub const TOKEN_SPAN: usize = 1 << 40;
/// Requests that may wait for a ready run child; beyond this, `busy`.
const MAX_WAITING: usize = 1024;

/// Names an exec host: the owner of its sandbox.
pub type HostId = u32;

#[derive(Clone, Copy, Debug)]
enum Source {
    Channel(usize),
    Socket(usize),
    Output(usize, Stream),
}

#[derive(Clone, Debug)]
enum Wake {
    /// A run's timeout, if it is still that run.
    Timeout { child: usize, started: Instant },
    /// Start the hosts that are missing.
    StartHosts,
    /// Close a session unused since `last_used`, if it still is.
    SessionIdle { key: SessionKey, last_used: Instant },
    /// Answer the waiting requests whose deadline has passed.
    WaitedTooLong,
}

/// A request waiting for a run child.
#[derive(Debug)]
struct Waiting {
    request: ExecRequest,
    reply_to: ReplyTo,
    /// Who asked: the run's own connection to the kernel is theirs.
    caller: Identity,
    /// Its wall-clock limit.
    timeout: Duration,
    /// Past this, waiting counts against the run's timeout: it is
    /// answered `timeout` rather than left waiting.
    deadline: Instant,
    /// The session it runs in, if any.
    session: Option<SessionKey>,
}

/// The EXEC subsystem.
#[derive(Debug)]
pub struct Exec {
    registry: Registry,
    token_base: usize,
    sources: Slab<Source>,
    hosts: Slab<Host>,
    next_host: HostId,
    wanted_hosts: usize,
    children: Slab<RunChild>,
    /// Ready children, oldest first.
    ready: VecDeque<usize>,
    waiting: VecDeque<Waiting>,
    sessions: HashMap<SessionKey, Session>,
    session_idle: Duration,
    max_sessions: usize,
    timers: Timers<Wake>,
    /// Runs' own connections to the kernel, for the reactor to admit.
    adopted: Vec<(mio::net::UnixStream, Identity)>,
    setup: HostSetup,
    /// Each host's cgroup: room for its zygote and every prepared run.
    host_limits: CgroupLimits,
    log: PathBuf,
    output_bytes: usize,
    max_file_bytes: u64,
    default_timeout: Duration,
    /// Why EXEC cannot work on this host, if it cannot.
    unavailable: Option<String>,
    shutting_down: bool,
}

impl Exec {
    /// EXEC as configured; hosts start with [`Exec::start_hosts`]. Its
    /// sources are registered with `registry` from `token_base` on.
    pub fn new(
        config: &Config,
        registry: &Registry,
        token_base: usize,
        namespaces: bool,
    ) -> io::Result<Exec> {
        let exec = &config.exec;
        let unavailable = if !namespaces {
            Some(
                "EXEC needs namespaces for its isolation, and this host gives the daemon none"
                    .to_owned(),
            )
        } else if !exec.python.exists() {
            Some(format!(
                "exec.python ({}) does not exist",
                exec.python.display()
            ))
        } else {
            None
        };
        if let Some(reason) = &unavailable {
            log::warn!("EXEC unavailable: {reason}");
        }
        Ok(Exec {
            registry: registry.try_clone()?,
            token_base,
            sources: Slab::new(),
            hosts: Slab::new(),
            next_host: 1,
            wanted_hosts: if unavailable.is_some() { 0 } else { exec.hosts },
            children: Slab::new(),
            ready: VecDeque::new(),
            waiting: VecDeque::new(),
            sessions: HashMap::new(),
            session_idle: Duration::from_secs(exec.session_idle_secs),
            max_sessions: exec.max_sessions,
            timers: Timers::default(),
            adopted: Vec::new(),
            setup: HostSetup {
                python: exec.python.clone(),
                ready_runs: exec.ready_runs,
                tmp_bytes: config.agents.tmp_bytes,
                workspace_bytes: config.agents.workspace_bytes,
            },
            host_limits: {
                let share = exec.ready_runs as u64 + 1;
                CgroupLimits {
                    memory: exec.default_memory.saturating_mul(share),
                    cpu_quota: None,
                    cpu_period: 100_000,
                    max_pids: exec.default_max_pids.saturating_mul(share),
                }
            },
            log: config.agents.log_dir().join("exec-host.log"),
            output_bytes: exec.output_bytes,
            max_file_bytes: exec.max_file_bytes,
            default_timeout: Duration::from_millis(exec.default_timeout_ms),
            unavailable,
            shutting_down: false,
        })
    }

    /// Runs' connections to the kernel made since the last call, each with
    /// the identity of the caller whose run holds it.
    pub fn take_adopted(&mut self) -> Vec<(mio::net::UnixStream, Identity)> {
        std::mem::take(&mut self.adopted)
    }

    /// Whether runs' connections wait for the reactor.
    pub fn has_adopted(&self) -> bool {
        !self.adopted.is_empty()
    }

    /// Whether EXEC can serve runs on this host.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// Whether a token is one of EXEC's.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKEN_SPAN).contains(&token.0)
    }

    /// A run request. Refusals come back at once; otherwise the reply is
    /// pushed to `replies` when the run ends.
    pub fn run(
        &mut self,
        request: ExecRequest,
        owner: SessionOwner,
        caller: Identity,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        if let Some(reason) = &self.unavailable {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("EXEC is unavailable: {reason}"),
            ));
        }
        if self.shutting_down {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "the kernel is shutting down",
            ));
        }
        files::check(&request.files, self.max_file_bytes)?;
        if request.limits.is_some() {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "EXEC field `limits` is not served by this kernel yet; runs without it work",
            ));
        }
        let queued =
            self.waiting.len() + self.sessions.values().map(|s| s.queue.len()).sum::<usize>();
        if queued >= MAX_WAITING {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("{queued} runs are waiting for a sandbox; retry later"),
            ));
        }
        let now = Instant::now();
        let timeout = request
            .timeout_ms
            .map_or(self.default_timeout, Duration::from_millis);
        let deadline = now + timeout;
        let session = request.session.clone().map(|name| (owner, name));
        if let Some(key) = &session {
            if let Some(open) = self.sessions.get_mut(key) {
                open.queue.push_back(Waiting {
                    request,
                    reply_to,
                    caller,
                    timeout,
                    deadline,
                    session: session.clone(),
                });
                self.serve_session(key, replies, now);
                self.expire_if_still_waiting(reply_to, deadline);
                return Ok(());
            }
            let held = self.sessions.keys().filter(|(o, _)| *o == owner).count();
            if held >= self.max_sessions {
                return Err(ErrorReply::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "you hold {held} sessions, the most exec.max_sessions allows; close \
                         one ({{\"op\":\"close\"}}) first"
                    ),
                ));
            }
        }
        self.waiting.push_back(Waiting {
            request,
            reply_to,
            caller,
            timeout,
            deadline,
            session,
        });
        self.dispatch(replies, now);
        self.expire_if_still_waiting(reply_to, deadline);
        Ok(())
    }

    /// A request that could not start at once is answered at its deadline
    /// if it is still waiting then.
    fn expire_if_still_waiting(&mut self, reply_to: ReplyTo, deadline: Instant) {
        let waiting = self
            .waiting
            .iter()
            .chain(self.sessions.values().flat_map(|s| s.queue.iter()))
            .any(|w| w.reply_to == reply_to);
        if waiting {
            self.timers.schedule(deadline, Wake::WaitedTooLong);
        }
    }

    /// Readiness of one of EXEC's tokens.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>) {
        let now = Instant::now();
        let Some(source) = self.sources.get(token.0 - self.token_base).copied() else {
            return;
        };
        match source {
            Source::Channel(host) => self.take_children(host, replies, now),
            Source::Socket(child) => {
                let Some(run) = self.children.get_mut(child) else {
                    return;
                };
                match run.stage {
                    Stage::Preparing => match run.receive_pidfd() {
                        Ok(true) => {
                            self.ready.push_back(child);
                            self.dispatch(replies, now);
                        }
                        Ok(false) => {}
                        Err(_) => self.drop_child(child),
                    },
                    Stage::Ready => {
                        // A waiting child says nothing: this is its close
                        // (its host ended).
                        if run.has_hung_up() {
                            self.child_gone(child, replies);
                        }
                    }
                    Stage::Running(_) => {
                        let unsent = run.flush().unwrap_or_else(|err| {
                            log::debug!("exec run: cannot send the order: {err}");
                            run.kill(Kill::Shutdown);
                            false
                        });
                        run.read_socket();
                        if run.overflowed() {
                            run.kill_quietly();
                        }
                        self.watch_writable(child, unsent);
                        self.finish_if_done(child, replies, now);
                    }
                    Stage::Ended => {}
                }
            }
            Source::Output(child, stream) => {
                if let Some(run) = self.children.get_mut(child) {
                    if run.read_stream(stream) {
                        self.forget_output(child, stream);
                    }
                    self.finish_if_done(child, replies, now);
                }
            }
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.timers.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        while let Some(wake) = self.timers.pop_due(now) {
            match wake {
                Wake::Timeout { child, started } => {
                    if let Some(run) = self.children.get_mut(child) {
                        if matches!(&run.stage, Stage::Running(r) if r.started == started) {
                            run.kill(Kill::Timeout);
                        }
                    }
                }
                Wake::StartHosts => self.start_hosts(sandboxes, now),
                Wake::WaitedTooLong => self.expire_waiting(replies, now),
                Wake::SessionIdle { key, last_used } => {
                    let idle = self
                        .sessions
                        .get(&key)
                        .is_some_and(|s| !s.busy && s.last_used == last_used);
                    if idle {
                        log::debug!("exec session {:?} closed after being idle", key.1);
                        self.close(key.0, &key.1, replies);
                    }
                }
            }
        }
    }

    /// Stops taking runs: waiting ones are refused, running ones killed
    /// (their replies still go out), hosts stopped.
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
    ) {
        self.shutting_down = true;
        for waiting in std::mem::take(&mut self.waiting) {
            let refusal = ErrorReply::new(ErrorCode::Unavailable, "the kernel is shutting down");
            replies.push((waiting.reply_to, refusal.to_json()));
        }
        for (_, run) in self.children.iter_mut() {
            if matches!(run.stage, Stage::Running(_)) {
                run.kill(Kill::Shutdown);
            }
        }
        for (_, host) in self.hosts.iter() {
            if let Some(sandbox) = host.sandbox {
                sandboxes.signal(sandbox, libc::SIGKILL);
            }
        }
    }

    // ---- runs ----------------------------------------------------------

    /// Gives waiting requests to ready children; a request for a session
    /// opened meanwhile joins that session's queue.
    fn dispatch(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        while let Some(waiting) = self.waiting.front() {
            if let Some(key) = waiting
                .session
                .clone()
                .filter(|k| self.sessions.contains_key(k))
            {
                if let (Some(waiting), Some(session)) =
                    (self.waiting.pop_front(), self.sessions.get_mut(&key))
                {
                    session.queue.push_back(waiting);
                }
                self.serve_session(&key, replies, now);
                continue;
            }
            let Some(child) = self.ready.pop_front() else {
                return;
            };
            if !matches!(
                self.children.get(child).map(|c| &c.stage),
                Some(Stage::Ready)
            ) {
                continue;
            }
            let Some(waiting) = self.waiting.pop_front() else {
                return;
            };
            if let Some(key) = waiting.session.clone() {
                let created = SystemTime::now();
                self.sessions.insert(
                    key,
                    Session {
                        child,
                        created_at: created,
                        last_used_at: created,
                        last_used: now,
                        runs: 0,
                        queue: VecDeque::new(),
                        busy: true,
                    },
                );
            }
            self.start(child, waiting, replies, now);
        }
    }

    /// Sends a request to a child (a session's keeps it for more).
    fn start(&mut self, child: usize, waiting: Waiting, replies: &mut Vec<Reply>, now: Instant) {
        let timeout = waiting.timeout;
        let keep = waiting.session.is_some();
        let limits = (self.max_file_bytes, self.max_collect_bytes());
        let order = order_for(waiting.request, limits, keep);
        let session = waiting.session.map(|(_, name)| name);
        let running = Running::new(waiting.reply_to, timeout, self.output_bytes, session, now);
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        // The run's own connection to the kernel: its calls are the caller's.
        let connection = match mio::net::UnixStream::pair() {
            Ok((ours, theirs)) => {
                let theirs = std::os::unix::net::UnixStream::from(theirs);
                // The run's end blocks, as any socket a program opens does.
                match theirs.set_nonblocking(false) {
                    Ok(()) => {
                        self.adopted.push((ours, waiting.caller));
                        Some(OwnedFd::from(theirs))
                    }
                    Err(err) => {
                        log::warn!("exec run: no kernel connection for it: {err}");
                        None
                    }
                }
            }
            Err(err) => {
                log::warn!("exec run: no kernel connection for it: {err}");
                None
            }
        };
        let unsent = run
            .start(&order, running, connection)
            .unwrap_or_else(|err| {
                log::debug!("exec run: cannot send the order: {err}");
                run.kill(Kill::Shutdown);
                false
            });
        self.watch_writable(child, unsent);
        self.timers.schedule(
            now + timeout,
            Wake::Timeout {
                child,
                started: now,
            },
        );
        self.finish_if_done(child, replies, now);
    }

    /// Answers a run that has ended, and lets its child go — unless a
    /// session keeps it.
    fn finish_if_done(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(run) = self.children.get_mut(child).filter(|c| c.is_finished()) else {
            return;
        };
        if let Some((reply_to, reply)) = run.finish(now) {
            replies.push((reply_to, to_json(&reply)));
        }
        let alive = run.is_alive();
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        let Some(key) = key else {
            return self.drop_child(child);
        };
        if !alive {
            // Its interpreter is gone (killed at a timeout, or it died):
            // so is the session, and what waited for it.
            if let Some(session) = self.sessions.remove(&key) {
                for waiting in session.queue {
                    let ended = ErrorReply::new(
                        ErrorCode::NotFound,
                        format!(
                            "session {:?} ended before this run could start (its interpreter \
                             was killed); run again to start a new one",
                            key.1
                        ),
                    );
                    replies.push((waiting.reply_to, ended.to_json()));
                }
            }
            return self.drop_child(child);
        }
        if let Err(err) = self.watch_outputs(child) {
            log::warn!("exec session: cannot watch its output: {err}");
            self.sessions.remove(&key);
            return self.drop_child(child);
        }
        if let Some(session) = self.sessions.get_mut(&key) {
            session.busy = false;
            session.runs += 1;
            session.last_used = now;
            self.timers.schedule(
                now + self.session_idle,
                Wake::SessionIdle {
                    key: key.clone(),
                    last_used: now,
                },
            );
        }
        self.serve_session(&key, replies, now);
    }

    /// Watches a child's (new) stdout and stderr pipes.
    fn watch_outputs(&mut self, child: usize) -> io::Result<()> {
        for stream in Stream::BOTH {
            let Some(run) = self.children.get(child) else {
                return Ok(());
            };
            let Some(pipe) = run.pipe(stream) else {
                continue;
            };
            set_nonblocking(pipe)?;
            let fd = pipe.as_raw_fd();
            let token = self.register(fd, Source::Output(child, stream), Interest::READABLE)?;
            self.children[child].output_tokens[stream.index()] = Some(token);
        }
        Ok(())
    }

    /// Watches a child's socket for writability while an order is unsent,
    /// and only then (a waiting child's socket is otherwise writable all
    /// along).
    fn watch_writable(&mut self, child: usize, writable: bool) {
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        let Some(token) = run.socket_token.filter(|_| run.writable != writable) else {
            return;
        };
        let interest = if writable {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        let fd = run.socket.as_raw_fd();
        match self
            .registry
            .reregister(&mut SourceFd(&fd), token, interest)
        {
            Ok(()) => run.writable = writable,
            Err(err) => log::warn!("exec run: cannot watch its socket: {err}"),
        }
    }

    /// A waiting child went away: a session it held ends with it.
    fn child_gone(&mut self, child: usize, replies: &mut Vec<Reply>) {
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        if let Some((owner, name)) = key {
            self.close(owner, &name, replies);
        }
        self.drop_child(child);
    }

    fn drop_child(&mut self, child: usize) {
        if !self.children.contains(child) {
            return;
        }
        for stream in Stream::BOTH {
            self.forget_output(child, stream);
        }
        let run = self.children.remove(child);
        if let Some(token) = run.socket_token {
            self.forget_source(run.socket.as_raw_fd(), token);
        }
        self.ready.retain(|c| *c != child);
    }

    /// Stops watching one of a child's pipes (closed already, or not).
    fn forget_output(&mut self, child: usize, stream: Stream) {
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        let token = run.output_tokens[stream.index()].take();
        let pipe = match stream {
            Stream::Stdout => run.stdout.take(),
            Stream::Stderr => run.stderr.take(),
        };
        if let Some(token) = token {
            self.sources.try_remove(token.0 - self.token_base);
        }
        if let Some(pipe) = pipe {
            let _ = self.registry.deregister(&mut SourceFd(&pipe.as_raw_fd()));
        }
    }

    fn register(&mut self, fd: RawFd, source: Source, interest: Interest) -> io::Result<Token> {
        let entry = self.sources.vacant_entry();
        let token = Token(self.token_base + entry.key());
        watch(&self.registry, fd, token, interest)?;
        entry.insert(source);
        Ok(token)
    }

    fn forget_source(&mut self, fd: RawFd, token: Token) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
        self.sources.try_remove(token.0 - self.token_base);
    }
}

impl Exec {
    /// What a run may collect in all: the reply's limit, less its output
    /// and room for its other fields, as raw bytes before base64.
    fn max_collect_bytes(&self) -> u64 {
        let room = (run::MAX_END_FRAME as u64)
            .saturating_sub(2 * self.output_bytes as u64)
            .saturating_sub(64 << 10);
        room / 4 * 3
    }
}

/// What a request becomes for the run child.
/// `limits`: the largest file collected, and the most collected in all.
fn order_for(request: ExecRequest, limits: (u64, u64), keep: bool) -> wire::RunOrder {
    let (max_file_bytes, max_collect_bytes) = limits;
    let mut env = host::run_env();
    env.extend(request.env);
    wire::RunOrder {
        code: request.code,
        language: match request.language {
            Language::Python => "python",
            Language::Bash => "bash",
        }
        .to_owned(),
        env,
        cwd: request.cwd,
        files: request.files,
        collect: request.collect,
        max_file_bytes,
        max_collect_bytes,
        keep,
    }
}

fn watch(registry: &Registry, fd: RawFd, token: Token, interest: Interest) -> io::Result<()> {
    registry.register(&mut SourceFd(&fd), token, interest)
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}
