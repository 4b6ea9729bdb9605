//! One process of a session as the kernel holds it: what it runs, the
//! host's ends of its pipes (output read into its [`Ring`], input
//! written from a buffer), and how it ended. It has ended once its
//! steward has said how (or is gone) and its output has closed: only
//! then is all it printed in the ring.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{
    OutputChunk, OutputStream, ProcEnd, ProcOutputReply, ProcStart, ProcState, ProcessInfo,
    PtySize, MAX_PROC_CHUNK_BYTES,
};
use agentos_proto::{ErrorCode, ErrorReply};
use base64::Engine;
use mio::{Interest, Token};
use nix::fcntl::OFlag;

use super::pty;
use super::ring::Ring;
use super::tokens::ProcSource;
use crate::clock::rfc3339;
use crate::exec::sources::Sources;
use crate::exec::waiting::SessionKey;
use crate::fd;

/// Bytes of output kept per process.
pub const OUTPUT_KEPT: usize = 256 << 10;
/// Bytes read from one pipe in one turn: one `yes` does not starve the
/// reactor.
pub const READ_BUDGET: usize = 64 << 10;

/// Bytes of input a process may have waiting in the kernel.
pub const MAX_INPUT_BUFFERED: usize = MAX_PROC_CHUNK_BYTES;

/// What a read of an output pipe left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// It is empty, for now.
    Empty,
    /// Bytes remain beyond the turn's budget.
    More,
    /// It closed: the process's side of it is gone.
    Closed,
}

/// The host's end of one of a process's output pipes, while open.
#[derive(Debug)]
pub struct OutputPipe {
    /// The read end (non-blocking).
    pub fd: OwnedFd,
    /// Its token.
    pub token: Token,
}

/// What writing a process's input left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Bytes wait for room in the pipe.
    More,
    /// All went; it stays open.
    All,
    /// It is to be closed: all went and `eof` was asked, or it failed
    /// (the reader has gone).
    Close,
}

/// The host's end of a process's input.
#[derive(Debug)]
pub struct Input {
    /// The write end (non-blocking).
    pub fd: OwnedFd,
    /// Its token while watched for room.
    pub token: Option<Token>,
    /// Bytes not yet written.
    pub buffered: Vec<u8>,
    /// Close it once they are.
    pub eof: bool,
}

/// One process of a session.
#[derive(Debug)]
pub struct Process {
    /// Its session.
    pub key: SessionKey,
    /// Its pid in the session.
    pub pid: u32,
    /// Its tag.
    pub tag: Option<String>,
    /// What it runs.
    pub argv: Vec<String>,
    /// Where it started.
    pub cwd: String,
    /// Its output pipes: stdout, stderr.
    pub outputs: [Option<OutputPipe>; 2],
    /// Its input, if it was given one and it is open.
    pub input: Option<Input>,
    /// It was given an input.
    pub has_input: bool,
    /// It runs on a PTY.
    pub pty: bool,
    /// Its PTY's master while it runs (kept to resize it).
    pub master: Option<OwnedFd>,
    /// Its output.
    pub ring: Ring,
    /// How it ended, once its steward said (or is gone).
    pub end: Option<ProcEnd>,
    /// When it started.
    pub started_at: SystemTime,
    /// When it ended.
    pub ended_at: Option<SystemTime>,
    /// When the kernel kills it.
    pub deadline: Option<Instant>,
}

