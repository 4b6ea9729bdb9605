//! One run child, from the moment its host hands it over: it sends its
//! pidfd, waits as `Ready` (given its first run's kernel connection, and a
//! shell if bash runs come), takes an order, and is `Running` until its
//! socket and both output pipes have closed — then the reply is built
//! (`order`). A session's child then hands over fresh pipes and is ready
//! again. It holds its cgroups: its own, and the one inside its agent's it
//! moves into with its first order.
//! Nothing here blocks: every descriptor is non-blocking and read to
//! `WouldBlock` on each readiness event.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use agentos_egress::gateway::net_totals;
use agentos_egress::policy::Policy;
use agentos_egress::Endpoint;
use agentos_proto::payload::{NetTotals, SessionUsage};
use mio::Token;

use super::order::{Finished, Kill, Order, Running};
use super::output::Stream;
use super::queues::Share;
use super::run_cgroup::RunCgroup;
use super::wire::{self, PrepareOrder, Ready, WireError};
use crate::cgroup::{CgroupError, CgroupLimits, Freezer};
use crate::fd;
use crate::identity::Principal;
use crate::process;
use crate::telemetry::tracer::OpenSpan;

/// Where a run child is in its life.
#[derive(Debug)]
pub enum Stage {
    /// Handed over; its pidfd has not arrived yet.
    Preparing,
    /// Waiting for code.
    Ready,
    /// Running an order.
    Running(Box<Running>),
    /// A session's child whose run is answered, until it hands over the
    /// fresh stdout and stderr pipes of its next run.
    Renewing,
    /// Its run is over and it takes no more: about to be dropped.
    Ended,
}

/// Why a run's limits could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// Its cgroup is inside its agent's on cgroup v2, which gives it no
    /// limits of its own, and the run asked for some.
    #[error(
        "on this host an agent's runs share the agent's own limits (cgroup v2 allows no \
         limits of their own beside the agent's processes); ask for none"
    )]
    SharedWithAgent,
    /// Writing them into its cgroup failed.
    #[error(transparent)]
    Apply(#[from] CgroupError),
    /// It has no cgroup of its own, and the run asked for limits.
    #[error("the sandbox this run got has no cgroup of its own (see the kernel's log)")]
    NoCgroup,
}

/// A run child and its descriptors.
#[derive(Debug)]
pub struct RunChild {
    /// The host it belongs to.
    pub host: usize,
    /// Its socket (non-blocking).
    pub socket: OwnedFd,
    /// Its stdout and stderr read ends, until each closes.
    pub stdout: Option<OwnedFd>,
    /// See `stdout`.
    pub stderr: Option<OwnedFd>,
    /// PID 1 of its namespace, once it has said so.
    pub pidfd: Option<OwnedFd>,
    /// Where it is.
    pub stage: Stage,
    /// Descriptors it sent since its last run began (a session's fresh
    /// stdout and stderr pipes).
    pub received: Vec<OwnedFd>,
    /// What its /workspace held after its last run (a session's).
    pub workspace_bytes: Option<u64>,
    /// Its socket's token, once watched.
    pub socket_token: Option<Token>,
    /// Its stdout's and stderr's tokens (by [`Stream::index`]), while
    /// watched.
    pub output_tokens: [Option<Token>; 2],
    /// Its socket is watched for writability too (an order is unsent).
    pub writable: bool,
    /// Its own cgroup, if it has one: the one it moved itself into when it
    /// was prepared.
    pub cgroup: Option<RunCgroup>,
    /// The cgroup inside an agent's it moved itself into when its first
    /// order came, for an agent's run (or session): its memory and
    /// processes count against the agent's limits from then on.
    pub charged: Option<RunCgroup>,
    /// OOM kills its cgroup had seen when its last run ended (a session's
    /// child keeps its cgroup from run to run).
    pub oom_kills_seen: u64,
    /// The kernel's end of the connection the child got when it became
    /// ready, for its first run (adopted with that run's caller).
    pub first_connection: Option<mio::net::UnixStream>,
    /// It has a shell started for a bash run.
    pub shell: bool,
    /// It counts among the children asked of its host (its first run has
    /// not ended).
    pub counted: bool,
    /// Its endpoint on the egress proxy, once a run with a network policy
    /// came (a session's runs share it); it closes when the child goes.
    pub endpoint: Option<RunEndpoint>,
    /// Its record's counters when the current run started.
    pub net_before: NetTotals,
    /// The current run's span, with tracing on.
    pub span: Option<OpenSpan>,
    /// Since when its processes have stood frozen (its session paused).
    pub frozen_since: Option<Instant>,
    /// When a session came to keep it, and the CPU time its cgroup had
    /// used by then: the session's use is what came after (a cgroup
    /// serves runs before).
    pub session_cpu_from: Option<(Instant, u64)>,
}

