//! An order to a run child — run code, snapshot a session's `/workspace`,
//! restore one — from the moment it goes out until the reply is built:
//! whose it is ([`OrderOf`]), its bytes written and the child's end frame
//! read on the child's socket, its output captured ([`Running`]), why the
//! kernel killed it if it did ([`Kill`]), and what it comes to
//! ([`Finished`]). The child that carries it out is `child`.
//!
//! Nothing here blocks: the socket is non-blocking and read to
//! `WouldBlock` on each readiness event.

use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_proto::payload::{ExecReply, ExecRequest, Truncated};
use agentos_proto::{ErrorCode, ErrorReply};

use super::output::{Capture, Stream};
use super::queues::Share;
use super::wire::{self, OrderOp, RunEnd, MAX_END_FRAME};
use super::zygote;
use crate::address::ReplyTo;
use crate::config::exec::ExecConfig;
use crate::fd;
use crate::identity::Principal;

/// What every order is held to, as configured.
#[derive(Clone, Copy, Debug)]
pub struct OrderCaps {
    /// Bytes of each output stream a reply keeps.
    pub output_bytes: usize,
    /// The largest file a run may be given or collect.
    pub max_file_bytes: u64,
    /// A run's timeout when it asks for none.
    pub default_timeout: Duration,
}

impl OrderCaps {
    /// The caps in `exec`.
    pub fn new(exec: &ExecConfig) -> OrderCaps {
        OrderCaps {
            output_bytes: exec.output_bytes,
            max_file_bytes: exec.max_file_bytes,
            default_timeout: Duration::from_millis(exec.default_timeout_ms),
        }
    }

    /// A run's timeout: `asked_ms`, else the default.
    pub fn timeout(&self, asked_ms: Option<u64>) -> Duration {
        asked_ms.map_or(self.default_timeout, Duration::from_millis)
    }

    /// What a run may collect in all: the reply's limit, less its output
    /// and room for its other fields, as raw bytes before base64.
    fn max_collect_bytes(&self) -> u64 {
        let room = (MAX_END_FRAME as u64)
            .saturating_sub(2 * self.output_bytes as u64)
            .saturating_sub(64 << 10);
        room / 4 * 3
    }

    /// What `request` becomes for the run child, as `order`'s op; `keep`:
    /// the child is kept for a session after it.
    pub fn wire_order(
        &self,
        request: ExecRequest,
        order: &Order,
        keep: bool,
        on_disk: bool,
        template: bool,
    ) -> wire::RunOrder {
        let mut env = zygote::run_env();
        env.extend(zygote::disk_env(on_disk, template));
        env.extend(request.env);
        wire::RunOrder {
            op: order.op(),
            code: request.code,
            language: request.language,
            env,
            cwd: request.cwd,
            files: request.files,
            collect: request.collect,
            max_file_bytes: self.max_file_bytes,
            max_collect_bytes: self.max_collect_bytes(),
            keep,
            on_disk,
            template,
            join: 0,
            trace: None,
            print_last_expression: request.print_last_expression,
            skip_if_not_code: request.skip_if_not_code,
            load_state: false,
        }
    }
}

/// The name of the snapshot that holds a hibernated session's globals
/// (one no client can give, or list).
pub const HIBERNATED: &str = "~hibernated";

/// `unavailable` unless EXEC takes runs: it works on this host (else
/// `unavailable` says why not) and the kernel is not `shutting_down`.
pub fn open_for_runs(unavailable: Option<&str>, shutting_down: bool) -> Result<(), ErrorReply> {
    let why = match (unavailable, shutting_down) {
        (Some(reason), _) => format!("EXEC is unavailable: {reason}"),
        (None, true) => "the kernel is shutting down".to_owned(),
        (None, false) => return Ok(()),
    };
    Err(ErrorReply::new(ErrorCode::Unavailable, why))
}

/// What a child is asked to do.
#[derive(Debug)]
pub enum Order {
    /// Run code.
    Run,
    /// Open a session: a run of no code, answered as the session.
    Open,
    /// A snapshot named `name`: the interpreter pickles its globals into
    /// `state` (a memfd) if they are asked for; the kernel then reads the
    /// session's disk. One that `hibernate`s is the session's hibernation:
    /// the kernel keeps the globals and ends the interpreter.
    Snapshot {
        /// The snapshot's name.
        name: String,
        /// Where the globals are written, if they are to be saved.
        state: Option<OwnedFd>,
        /// The interpreter ends once its globals are kept.
        hibernate: bool,
    },
    /// The session's fresh interpreter, its disk restored from snapshot
    /// `name`, loads the snapshot's globals, if it saved them.
    Restore {
        /// The snapshot's name.
        name: String,
    },
    /// RESUME of a hibernated session: its fresh interpreter loads its
    /// globals.
    Wake,
    /// The session's interpreter forks its steward on `socket` (the
    /// sandbox's end of the kernel's link to it), which starts the
    /// session's processes.
    Steward {
        /// Taken when the order goes out.
        socket: Option<OwnedFd>,
    },
}

