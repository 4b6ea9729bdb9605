//! One client connection: its socket, its frame decoder, its in-order reply
//! queue, and the flow-control state that keeps it within its limits.

use std::io::{self, Read};
use std::time::Instant;

use agentos_proto::{DecodeError, ErrorCode, ErrorReply, FrameDecoder, Opcode};
use mio::net::UnixStream;

use super::replies::ReplyQueue;
use crate::address::{ConnKey, ReplyTo};
use crate::identity::PeerCred;
use crate::kernel::Kernel;
use crate::syscall::{self, Caller, Outcome, Request};
use crate::workers::WorkerPool;

/// Per-connection limits, from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Largest request payload.
    pub max_request_bytes: u64,
    /// Requests awaiting replies before reading pauses.
    pub max_in_flight: usize,
    /// Buffered reply bytes before reading pauses.
    pub write_high_water: usize,
    /// Bytes read per turn before other connections get theirs.
    pub read_budget: usize,
}

/// How a turn of reading ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadTurn {
    /// The socket has nothing more for now; wait for the next readable event.
    Drained,
    /// A limit paused reading; resume once under it.
    Paused,
    /// The read budget ran out with data possibly left; come back soon.
    BudgetSpent,
    /// No more requests will be read from this connection.
    Closed,
}

/// A client connection owned by the reactor.
#[derive(Debug)]
pub struct Connection {
    pub stream: UnixStream,
    /// Distinguishes this connection from earlier ones that had its slot;
    /// also its owner id in the worker queue.
    pub serial: u64,
    pub caller: Caller,
    pub peer: PeerCred,
    /// The peer's supplementary groups when it connected.
    groups: Vec<u32>,
    decoder: FrameDecoder,
    pub replies: ReplyQueue,
    /// No more requests will be read: EOF, EXIT, a framing error, shutdown.
    pub read_closed: bool,
    /// The peer has shut down its sending side (seen in a readiness event):
    /// read to EOF instead of trusting a short read to mean "empty for now".
    pub peer_hung_up: bool,
    /// Reading stopped at a limit and must resume once under it.
    pub paused: bool,
    /// Sitting in the reactor's ready queue.
    pub queued: bool,
    /// WRITABLE interest is registered (only while replies are backed up,
    /// so an idle connection is not woken each time the peer reads).
    pub wants_write: bool,
    /// When the frame now being received began, if one is partly in.
    pub frame_started: Option<Instant>,
    /// A frame-deadline timer is pending for this connection.
    pub frame_timer: bool,
    /// Reply bytes the socket has accepted, ever.
    pub sent_total: u64,
    /// With a write-stall timer pending: `sent_total` and the unsent bytes
    /// when it was armed, to judge the progress made since.
    pub stall_mark: Option<(u64, usize)>,
    /// It read or wrote something since the last idle sweep.
    pub active: bool,
}

impl Connection {
    /// A connection for an accepted, identified stream.
    pub fn new(
        stream: UnixStream,
        serial: u64,
        caller: Caller,
        (peer, groups): (PeerCred, Vec<u32>),
        limits: &ConnectionLimits,
    ) -> Self {
        Connection {
            stream,
            serial,
            replies: ReplyQueue::new(caller.identity.id()),
            caller,
            peer,
            groups,
            decoder: FrameDecoder::new(limits.max_request_bytes),
            read_closed: false,
            peer_hung_up: false,
            paused: false,
            queued: false,
            wants_write: false,
            frame_started: None,
            frame_timer: false,
            sent_total: 0,
            stall_mark: None,
            active: true,
        }
    }

    /// Whether it holds buffers it could give back.
    pub fn holds_memory(&self) -> bool {
        self.decoder.capacity() > 0 || self.replies.holds_memory()
    }

    /// Gives back its buffers if it has been quiet since the last sweep
    /// (and starts the next quiet period); returns the bytes released.
    pub fn release_if_quiet(&mut self) -> usize {
        if std::mem::take(&mut self.active) {
            return 0;
        }
        self.decoder.release() + self.replies.release()
    }

    /// Whether another request may be taken now.
    pub fn accepts_requests(&self, limits: &ConnectionLimits) -> bool {
        !self.read_closed
            && self.replies.in_flight() < limits.max_in_flight
            && self.replies.buffered() < limits.write_high_water
    }

    /// Whether everything is said and done: close it.
    pub fn is_finished(&self) -> bool {
        self.read_closed && self.replies.is_idle()
    }