/// A run child's endpoint on the egress proxy, with whose work it serves
/// and the policy in force there.
#[derive(Debug)]
pub struct RunEndpoint {
    pub endpoint: Endpoint,
    pub owner: Principal,
    pub policy: Policy,
}

impl RunEndpoint {
    /// Puts `policy` in force (the proxy closes what it now refuses).
    pub fn set_policy(&mut self, policy: Policy) {
        if policy != self.policy {
            self.endpoint.set_policy(policy.clone());
            self.policy = policy;
        }
    }
}

impl RunChild {
    /// A child `host` has just handed over (`ready`), in `cgroup` if the
    /// host gave it one; its pidfd is yet to come.
    pub fn new(host: usize, ready: Ready, cgroup: Option<RunCgroup>) -> RunChild {
        RunChild {
            host,
            socket: ready.socket,
            stdout: Some(ready.stdout),
            stderr: Some(ready.stderr),
            pidfd: None,
            stage: Stage::Preparing,
            received: Vec::new(),
            workspace_bytes: None,
            socket_token: None,
            output_tokens: [None, None],
            writable: false,
            oom_kills_seen: cgroup.as_ref().map_or(0, |c| c.oom_kills),
            cgroup,
            charged: None,
            first_connection: None,
            shell: false,
            counted: true,
            endpoint: None,
            net_before: NetTotals::default(),
            span: None,
            frozen_since: None,
            session_cpu_from: None,
        }
    }