impl Input {
    /// Writes what the pipe takes of the buffer.
    pub fn write(&mut self) -> Written {
        while !self.buffered.is_empty() {
            match nix::unistd::write(&self.fd, &self.buffered) {
                Ok(n) => {
                    self.buffered.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return Written::More,
                Err(_) => return Written::Close,
            }
        }
        match self.eof {
            true => Written::Close,
            false => Written::All,
        }
    }
}

impl Process {
    /// A process of session `key` about to `start`: its record with the
    /// host's ends of its pipes (watched once it has started), and the
    /// sandbox's ends to send its steward: stdout, stderr, then stdin if
    /// it has one.
    pub fn plumbed(key: &SessionKey, start: &ProcStart) -> io::Result<(Process, Vec<OwnedFd>)> {
        let input = |fd| Input {
            fd,
            token: None,
            buffered: Vec::new(),
            eof: false,
        };
        let output = |fd| OutputPipe {
            fd,
            token: Token(usize::MAX),
        };
        let (outputs, input, master, theirs) = match start.pty {
            Some(size) => {
                // One stream, both ways.
                let (master, slave) = pty::open(size)?;
                let writer = master.try_clone()?;
                let resizer = master.try_clone()?;
                let outputs = [Some(output(master)), None];
                (outputs, Some(input(writer)), Some(resizer), vec![slave])
            }
            None => {
                let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC);
                let (stdout_r, stdout_w) = pipe()?;
                let (stderr_r, stderr_w) = pipe()?;
                fd::set_nonblocking(&stdout_r)?;
                fd::set_nonblocking(&stderr_r)?;
                let mut theirs = vec![stdout_w, stderr_w];
                let stdin = match start.stdin {
                    true => {
                        let (stdin_r, stdin_w) = pipe()?;
                        fd::set_nonblocking(&stdin_w)?;
                        theirs.push(stdin_r);
                        Some(input(stdin_w))
                    }
                    false => None,
                };
                let outputs = [Some(output(stdout_r)), Some(output(stderr_r))];
                (outputs, stdin, None, theirs)
            }
        };
        let process = Process {
            key: key.clone(),
            pid: 0,
            tag: start.tag.clone(),
            argv: start.argv.clone(),
            cwd: String::new(),
            outputs,
            has_input: input.is_some(),
            input,
            pty: master.is_some(),
            master,
            ring: Ring::new(OUTPUT_KEPT),
            end: None,
            started_at: SystemTime::now(),
            ended_at: None,
            deadline: (start.timeout_ms).map(|ms| Instant::now() + Duration::from_millis(ms)),
        };
        Ok((process, theirs))
    }

    /// What `output` says of it after offset `after` (default: the oldest
    /// byte kept).
    pub fn output_after(&self, after: Option<u64>) -> ProcOutputReply {
        let read = self.ring.read(after.unwrap_or(0), MAX_PROC_CHUNK_BYTES);
        let ended = self.ended() && read.offset == self.ring.end();
        let engine = base64::engine::general_purpose::STANDARD;
        ProcOutputReply {
            success: true,
            pid: self.pid,
            chunks: (read.chunks.into_iter())
                .map(|(stream, bytes)| OutputChunk {
                    stream,
                    data: engine.encode(bytes),
                })
                .collect(),
            offset: read.offset,
            dropped: read.dropped,
            ended,
            end: if ended {
                self.end_so_far()
            } else {
                ProcEnd::default()
            },
        }
    }

    /// Whether it has ended and all its output is in.
    pub fn ended(&self) -> bool {
        self.end.is_some() && self.outputs.iter().all(Option::is_none)
    }

    /// Marks it ended as `end` says, unless it was already; stamps the
    /// time once it has wholly ended.
    pub fn ends(&mut self, end: ProcEnd) {
        if self.end.is_none() {
            self.end = Some(end);
        }
        self.stamp_end();
    }

    /// Stamps when it ended, once it has.
    pub fn stamp_end(&mut self) {
        if self.ended() && self.ended_at.is_none() {
            self.ended_at = Some(SystemTime::now());
            self.deadline = None;
            self.master = None;
        }
    }

    /// How it ended so far (all empty while it runs).
    pub fn end_so_far(&self) -> ProcEnd {
        if self.ended() {
            self.end.clone().unwrap_or_default()
        } else {
            ProcEnd::default()
        }
    }

