//! One run child, from the moment its host hands it over: it sends its
//! pidfd, waits as `Ready`, takes one order, and is `Running` until its
//! socket and both output pipes have closed — then the reply is built.
//! Nothing here blocks: every descriptor is non-blocking and read to
//! `WouldBlock` on each readiness event.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_proto::payload::{ExecReply, Truncated};
use mio::Token;

use super::cgroups::RunCgroup;
use super::output::Capture;
use super::queues::Share;
use super::wire::{self, RunEnd};
use crate::address::ReplyTo;
use crate::cgroup::{CgroupError, CgroupLimits};
use crate::fd;
use crate::identity::Principal;
use crate::process;

/// The most a run's end frame may hold: the reply's own limit, which its
/// collected files must fit in.
pub const MAX_END_FRAME: usize = agentos_proto::MAX_REPLY_BYTES as usize;

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

/// What a child is asked to do.
#[derive(Debug)]
pub enum Work {
    /// Run code.
    Run,
    /// Save the session's `/workspace` into `data` (a memfd) under `name`.
    Snapshot {
        /// The snapshot's name.
        name: String,
        /// Where it is written.
        data: OwnedFd,
    },
    /// Fill `/workspace` from the snapshot in `data`.
    Restore {
        /// The snapshot.
        data: OwnedFd,
    },
}

impl Work {
    /// The order's op.
    pub fn op(&self) -> wire::OrderOp {
        match self {
            Work::Run => wire::OrderOp::Run,
            Work::Snapshot { .. } => wire::OrderOp::Snapshot,
            Work::Restore { .. } => wire::OrderOp::Restore,
        }
    }
}

/// A finished order: its reply, where it goes, and what the order was.
#[derive(Debug)]
pub struct Finished {
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// How it ended, as a run's reply.
    pub reply: ExecReply,
    /// What it was.
    pub work: Work,
    /// What a snapshot or restore left out.
    pub left_out: Vec<String>,
    /// A snapshot's bytes of files.
    pub snapshot_bytes: Option<u64>,
}

/// Whose an order is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderOf {
    /// The run's number, for a run (not a snapshot or restore): its kernel
    /// connection speaks for it, and its TOOL calls are counted here.
    pub run: Option<u64>,
    /// Whose work it is.
    pub owner: Principal,
    /// Whose share of EXEC it holds while it runs, if it counts against one.
    pub holds: Option<Share>,
}

/// A run in progress.
#[derive(Debug)]
pub struct Running {
    /// Whose it is.
    pub of: OrderOf,
    /// TOOL calls answered on its kernel connection.
    pub tool_calls: u64,
    /// Bytes of their replies, delivered into the sandbox.
    pub tool_bytes: u64,
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// When the order went out.
    pub started: Instant,
    /// Its wall-clock limit.
    pub timeout: Duration,
    stdout: Capture,
    stderr: Capture,
    /// Order bytes not yet written.
    unsent: Vec<u8>,
    /// Descriptors sent with the order's first bytes.
    attached: Vec<OwnedFd>,
    /// Bytes read from the socket, not yet a whole frame.
    received: Vec<u8>,
    end: Option<RunEnd>,
    socket_closed: bool,
    /// Kept for a session: it hands over fresh pipes after its end.
    keep: bool,
    /// The session's name, for the reply.
    session: Option<String>,
    /// It wrote on its socket what no run child sends: more than an end
    /// frame can hold, or not a frame at all.
    overflowed: bool,
    /// The kernel killed it: its timeout passed (or the kernel is stopping).
    killed: Option<Kill>,
    /// What the order is.
    work: Work,
}

/// Why the kernel killed a run; its `Display` is what the run's reply
/// says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kill {
    /// Its timeout (this long) passed.
    Timeout(Duration),
    /// The kernel is shutting down.
    Shutdown,
    /// Its session was closed.
    Closed,
    /// Whoever asked for it cancelled it (a task), or went away.
    Cancelled,
    /// The agent or run whose work it is has ended.
    OwnerEnded,
    /// Its order could not be sent to its run child.
    Unsent,
}

impl fmt::Display for Kill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kill::Timeout(timeout) => write!(
                f,
                "the run took longer than its timeout of {} ms and was killed",
                timeout.as_millis()
            ),
            Kill::Shutdown => f.write_str("the kernel is shutting down; the run was killed"),
            Kill::Closed => f.write_str("the run's session was closed; the run was killed"),
            Kill::Cancelled => f.write_str("the run was cancelled and killed"),
            Kill::OwnerEnded => {
                f.write_str("the agent or run whose work it was has ended; the run was killed")
            }
            Kill::Unsent => {
                f.write_str("the kernel could not send the run child its order; the run was killed")
            }
        }
    }
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
}

/// Which of a child's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// Both, in index order.
    pub const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// Its place in per-stream arrays.
    pub fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