    /// Takes in its pidfd, if it has come. `Ok(false)`: not yet.
    pub fn receive_pidfd(&mut self) -> io::Result<bool> {
        match wire::receive_pidfd(self.socket.as_fd()) {
            Ok(Some(pidfd)) => {
                // Prepared in the background, it runs at normal priority.
                if let Err(err) = process::normal_priority(pidfd.as_fd()) {
                    log::debug!("a run keeps the background priority it was prepared at: {err}");
                }
                self.pidfd = Some(pidfd);
                self.stage = Stage::Ready;
                Ok(true)
            }
            Ok(None) => Err(io::ErrorKind::UnexpectedEof.into()),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The cgroup its code runs in: the one inside its agent's, if it
    /// moved there, else its own.
    fn current_cgroup(&self) -> Option<&RunCgroup> {
        self.charged.as_ref().or(self.cgroup.as_ref())
    }

    /// Its cgroups, taken (to be recycled).
    pub fn cgroups(&mut self) -> impl Iterator<Item = RunCgroup> {
        self.cgroup.take().into_iter().chain(self.charged.take())
    }

    /// Gives its cgroup `limits`, if they are not in force already. A
    /// child without a cgroup of its own runs in the host's, which is
    /// refused when the run asked for limits of its own (`asked`); so is a
    /// cgroup that cannot carry limits of its own (inside an agent's on
    /// cgroup v2, whose runs share the agent's).
    pub fn limit(&mut self, limits: &CgroupLimits, asked: bool) -> Result<(), LimitError> {
        let current = match &mut self.charged {
            Some(charged) => Some(charged),
            None => self.cgroup.as_mut(),
        };
        match current {
            Some(run) if !run.own_limits => {
                if asked {
                    return Err(LimitError::SharedWithAgent);
                }
                Ok(())
            }
            Some(run) if run.limits != *limits => {
                run.cgroup.apply(limits)?;
                run.limits = *limits;
                Ok(())
            }
            Some(_) => Ok(()),
            None if asked => Err(LimitError::NoCgroup),
            None => Ok(()),
        }
    }

    /// The share of EXEC its run in progress holds, if it holds one.
    pub fn holds(&self) -> Option<Share> {
        match &self.stage {
            Stage::Running(running) => running.of.holds,
            _ => None,
        }
    }

    /// OOM kills in the cgroup its code runs in so far (0 without one).
    fn oom_kills(&self) -> u64 {
        self.current_cgroup()
            .map_or(0, |run| run.cgroup.oom_kills())
    }

    /// Whether the memory controller has killed one of its processes since
    /// its last run ended (while it waited, for a session's).
    pub fn was_oom_killed(&self) -> bool {
        self.oom_kills() > self.oom_kills_seen
    }

    /// Takes the cgroup inside its agent's it is to move itself into with
    /// its first order: from now on its OOM kills, and a session's CPU
    /// time, are counted there.
    pub fn charge_to(&mut self, cgroup: RunCgroup) {
        self.oom_kills_seen = cgroup.oom_kills;
        self.charged = Some(cgroup);
        if self.session_cpu_from.is_some() {
            self.count_session_usage();
        }
    }

    /// A session keeps it from now: its CPU time counts from here.
    pub fn count_session_usage(&mut self) {
        // One file read on the reactor: the other figures are not needed.
        let used = self.current_cgroup().map(|run| run.cgroup.cpu_usage_usec());
        let since = self
            .session_cpu_from
            .map_or_else(Instant::now, |(since, _)| since);
        self.session_cpu_from = Some((since, used.unwrap_or(0)));
    }

    /// What its session's sandbox uses now, read from its cgroup; none
    /// without one.
    pub fn session_usage(&self) -> Option<SessionUsage> {
        let cgroup = &self.current_cgroup()?.cgroup;
        let stats = cgroup.stats();
        let (since, from) = self.session_cpu_from?;
        Some(SessionUsage {
            memory_bytes: stats.memory_current,
            memory_cache_bytes: cgroup.memory_cache(),
            cpu_usec: stats.cpu_usage_usec.saturating_sub(from),
            uptime_ms: since.elapsed().as_millis() as u64,
            pids: stats.pids_current,
        })
    }

    /// Gives a ready child its first run's kernel connection (`theirs`;
    /// the kernel keeps `ours` until that run's caller is known), and has
    /// it start a shell with it if `shell`. The socket is empty and the
    /// message small: it goes whole or not at all.
    pub fn prepare(
        &mut self,
        ours: mio::net::UnixStream,
        theirs: OwnedFd,
        shell: bool,
    ) -> io::Result<()> {
        self.send_prepare(&PrepareOrder::new(shell), &[theirs])?;
        self.first_connection = Some(ours);
        self.shell = shell;
        Ok(())
    }

    /// Has a child that waits warm with a template put the template's
    /// packages on its path before a run comes.
    pub fn settle_template(&mut self) -> io::Result<()> {
        self.send_prepare(&PrepareOrder::template(), &[])
    }

    /// Sends a prepare order with `fds`: small, on a socket with nothing
    /// queued, so it goes whole or not at all.
    fn send_prepare(&self, order: &PrepareOrder, fds: &[OwnedFd]) -> io::Result<()> {
        let message = wire::frame(order);
        let sent = fd::send_with_fds(self.socket.as_fd(), &message, fds)?;
        if sent != message.len() {
            return Err(io::Error::other(WireError::PreparePartly {
                sent,
                length: message.len(),
            }));
        }
        Ok(())
    }

    /// Gives it an order, with `attached` descriptors (the files that move
    /// it into its agent's cgroup first, then the run's kernel connection
    /// or a snapshot's memfd); returns whether bytes remain to be written
    /// (the socket must then be watched for writability).
    pub fn start(
        &mut self,
        order: &wire::RunOrder,
        running: Running,
        attached: Vec<OwnedFd>,
    ) -> io::Result<bool> {
        let mut running = running;
        running.send(order, attached);
        self.stage = Stage::Running(Box::new(running));
        self.flush()
    }

    /// Writes what the socket takes of the order; whether bytes remain.
    pub fn flush(&mut self) -> io::Result<bool> {
        match &mut self.stage {
            Stage::Running(running) => running.flush(self.socket.as_fd()),
            _ => Ok(false),
        }
    }

    /// Reads what the socket holds: the run's end frame (and a session's
    /// fresh pipes), or its close.
    pub fn read_socket(&mut self) {
        if let Stage::Running(running) = &mut self.stage {
            running.read_socket(self.socket.as_fd(), &mut self.received);
        }
    }

    /// One of its output pipes, while open.
    pub fn pipe(&self, stream: Stream) -> Option<&OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        }
    }