    /// What `processes` says of it.
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            pty: self.pty,
            stdin: self.has_input,
            state: if self.ended() {
                ProcState::Ended
            } else {
                ProcState::Running
            },
            end: self.end_so_far(),
            started_at: rfc3339(self.started_at),
            ended_at: self.ended_at.map(rfc3339),
            offset: self.ring.end(),
            dropped: self.ring.dropped(),
        }
    }

    /// Reads what its output pipe `index` holds, at most `budget` bytes.
    pub fn read_output(&mut self, index: usize, budget: usize) -> Drained {
        let stream = match (index, self.pty) {
            (_, true) => OutputStream::Pty,
            (0, false) => OutputStream::Stdout,
            (_, false) => OutputStream::Stderr,
        };
        let Some(pipe) = &self.outputs[index] else {
            return Drained::Closed;
        };
        let mut buffer = [0u8; 16 << 10];
        let mut read = 0;
        while read < budget {
            match nix::unistd::read(pipe.fd.as_fd(), &mut buffer) {
                Ok(0) => return Drained::Closed,
                Ok(n) => {
                    self.ring.push(stream, &buffer[..n]);
                    read += n;
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return Drained::Empty,
                Err(_) => return Drained::Closed,
            }
        }
        Drained::More
    }

    /// Its steward says how it ended (`end`), `now`: past its deadline,
    /// it was the kernel's kill at its timeout.
    pub fn ended_as_reported(&mut self, end: ProcEnd, now: Instant) {
        let timed_out = self.deadline.is_some_and(|at| at <= now);
        self.ends(ProcEnd {
            timed_out,
            reason: timed_out.then(|| "timeout".to_owned()),
            ..end
        });
    }

    /// Gives its PTY a new size (`bad_request` if it has none).
    pub fn resize(&self, size: PtySize) -> Result<(), ErrorReply> {
        let Some(master) = &self.master else {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("process {} has no PTY to resize", self.pid),
            ));
        };
        pty::resize(master, size).map_err(|err| {
            let why = format!("cannot give the PTY its new size: {err}");
            ErrorReply::new(ErrorCode::Internal, why)
        })
    }

    /// Its output pipe `index` is ready: read (a `budget`'s worth), and
    /// once closed no longer watched in `sources`, its end stamped.
    pub fn on_output(&mut self, index: usize, budget: usize, sources: &mut Sources<ProcSource>) {
        match (self.read_output(index, budget), &self.outputs[index]) {
            (Drained::Closed, _) => {
                if let Some(pipe) = self.outputs[index].take() {
                    sources.forget(pipe.fd.as_raw_fd(), pipe.token);
                }
                self.stamp_end();
            }
            // Edge-triggered: watched anew, it is reported again next
            // turn, after the others' events.
            (Drained::More, Some(pipe)) => {
                let _ = sources.reregister(pipe.fd.as_raw_fd(), pipe.token, Interest::READABLE);
            }
            (Drained::More | Drained::Empty, _) => {}
        }
    }

    /// Writes its buffered input; its pipe is watched in `sources` (as
    /// process `number`'s) for room while bytes remain.
    pub fn flush_input(&mut self, number: usize, sources: &mut Sources<ProcSource>) {
        let Some(input) = &mut self.input else {
            return;
        };
        match (input.write(), input.token) {
            (Written::More, None) => {
                let (fd, source) = (input.fd.as_raw_fd(), ProcSource::Input(number));
                if let Ok(token) = sources.register(fd, source, Interest::WRITABLE) {
                    input.token = Some(token);
                }
            }
            (Written::More, Some(_)) => {}
            (Written::All, token) => {
                if let Some(token) = token {
                    sources.forget(input.fd.as_raw_fd(), token);
                    input.token = None;
                }
            }
            (Written::Close, _) => self.close_input(sources),
        }
    }

    /// Closes its input, no longer watched in `sources`.
    pub fn close_input(&mut self, sources: &mut Sources<ProcSource>) {
        if let Some(input) = self.input.take() {
            if let Some(token) = input.token {
                // A PTY's writer is a copy of the master, which stays
                // open: its watch would outlive it otherwise.
                sources.forget(input.fd.as_raw_fd(), token);
            }
        }
    }

    /// Takes `data` (base64) for its input, closing it after them with
    /// `eof`: the bytes taken, or why none were.
    pub fn take_input(&mut self, data: &str, eof: bool) -> Result<u64, ErrorReply> {
        let engine = base64::engine::general_purpose::STANDARD;
        let data = engine.decode(data.as_bytes()).map_err(|err| {
            let why = format!("EXEC field `data`: not base64: {err}");
            ErrorReply::new(ErrorCode::BadRequest, why)
        })?;
        let Some(open) = &mut self.input else {
            let why = match self.has_input {
                true => "its input is closed",
                false => "it was started without `stdin`",
            };
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("process {} cannot be written to: {why}", self.pid),
            ));
        };
        if eof && self.pty {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                "EXEC field `eof`: a PTY's input is not closed; send its EOF character \
                 (\\u0004, Ctrl-D) instead",
            ));
        }
        if open.buffered.len() + data.len() > MAX_INPUT_BUFFERED {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "process {} has {} bytes of input waiting to be read (at most \
                     {MAX_INPUT_BUFFERED}); retry once it reads them",
                    self.pid,
                    open.buffered.len()
                ),
            ));
        }
        open.buffered.extend_from_slice(&data);
        open.eof |= eof;
        Ok(data.len() as u64)
    }
}