impl Order {
    /// Hibernate: the interpreter pickles its globals into `state` (a
    /// memfd); the kernel keeps them and ends it.
    pub fn hibernate(state: OwnedFd) -> Order {
        Order::Snapshot {
            name: HIBERNATED.to_owned(),
            state: Some(state),
            hibernate: true,
        }
    }

    /// Whether it hibernates its session.
    pub fn hibernates(&self) -> bool {
        matches!(
            self,
            Order::Snapshot {
                hibernate: true,
                ..
            }
        )
    }

    /// What the kernel reads into its store once the interpreter has done
    /// its part of a snapshot or a hibernation: the snapshot's name, the
    /// memfd holding the globals (if they were asked for), and whether it
    /// hibernates. None for other orders.
    pub fn take_snapshot(&mut self) -> Option<(String, Option<OwnedFd>, bool)> {
        match self {
            Order::Snapshot {
                name,
                state,
                hibernate,
            } => Some((std::mem::take(name), state.take(), *hibernate)),
            Order::Run
            | Order::Open
            | Order::Restore { .. }
            | Order::Wake
            | Order::Steward { .. } => None,
        }
    }

    /// Its op on the wire.
    pub fn op(&self) -> OrderOp {
        match self {
            Order::Run | Order::Open => OrderOp::Run,
            Order::Snapshot { .. } => OrderOp::Snapshot,
            Order::Restore { .. } | Order::Wake => OrderOp::Restore,
            Order::Steward { .. } => OrderOp::Steward,
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
    pub order: Order,
    /// The globals a snapshot could not save, or a restore load.
    pub left_out: Vec<String>,
    /// Bytes of files in `/workspace` after it, if the child said (a
    /// session's does).
    pub workspace_bytes: Option<u64>,
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

/// An order in progress: a run, or a session's snapshot or restore.
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
    /// How long it has stood frozen (its session paused): its time limit
    /// stands still meanwhile.
    pub paused: Duration,
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
    /// Why the kernel killed it, if it did.
    killed: Option<Kill>,
    /// What the order is.
    order: Order,
}

impl Running {
    /// An order about to go out, keeping `output_bytes` of each stream.
    pub fn new(
        of: OrderOf,
        reply_to: ReplyTo,
        order: Order,
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
            paused: Duration::ZERO,
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
            order,
        }
    }

    /// When its time limit runs out, frozen time aside.
    pub fn deadline(&self) -> Instant {
        self.started + self.timeout + self.paused
    }

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

    /// The order's bytes to write, with `attached` descriptors sent along
    /// with the first of them.
    pub fn send(&mut self, order: &wire::RunOrder, attached: Vec<OwnedFd>) {
        self.unsent = wire::frame(order);
        self.attached = attached;
    }

    /// Writes what `socket` takes of the order; whether bytes remain.
    pub fn flush(&mut self, socket: BorrowedFd<'_>) -> io::Result<bool> {
        while !self.unsent.is_empty() {
            let sent = if self.attached.is_empty() {
                write(socket, &self.unsent)
            } else {
                fd::send_with_fds(socket, &self.unsent, &self.attached)
            };
            if sent.is_ok() {
                // Sent along with the first bytes; the run holds them now.
                self.attached.clear();
            }
            match sent {
                Ok(n) => {
                    self.unsent.drain(..n);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(false)
    }

    /// Reads what `socket` holds: the run's end frame, or its close. The
    /// descriptors a session's child sends after its end (its fresh stdout
    /// and stderr pipes) go to `pipes`, two at most.
    pub fn read_socket(&mut self, socket: BorrowedFd<'_>, pipes: &mut Vec<OwnedFd>) {
        let mut chunk = [0u8; 4096];
        loop {
            match wire::receive_with_fds(socket, &mut chunk) {
                Ok((0, _)) => {
                    self.socket_closed = true;
                    break;
                }
                Ok((n, fds)) => {
                    // The code can reach this socket too: what it sends is
                    // bounded, and descriptors beyond a session's two
                    // pipes are closed at once.
                    if self.received.len() + n > MAX_END_FRAME {
                        self.overflowed = true;
                        self.socket_closed = true;
                        self.received = Vec::new();
                        break;
                    }
                    self.received.extend_from_slice(&chunk[..n]);
                    let room = if self.keep { 2 - pipes.len().min(2) } else { 0 };
                    pipes.extend(fds.into_iter().take(room));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.socket_closed = true;
                    break;
                }
            }
        }
        if self.end.is_none() && !self.overflowed {
            let declared = self
                .received
                .get(..wire::FRAME_HEADER)
                .map(|header| u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
            match wire::take_frame::<RunEnd>(&mut self.received) {
                Some(Ok(end)) => self.end = Some(end),
                // Not a frame the run child would send: the code wrote on
                // the socket itself.
                Some(Err(_)) => self.overflowed = true,
                None if declared.is_some_and(|length| length as usize > MAX_END_FRAME) => {
                    self.overflowed = true
                }
                None => {}
            }
            if self.overflowed {
                self.received = Vec::new();
            }
        }
    }

    /// Takes output read from one of the child's pipes.
    pub fn push_output(&mut self, stream: Stream, bytes: &[u8]) {
        match stream {
            Stream::Stdout => self.stdout.push(bytes),
            Stream::Stderr => self.stderr.push(bytes),
        }
    }

    /// Whether it sent more on its socket than an end frame can be.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The kernel kills it, for `why` (the first reason given holds).
    pub fn killed_by(&mut self, why: Kill) {
        self.killed.get_or_insert(why);
    }

    /// Whether the child is done with it: it said how it ended, or its
    /// socket closed.
    pub fn has_ended(&self) -> bool {
        self.end.is_some() || self.socket_closed
    }

    /// Whether its child lives on for its session's next order: kept, and
    /// the order ended as the child said, unkilled.
    pub fn keeps_child(&self) -> bool {
        self.keep && !self.socket_closed && self.killed.is_none() && self.end.is_some()
    }

    /// What the order comes to. `oom`: the memory controller killed a
    /// process of it, and what the reply says of that if the order did not
    /// end as the child said.
    pub fn finish(self, oom: Option<String>, now: Instant) -> Finished {
        let stdout = self.stdout.finish();
        let stderr = self.stderr.finish();
        let oom_killed = oom.is_some();
        let mut files = Default::default();
        let mut workspace_bytes = None;
        let mut left_out = Vec::new();
        let mut not_code = None;
        let (exit_code, signal, error) = match (self.killed, self.end) {
            (Some(kill), _) => (None, Some(libc::SIGKILL), Some(kill.to_string())),
            (None, Some(end)) => {
                let error = end
                    .error
                    .or_else(|| (!end.uncollected.is_empty()).then(|| end.uncollected.join("; ")));
                files = end.files;
                workspace_bytes = end.workspace_bytes;
                left_out = end.left_out;
                not_code = end.not_code;
                (Some(end.exit_code), None, error)
            }
            (None, None) if oom.is_some() => (None, Some(libc::SIGKILL), oom),
            (None, None) if self.overflowed => (
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
        let timed_out = matches!(self.killed, Some(Kill::Timeout(_)));
        let reply = ExecReply {
            success: exit_code == Some(0) && !timed_out,
            stdout: stdout.text,
            stderr: stderr.text,
            exit_code,
            signal,
            error,
            duration_ms: now.saturating_duration_since(self.started).as_millis() as u64,
            timed_out,
            oom_killed,
            truncated: Truncated {
                stdout: stdout.dropped,
                stderr: stderr.dropped,
            },
            files,
            session: self.session,
            tool_calls: self.tool_calls,
            tool_bytes: self.tool_bytes,
            not_code,
            ..ExecReply::default()
        };
        Finished {
            reply_to: self.reply_to,
            reply,
            order: self.order,
            left_out,
            workspace_bytes,
        }
    }
}

/// write(2), with errors as `io::Error`.
fn write(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    nix::unistd::write(fd, bytes).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_says_why_and_an_unsent_order_is_not_a_shutdown() {
        let timeout = Kill::Timeout(Duration::from_millis(250)).to_string();
        assert!(timeout.contains("timeout of 250 ms"), "{timeout}");
        let unsent = Kill::Unsent.to_string();
        assert!(!unsent.contains("shutting down"), "{unsent}");
        assert!(unsent.contains("could not send"), "{unsent}");
    }
}