    /// Drains one output pipe into its capture; returns whether it closed
    /// (the caller then stops watching it).
    pub fn read_stream(&mut self, stream: Stream) -> bool {
        // The fields themselves, not `pipe`: the capture in `stage` is
        // written while the pipe is read.
        let pipe = match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        };
        let Some(pipe) = pipe else {
            return true;
        };
        let mut chunk = [0u8; 16 * 1024];
        let closed = loop {
            match read(pipe.as_fd(), &mut chunk) {
                Ok(0) => break true,
                Ok(n) => {
                    if let Stage::Running(running) = &mut self.stage {
                        running.push_output(stream, &chunk[..n]);
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break false,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        if closed {
            match stream {
                Stream::Stdout => self.stdout = None,
                Stream::Stderr => self.stderr = None,
            }
        }
        closed
    }

    /// Whether it sent more on its socket than an end frame can be.
    pub fn overflowed(&self) -> bool {
        matches!(&self.stage, Stage::Running(running) if running.overflowed())
    }

    /// Kills the run without naming a reason of the kernel's (the reply
    /// says what the run did).
    pub fn kill_quietly(&self) {
        if let Some(pidfd) = &self.pidfd {
            let _ = process::signal(pidfd.as_fd(), libc::SIGKILL);
        }
        // A frozen process takes its SIGKILL once thawed.
        if self.frozen_since.is_some() {
            if let Some(freezer) = self.freezer() {
                let _ = freezer.set(false);
            }
        }
    }

    /// Kills the run: SIGKILL to PID 1 of its namespace ends all in it.
    pub fn kill(&mut self, why: Kill) {
        if let Stage::Running(running) = &mut self.stage {
            running.killed_by(why);
        }
        self.kill_quietly();
    }

    /// The freezer of the cgroup its code runs in, if it has one.
    fn freezer(&self) -> Option<Freezer> {
        self.current_cgroup()?.cgroup.freezer()
    }

    /// Freezes its processes where they stand (`frozen`), or thaws them:
    /// the freezer, to wait on until they have all stopped. The time limit
    /// of a run it carries stands still while it is frozen.
    pub fn freeze(&mut self, frozen: bool, now: Instant) -> io::Result<Freezer> {
        let freezer = self.freezer().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "its sandbox has no cgroup with a freezer (the kernel runs without root, or \
                 the host mounts no freezer controller)",
            )
        })?;
        freezer.set(frozen)?;
        match (frozen, self.frozen_since) {
            (true, None) => self.frozen_since = Some(now),
            (false, Some(since)) => {
                self.frozen_since = None;
                if let Stage::Running(running) = &mut self.stage {
                    running.paused += now.saturating_duration_since(since);
                }
            }
            _ => {}
        }
        Ok(freezer)
    }

    /// Whether the run is over: it said how it ended (or its socket
    /// closed), and both pipes are drained to their end. (A session's
    /// child hands over its next pipes after that, off the request path.)
    pub fn is_finished(&self) -> bool {
        matches!(&self.stage, Stage::Running(running)
            if running.has_ended() && self.stdout.is_none() && self.stderr.is_none())
    }

