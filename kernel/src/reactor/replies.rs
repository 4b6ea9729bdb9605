//! In-order replies for one connection.
//!
//! Requests may complete out of order (a NOOP answers at once, a deferred
//! request later), but replies leave in request order. Every request takes a
//! sequence number; a reply whose predecessors are all written goes straight
//! into the output buffer, anything else waits in `waiting` until the gap
//! before it closes. Bytes held in either place count as buffered, so flow
//! control sees replies parked behind a slow request too.

use std::collections::VecDeque;
use std::io::{self, Write};

use agentos_proto::{
    encode_frame_into, ErrorCode, ErrorReply, Opcode, HEADER_LEN, MAX_REPLY_BYTES,
};

/// An output buffer this large is released once empty.
const OUT_KEEP: usize = 256 * 1024;

#[derive(Debug)]
struct Slot {
    opcode: Opcode,
    /// `None` until the request completes.
    payload: Option<Vec<u8>>,
}

/// The reply side of a connection.
#[derive(Debug)]
pub struct ReplyQueue {
    /// Written into every reply header: the caller's identity.
    agent_id: u32,
    /// Encoded frames; bytes before `written` are already sent.
    out: Vec<u8>,
    written: usize,
    /// Replies that cannot be encoded yet, in request order. Their sequence
    /// numbers are consecutive, starting at `first_waiting`.
    waiting: VecDeque<Slot>,
    first_waiting: u64,
    /// Encoded size of the completed replies in `waiting`.
    waiting_bytes: usize,
    next_seq: u64,
}

impl ReplyQueue {
    /// An empty queue for a caller known as `agent_id`.
    pub fn new(agent_id: u32) -> Self {
        ReplyQueue {
            agent_id,
            out: Vec::new(),
            written: 0,
            waiting: VecDeque::new(),
            first_waiting: 0,
            waiting_bytes: 0,
            next_seq: 0,
        }
    }

    /// Queues the reply to the next request, already known.
    pub fn push_ready(&mut self, opcode: Opcode, payload: &[u8]) {
        self.next_seq += 1;
        if self.waiting.is_empty() {
            self.encode(opcode, payload);
        } else {
            self.waiting_bytes += HEADER_LEN + payload.len();
            self.waiting.push_back(Slot {
                opcode,
                payload: Some(payload.to_vec()),
            });
        }
    }