impl RunChild {
    /// Takes in its pidfd, if it has come. `Ok(false)`: not yet.
    pub fn receive_pidfd(&mut self) -> io::Result<bool> {
        match wire::receive_pidfd(self.socket.as_fd()) {
            Ok(Some(pidfd)) => {
                // Prepared in the idle class, it runs at normal priority.
                if let Err(err) = process::normal_priority(pidfd.as_fd()) {
                    log::debug!("a run keeps the idle priority it was prepared in: {err}");
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
    /// its first order: from now on its OOM kills are counted there.
    pub fn charge_to(&mut self, cgroup: RunCgroup) {
        self.oom_kills_seen = cgroup.oom_kills;
        self.charged = Some(cgroup);
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
        #[derive(serde::Serialize)]
        struct Prepare {
            op: &'static str,
            shell: bool,
        }
        let message = wire::frame(&Prepare {
            op: "prepare",
            shell,
        });
        let sent = fd::send_with_fds(self.socket.as_fd(), &message, &[theirs])?;
        if sent != message.len() {
            return Err(io::Error::other("the prepare message went in part"));
        }
        self.first_connection = Some(ours);
        self.shell = shell;
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
        running.unsent = wire::frame(order);
        running.attached = attached;
        self.stage = Stage::Running(Box::new(running));
        self.flush()
    }

    /// Writes what the socket takes of the order; whether bytes remain.
    pub fn flush(&mut self) -> io::Result<bool> {
        let Stage::Running(running) = &mut self.stage else {
            return Ok(false);
        };
        while !running.unsent.is_empty() {
            let sent = if running.attached.is_empty() {
                write(self.socket.as_fd(), &running.unsent)
            } else {
                fd::send_with_fds(self.socket.as_fd(), &running.unsent, &running.attached)
            };
            if sent.is_ok() {
                // Sent along with the first bytes; the run holds them now.
                running.attached.clear();
            }
            match sent {
                Ok(n) => {
                    running.unsent.drain(..n);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(false)
    }

    /// Reads what the socket holds: the run's end frame (and a session's
    /// fresh pipes), or its close.
    pub fn read_socket(&mut self) {
        let Stage::Running(running) = &mut self.stage else {
            return;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match wire::receive_with_fds(self.socket.as_fd(), &mut chunk) {
                Ok((0, _)) => {
                    running.socket_closed = true;
                    break;
                }
                Ok((n, fds)) => {
                    // The code can reach this socket too: what it sends is
                    // bounded, and descriptors beyond a session's two
                    // pipes are closed at once.
                    if running.received.len() + n > MAX_END_FRAME {
                        running.overflowed = true;
                        running.socket_closed = true;
                        running.received = Vec::new();
                        break;
                    }
                    running.received.extend_from_slice(&chunk[..n]);
                    let room = if running.keep {
                        2 - self.received.len().min(2)
                    } else {
                        0
                    };
                    self.received.extend(fds.into_iter().take(room));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    running.socket_closed = true;
                    break;
                }
            }
        }
        if running.end.is_none() && !running.overflowed {
            let declared = running
                .received
                .get(..4)
                .map(|header| u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
            match wire::take_frame::<RunEnd>(&mut running.received) {
                Some(Ok(end)) => running.end = Some(end),
                // Not a frame the run child would send: the code wrote on
                // the socket itself.
                Some(Err(_)) => running.overflowed = true,
                None if declared.is_some_and(|length| length as usize > MAX_END_FRAME) => {
                    running.overflowed = true
                }
                None => {}
            }
            if running.overflowed {
                running.received = Vec::new();
            }
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
                        match stream {
                            Stream::Stdout => running.stdout.push(&chunk[..n]),
                            Stream::Stderr => running.stderr.push(&chunk[..n]),
                        }
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
        matches!(&self.stage, Stage::Running(running) if running.overflowed)
    }

    /// Kills the run without naming a reason of the kernel's (the reply
    /// says what the run did).
    pub fn kill_quietly(&self) {
        if let Some(pidfd) = &self.pidfd {
            let _ = process::signal(pidfd.as_fd(), libc::SIGKILL);
        }
    }

    /// Kills the run: SIGKILL to PID 1 of its namespace ends all in it.
    pub fn kill(&mut self, why: Kill) {
        if let Stage::Running(running) = &mut self.stage {
            running.killed.get_or_insert(why);
        }
        if let Some(pidfd) = &self.pidfd {
            let _ = process::signal(pidfd.as_fd(), libc::SIGKILL);
        }
    }

    /// Whether the run is over: it said how it ended (or its socket
    /// closed), and both pipes are drained to their end. (A session's
    /// child hands over its next pipes after that, off the request path.)
    pub fn is_finished(&self) -> bool {
        matches!(&self.stage, Stage::Running(running)
            if (running.end.is_some() || running.socket_closed)
                && self.stdout.is_none()
                && self.stderr.is_none())
    }

    /// Takes in a renewing child's fresh pipes (one byte `P` with two
    /// descriptors). `Ok(true)`: it is ready again. An error: it closed its
    /// socket or sent what a child does not, and is done.
    pub fn receive_pipes(&mut self) -> io::Result<bool> {
        let mut byte = [0u8; 1];
        loop {
            match wire::receive_with_fds(self.socket.as_fd(), &mut byte) {
                Ok((1, fds)) if byte == *b"P" && self.received.is_empty() && fds.len() == 2 => {
                    self.received = fds;
                }
                Ok(_) => {
                    return Err(io::Error::other(
                        "a session's child sent what it should not",
                    ))
                }
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

    /// The reply for a finished run, and where it goes. A session's child
    /// whose run ended well is `Ready` again with fresh pipes, or
    /// `Renewing` until they come; any other has `Ended`.
    pub fn finish(&mut self, now: Instant) -> Option<Finished> {
        let Stage::Running(running) = std::mem::replace(&mut self.stage, Stage::Ended) else {
            return None;
        };
        let running = *running;
        if running.keep
            && !running.socket_closed
            && running.killed.is_none()
            && running.end.is_some()
            && !self.take_pipes()
        {
            self.stage = Stage::Renewing;
        }
        let stdout = running.stdout.finish();
        let stderr = running.stderr.finish();
        let oom_kills = self.oom_kills();
        let oom_killed = oom_kills > self.oom_kills_seen;
        self.oom_kills_seen = oom_kills;
        let mut files = Default::default();
        let mut workspace_bytes = None;
        let mut left_out = Vec::new();
        let mut snapshot_bytes = None;
        let (exit_code, signal, error) = match (running.killed, running.end) {
            (Some(kill), _) => (None, Some(libc::SIGKILL), Some(kill.to_string())),
            (None, Some(end)) => {
                let error = end
                    .error
                    .or_else(|| (!end.uncollected.is_empty()).then(|| end.uncollected.join("; ")));
                files = end.files;
                workspace_bytes = end.workspace_bytes;
                left_out = end.left_out;
                snapshot_bytes = end.snapshot_bytes;
                (Some(end.exit_code), None, error)
            }
            (None, None) if oom_killed => (
                None,
                Some(libc::SIGKILL),
                Some(match self.current_cgroup() {
                    Some(run) if self.charged.is_some() => format!(
                        "the run went over its memory limit ({} bytes), or its agent's with \
                         everything else the agent holds, and was killed",
                        run.limits.memory
                    ),
                    run => format!(
                        "the run went over its memory limit ({} bytes) and was killed",
                        run.map_or(0, |run| run.limits.memory)
                    ),
                }),
            ),
            (None, None) if running.overflowed => (
                None,
                Some(libc::SIGKILL),
                Some(
                    "the run wrote on its kernel socket what the kernel does not take (more \
                     than an end frame can hold, or not a frame) and was killed"
                        .to_owned(),
                ),
            ),
            (None, None) => (
                None,
                None,
                Some(
                    "the run ended without reporting how (it exited on its own, or was \
                     killed from inside)"
                        .to_owned(),
                ),
            ),
        };
        let timed_out = matches!(running.killed, Some(Kill::Timeout(_)));
        let reply = ExecReply {
            success: exit_code == Some(0) && !timed_out,
            stdout: stdout.text,
            stderr: stderr.text,
            exit_code,
            signal,
            error,
            duration_ms: now.saturating_duration_since(running.started).as_millis() as u64,
            timed_out,
            oom_killed,
            truncated: Truncated {
                stdout: stdout.dropped,
                stderr: stderr.dropped,
            },
            files,
            session: running.session,
            tool_calls: running.tool_calls,
            tool_bytes: running.tool_bytes,
            ..ExecReply::default()
        };
        self.workspace_bytes = workspace_bytes.or(self.workspace_bytes);
        Some(Finished {
            reply_to: running.reply_to,
            reply,
            work: running.work,
            left_out,
            snapshot_bytes,
        })
    }
}

impl Running {
    /// What the run has printed so far: the latest of its stdout, and of
    /// its stderr if it wrote any, within `max` bytes.
    pub fn output_so_far(&self, max: usize) -> String {
        let errors = self.stderr.latest(max / 4);
        let mut output = self.stdout.latest(max - errors.len());
        if !errors.is_empty() {
            output.push_str("\n[stderr]\n");
            output.push_str(&errors);
        }
        output
    }

    /// A run about to start, keeping `output_bytes` of each stream.
    pub fn new(
        of: OrderOf,
        reply_to: ReplyTo,
        work: Work,
        timeout: Duration,
        output_bytes: usize,
        session: Option<String>,
        now: Instant,
    ) -> Self {
        Running {
            of,
            tool_calls: 0,
            tool_bytes: 0,
            reply_to,
            started: now,
            timeout,
            stdout: Capture::new(output_bytes),
            stderr: Capture::new(output_bytes),
            unsent: Vec::new(),
            attached: Vec::new(),
            received: Vec::new(),
            end: None,
            socket_closed: false,
            keep: session.is_some(),
            session,
            overflowed: false,
            killed: None,
            work,
        }
    }
}

/// read(2), with errors as `io::Error` (`WouldBlock` included).
fn read(fd: BorrowedFd<'_>, buffer: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd, buffer).map_err(io::Error::from)
}

/// write(2), with errors as `io::Error`.
fn write(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    nix::unistd::write(fd, bytes).map_err(io::Error::from)
}