    /// Takes in a renewing child's fresh pipes (one byte `P` with two
    /// descriptors). `Ok(true)`: it is ready again. An error: it closed its
    /// socket or sent what a child does not, and is done.
    pub fn receive_pipes(&mut self) -> io::Result<bool> {
        let mut byte = [0u8; 1];
        loop {
            match wire::receive_with_fds(self.socket.as_fd(), &mut byte) {
                Ok((1, fds))
                    if byte == wire::PIPES_MARK && self.received.is_empty() && fds.len() == 2 =>
                {
                    self.received = fds;
                }
                Ok(_) => return Err(io::Error::other(WireError::NotPipes)),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(self.take_pipes())
    }

    /// Makes the pipes received its stdout and stderr, and it `Ready`, if
    /// both are there.
    fn take_pipes(&mut self) -> bool {
        if self.received.len() < 2 {
            return false;
        }
        let mut pipes = std::mem::take(&mut self.received).into_iter();
        self.stdout = pipes.next();
        self.stderr = pipes.next();
        self.stage = Stage::Ready;
        true
    }

    /// Whether its socket has closed (peeked; what is queued stays).
    pub fn has_hung_up(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        let mut byte = [0u8; 1];
        matches!(
            recv(
                self.socket.as_raw_fd(),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
            ),
            Ok(0) | Err(nix::errno::Errno::ECONNRESET)
        )
    }

    /// Whether it can take another order (a session's child whose last
    /// run ended well, or a fresh one).
    pub fn is_alive(&self) -> bool {
        matches!(self.stage, Stage::Ready)
    }

    /// Whether it lives on after its run: ready again, or about to be.
    pub fn is_kept(&self) -> bool {
        matches!(self.stage, Stage::Ready | Stage::Renewing)
    }

    /// The reply for a finished run, and where it goes; a run with an
    /// endpoint says what its connections came to. A session's child
    /// whose run ended well is `Ready` again with fresh pipes, or
    /// `Renewing` until they come; any other has `Ended`.
    pub fn finish(&mut self, now: Instant) -> Option<Finished> {
        let Stage::Running(running) = std::mem::replace(&mut self.stage, Stage::Ended) else {
            return None;
        };
        let running = *running;
        if running.keeps_child() && !self.take_pipes() {
            self.stage = Stage::Renewing;
        }
        let oom_kills = self.oom_kills();
        let oom_killed = oom_kills > self.oom_kills_seen;
        self.oom_kills_seen = oom_kills;
        let oom = oom_killed.then(|| self.over_memory());
        let mut finished = running.finish(oom, now);
        self.workspace_bytes = finished.workspace_bytes.or(self.workspace_bytes);
        if let (Order::Run, Some(open)) = (&finished.order, &self.endpoint) {
            let now = net_totals(open.endpoint.record());
            finished.reply.network = Some(since(self.net_before, now));
        }
        Some(finished)
    }

    /// What a run's reply says when the memory controller killed it.
    fn over_memory(&self) -> String {
        match self.current_cgroup() {
            Some(run) if self.charged.is_some() => format!(
                "the run went over its memory limit ({} bytes), or its agent's with \
                 everything else the agent holds, and was killed",
                run.limits.memory
            ),
            run => format!(
                "the run went over its memory limit ({} bytes) and was killed",
                run.map_or(0, |run| run.limits.memory)
            ),
        }
    }
}

/// What a record's counters gained from `before` to `now`.
fn since(before: NetTotals, now: NetTotals) -> NetTotals {
    NetTotals {
        allowed: now.allowed.saturating_sub(before.allowed),
        refused: now.refused.saturating_sub(before.refused),
        bytes_out: now.bytes_out.saturating_sub(before.bytes_out),
        bytes_in: now.bytes_in.saturating_sub(before.bytes_in),
    }
}

/// read(2), with errors as `io::Error` (`WouldBlock` included).
fn read(fd: BorrowedFd<'_>, buffer: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd, buffer).map_err(io::Error::from)
}