    /// The sequence number the next request will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Reserves the place of the next request's reply, to be filled by
    /// [`complete`](Self::complete) with the returned sequence number.
    pub fn push_pending(&mut self, opcode: Opcode) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.waiting.is_empty() {
            self.first_waiting = seq;
        }
        self.waiting.push_back(Slot {
            opcode,
            payload: None,
        });
        seq
    }

    /// Fills a reserved reply and moves every reply that is now in order
    /// into the output buffer. Unknown or already filled sequence numbers
    /// are ignored.
    pub fn complete(&mut self, seq: u64, payload: Vec<u8>) {
        let Some(index) = seq.checked_sub(self.first_waiting) else {
            return;
        };
        let Some(slot) = usize::try_from(index)
            .ok()
            .and_then(|i| self.waiting.get_mut(i))
        else {
            return;
        };
        if slot.payload.is_none() {
            self.waiting_bytes += HEADER_LEN + payload.len();
            slot.payload = Some(payload);
        }
        while self.waiting.front().is_some_and(|s| s.payload.is_some()) {
            if let Some(Slot {
                opcode,
                payload: Some(payload),
            }) = self.waiting.pop_front()
            {
                self.first_waiting += 1;
                self.waiting_bytes -= HEADER_LEN + payload.len();
                self.encode(opcode, &payload);
            }
        }
    }

    /// Requests whose replies are not yet in the output buffer.
    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    /// Encoded bytes not yet accepted by the socket.
    pub fn unsent(&self) -> usize {
        self.out.len() - self.written
    }

    /// Reply bytes held for this connection: unsent, plus completed replies
    /// waiting for an earlier one.
    pub fn buffered(&self) -> usize {
        self.unsent() + self.waiting_bytes
    }

    /// Nothing waiting and nothing unsent.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.unsent() == 0
    }

    /// Whether it holds buffers.
    pub fn holds_memory(&self) -> bool {
        self.out.capacity() > 0 || self.waiting.capacity() > 0
    }

    /// Releases the buffers of an idle queue; returns the bytes released.
    pub fn release(&mut self) -> usize {
        if !self.is_idle() {
            return 0;
        }
        let released = self.out.capacity() + self.waiting.capacity() * std::mem::size_of::<Slot>();
        self.out = Vec::new();
        self.written = 0;
        self.waiting = VecDeque::new();
        released
    }

    /// Writes as much as the socket takes. Returns the bytes written; stops
    /// quietly at `WouldBlock`.
    pub fn write_to(&mut self, sink: &mut impl Write) -> io::Result<usize> {
        let mut total = 0;
        while self.written < self.out.len() {
            match sink.write(&self.out[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    total += n;
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            }
        }
        if self.written == self.out.len() {
            self.written = 0;
            self.out.clear();
            if self.out.capacity() > OUT_KEEP {
                self.out = Vec::new();
            }
        } else if self.written >= self.out.len() / 2 {
            // Drop the sent prefix once it is at least half the buffer: a
            // client that keeps the pipe full never empties it, and new
            // replies must not pile up behind bytes already sent. Moving the
            // smaller half keeps the cost amortised per byte.
            self.out.drain(..self.written);
            self.written = 0;
        }
        Ok(total)
    }

    fn encode(&mut self, opcode: Opcode, payload: &[u8]) {
        if payload.len() as u64 > MAX_REPLY_BYTES {
            log::error!(
                "{opcode} reply of {} bytes exceeds the protocol's reply limit",
                payload.len()
            );
            let err = ErrorReply::new(
                ErrorCode::Internal,
                format!(
                    "the reply ({} bytes) exceeds the protocol's limit of {MAX_REPLY_BYTES} bytes",
                    payload.len()
                ),
            );
            encode_frame_into(&mut self.out, opcode, self.agent_id, &err.to_json());
            return;
        }
        encode_frame_into(&mut self.out, opcode, self.agent_id, payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::FrameDecoder;

    fn drain(queue: &mut ReplyQueue) -> Vec<(Opcode, Vec<u8>)> {
        let mut bytes = Vec::new();
        queue.write_to(&mut bytes).unwrap();
        let mut decoder = FrameDecoder::new(MAX_REPLY_BYTES);
        decoder.extend_from_slice(&bytes);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.next_frame().unwrap() {
            assert_eq!(frame.header.agent_id, 1_000_000);
            frames.push((frame.header.opcode, frame.payload.to_vec()));
        }
        frames
    }

    #[test]
    fn later_ready_replies_wait_for_earlier_pending_ones() {
        let mut queue = ReplyQueue::new(1_000_000);
        queue.push_ready(Opcode::NOOP, b"a");
        let slow = queue.push_pending(Opcode::HELLO);
        queue.push_ready(Opcode::NOOP, b"b");
        let slower = queue.push_pending(Opcode::LIST);
        queue.push_ready(Opcode::NOOP, b"c");
        assert_eq!(queue.in_flight(), 4);
        // "a" is encoded; "b" and "c" wait behind the HELLO and still count.
        assert_eq!(queue.buffered(), 3 * (HEADER_LEN + 1));
        assert_eq!(drain(&mut queue), vec![(Opcode::NOOP, b"a".to_vec())]);

        queue.complete(slower, b"[]".to_vec());
        assert!(drain(&mut queue).is_empty(), "must wait for the HELLO");
        queue.complete(slow, b"{}".to_vec());
        assert_eq!(
            drain(&mut queue),
            vec![
                (Opcode::HELLO, b"{}".to_vec()),
                (Opcode::NOOP, b"b".to_vec()),
                (Opcode::LIST, b"[]".to_vec()),
                (Opcode::NOOP, b"c".to_vec()),
            ]
        );
        assert!(queue.is_idle());
        assert_eq!(queue.buffered(), 0);
    }

    #[test]
    fn sent_bytes_do_not_accumulate_while_the_pipe_stays_full() {
        /// Takes all but the last three bytes offered.
        struct Laggard;
        impl Write for Laggard {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                match buf.len().saturating_sub(3) {
                    0 => Err(io::ErrorKind::WouldBlock.into()),
                    n => Ok(n),
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut queue = ReplyQueue::new(1_000_000);
        for _ in 0..10_000 {
            queue.push_ready(Opcode::NOOP, &[7u8; 1000]);
            queue.write_to(&mut Laggard).unwrap();
            assert!(queue.unsent() <= 3);
        }
        assert!(
            queue.out.len() < 4 * 1024,
            "{} bytes kept for {} unsent",
            queue.out.len(),
            queue.unsent()
        );
    }

    #[test]
    fn unknown_and_repeated_completions_are_ignored() {
        let mut queue = ReplyQueue::new(1_000_000);
        let seq = queue.push_pending(Opcode::HELLO);
        queue.complete(seq + 5, b"x".to_vec());
        assert!(drain(&mut queue).is_empty());
        queue.complete(seq, b"first".to_vec());
        queue.complete(seq, b"second".to_vec());
        assert_eq!(drain(&mut queue), vec![(Opcode::HELLO, b"first".to_vec())]);
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        /// Takes five bytes per write until its budget runs out.
        struct Trickle {
            taken: Vec<u8>,
            budget: usize,
        }
        impl Write for Trickle {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                if self.budget == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let n = buf.len().min(5).min(self.budget);
                self.budget -= n;
                self.taken.extend_from_slice(&buf[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut queue = ReplyQueue::new(1_000_000);
        queue.push_ready(Opcode::NOOP, b"0123456789");
        let mut sink = Trickle {
            taken: Vec::new(),
            budget: 15,
        };
        assert_eq!(queue.write_to(&mut sink).unwrap(), 15);
        assert_eq!(queue.unsent(), 27 - 15);
        sink.budget = 100;
        assert_eq!(queue.write_to(&mut sink).unwrap(), 12);
        assert!(queue.is_idle());
        assert_eq!(
            sink.taken,
            agentos_proto::encode_frame(Opcode::NOOP, 1_000_000, b"0123456789")
        );
    }
}