    /// One turn of reading: answers complete frames already buffered, then
    /// reads and answers more until the socket is drained, a limit pauses
    /// the connection, or the read budget is spent.
    pub fn read_turn(
        &mut self,
        key: ConnKey,
        kernel: &mut Kernel,
        workers: &WorkerPool<ReplyTo>,
        limits: &ConnectionLimits,
    ) -> io::Result<ReadTurn> {
        let mut budget = limits.read_budget;
        let mut drained = false;
        loop {
            while self.accepts_requests(limits) {
                match self.decoder.next_frame() {
                    Ok(Some(frame)) => {
                        self.frame_started = None;
                        let opcode = frame.header.opcode;
                        let request = Request {
                            caller: self.caller,
                            peer: &self.peer,
                            groups: &self.groups,
                            reply_to: ReplyTo::Request {
                                conn: key,
                                seq: self.replies.next_seq(),
                            },
                            opcode,
                            payload: frame.payload,
                        };
                        match syscall::dispatch(kernel, &request) {
                            Outcome::Echo => self.replies.push_ready(opcode, frame.payload),
                            Outcome::Reply(answer) => {
                                self.replies.push_ready(opcode, &answer.into_json())
                            }
                            Outcome::Become(identity, answer) => {
                                // The frames after it, this read's too, see
                                // the new caller: each takes a copy.
                                self.caller.identity = identity;
                                self.replies.push_ready(opcode, &answer.into_json())
                            }
                            Outcome::ReplyAndClose(payload) => {
                                self.replies.push_ready(opcode, &payload);
                                self.read_closed = true;
                            }
                            Outcome::Later => {
                                self.replies.push_pending(opcode);
                            }
                            Outcome::Deferred(job) => {
                                let seq = self.replies.push_pending(opcode);
                                let to = ReplyTo::Request { conn: key, seq };
                                if workers.submit(self.serial, to, job).is_err() {
                                    let busy = ErrorReply::new(
                                        ErrorCode::Busy,
                                        "the kernel's work queue is full; retry later",
                                    );
                                    self.replies.complete(seq, busy.to_json());
                                }
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        self.refuse_stream(&err);
                        return Ok(ReadTurn::Closed);
                    }
                }
            }
            if self.read_closed {
                return Ok(ReadTurn::Closed);
            }
            if self.decoder.is_mid_frame() {
                self.frame_started.get_or_insert_with(Instant::now);
            }
            if !self.accepts_requests(limits) {
                self.paused = true;
                return Ok(ReadTurn::Paused);
            }
            self.decoder.shrink_if_idle();
            if drained {
                return Ok(ReadTurn::Drained);
            }
            if budget == 0 {
                return Ok(ReadTurn::BudgetSpent);
            }
            let window = self.decoder.read_buf();
            let window_len = window.len();
            match self.stream.read(window) {
                Ok(0) => {
                    if self.decoder.is_mid_frame() {
                        log::debug!(
                            "conn {}: peer closed in the middle of a frame; dropped",
                            self.serial
                        );
                    }
                    self.read_closed = true;
                    return Ok(ReadTurn::Closed);
                }
                Ok(n) => {
                    self.decoder.advance(n);
                    self.active = true;
                    budget = budget.saturating_sub(n);
                    // A short read emptied the socket: any later data raises
                    // a new edge, so there is no need to read until EAGAIN —
                    // one syscall saved per request on the latency path. Not
                    // so once the peer has hung up: no edge will follow, and
                    // only reading on finds the EOF.
                    drained = n < window_len && !self.peer_hung_up;
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    return Ok(ReadTurn::Drained)
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
    }

    /// The stream cannot be framed any further: queue one last error reply
    /// (after every earlier reply) and read nothing more. The payload of an
    /// oversized frame is never read.
    fn refuse_stream(&mut self, err: &DecodeError) {
        let (opcode, code) = match err {
            DecodeError::BadMagic { .. } => (Opcode::EXIT, ErrorCode::BadMagic),
            DecodeError::PayloadTooLarge { header, .. } => {
                (header.opcode, ErrorCode::PayloadTooLarge)
            }
        };
        log::debug!("conn {}: {err}; closing", self.serial);
        self.replies
            .push_ready(opcode, &ErrorReply::new(code, err.to_string()).to_json());
        self.read_closed = true;
        self.frame_started = None;
    }

    /// Sends what the socket takes now.
    pub fn flush(&mut self) -> io::Result<()> {
        let sent = self.replies.write_to(&mut self.stream)?;
        if sent > 0 {
            self.sent_total += sent as u64;
            self.active = true;
        }
        Ok(())
    }
}
