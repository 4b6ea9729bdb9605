//! The frame: a 17-byte little-endian header followed by the payload.
//!
//! ```text
//! offset  size  field
//!      0     4  magic        0x41474E54 (bytes 54 4E 47 41)
//!      4     4  agent_id     caller identity in replies; ignored in requests
//!      8     1  opcode
//!      9     8  payload_len  bytes of payload that follow
//! ```
//!
//! [`FrameDecoder`] takes bytes as they arrive and yields whole frames. It
//! checks the magic as soon as four bytes are in and the payload limit as soon
//! as the header is in, so an oversized length is refused before a single
//! payload byte is buffered or allocated for.

use crate::opcode::Opcode;

/// The frame magic, `"TNGA"` read as a little-endian `u32`.
pub const MAGIC: u32 = 0x4147_4E54;
/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 17;
/// Default limit on a request payload (1 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;
/// Largest reply payload the kernel sends (16 MiB); clients accept up to this.
pub const MAX_REPLY_BYTES: u64 = 16 << 20;

/// Smallest read window the decoder offers, so small frames are read in bulk.
const MIN_READ: usize = 16 * 1024;
/// An idle decoder whose buffer grew beyond this gives the memory back.
const IDLE_KEEP: usize = 64 * 1024;

/// A decoded frame header. The magic is implied: a [`Header`] only exists if
/// the magic was right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Requests: ignored by the kernel. Replies: the caller's identity.
    pub agent_id: u32,
    /// What the frame asks for (or, in a reply, what it answers).
    pub opcode: Opcode,
    /// Number of payload bytes following the header.
    pub payload_len: u64,
}

impl Header {
    /// Serialises the header into its 17 wire bytes.
    ///
    /// ```
    /// use agentos_proto::{Header, Opcode};
    /// let bytes = Header { agent_id: 7, opcode: Opcode::NOOP, payload_len: 3 }.encode();
    /// assert_eq!(&bytes[..4], &[0x54, 0x4E, 0x47, 0x41]);
    /// assert_eq!(Header::decode(&bytes), Ok(Header { agent_id: 7, opcode: Opcode::NOOP, payload_len: 3 }));
    /// ```
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.agent_id.to_le_bytes());
        out[8] = self.opcode.0;
        out[9..17].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Parses 17 header bytes, checking the magic.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, DecodeError> {
        check_magic(bytes)?;
        Ok(Header {
            agent_id: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            opcode: Opcode(bytes[8]),
            payload_len: u64::from_le_bytes([
                bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15],
                bytes[16],
            ]),
        })
    }
}

fn check_magic(bytes: &[u8]) -> Result<(), DecodeError> {
    let found = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if found == MAGIC {
        Ok(())
    } else {
        Err(DecodeError::BadMagic { found })
    }
}

/// Why a byte stream cannot be decoded any further. Both are fatal for the
/// stream: the reader cannot find the next frame boundary.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first four bytes of a frame are not the protocol magic.
    #[error(
        "bad magic 0x{found:08X}: every frame must start with 0x41474E54 \
         (bytes 54 4E 47 41); is this an AgentOS client?"
    )]
    BadMagic {
        /// The four bytes found, read little-endian.
        found: u32,
    },
    /// The header announces more payload than the receiver accepts.
    #[error(
        "payload_len {} exceeds the limit of {limit} bytes; send smaller \
         requests or raise max_request_bytes in the kernel config",
        header.payload_len
    )]
    PayloadTooLarge {
        /// The offending header (its opcode is used for the error reply).
        header: Header,
        /// The receiver's limit.
        limit: u64,
    },
}

/// A complete frame borrowed from a [`FrameDecoder`]'s buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The frame's header.
    pub header: Header,
    /// Exactly `header.payload_len` bytes.
    pub payload: &'a [u8],
}

/// Appends one encoded frame to `out`.
pub fn encode_frame_into(out: &mut Vec<u8>, opcode: Opcode, agent_id: u32, payload: &[u8]) {
    let header = Header {
        agent_id,
        opcode,
        payload_len: payload.len() as u64,
    };
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
}

/// Encodes one frame into a new buffer.
///
/// ```
/// use agentos_proto::{encode_frame, FrameDecoder, Opcode};
/// let bytes = encode_frame(Opcode::NOOP, 0, b"hi");
/// let mut decoder = FrameDecoder::new(1024);
/// decoder.extend_from_slice(&bytes);
/// let frame = decoder.next_frame().unwrap().unwrap();
/// assert_eq!(frame.payload, b"hi");
/// ```
pub fn encode_frame(opcode: Opcode, agent_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_frame_into(&mut out, opcode, agent_id, payload);
    out
}

/// Incremental frame decoder over a byte stream.
///
/// Bytes go in through [`read_buf`](Self::read_buf) + [`advance`](Self::advance)
/// (read straight from a socket, no copy) or
/// [`extend_from_slice`](Self::extend_from_slice); whole frames come out of
/// [`next_frame`](Self::next_frame). The buffer grows only as payload bytes
/// actually arrive, and never beyond one frame of the configured limit, so a
/// peer cannot make it allocate by announcing a large length.
#[derive(Debug)]
pub struct FrameDecoder {
    /// Storage; bytes `start..end` are received but not yet consumed. Kept
    /// initialised to its full length so reads need no zeroing per call.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_payload: u64,
    failed: Option<DecodeError>,
}

impl FrameDecoder {
    /// The largest limit a decoder accepts: a frame must fit in memory, and
    /// header plus payload length must not overflow.
    pub const MAX_LIMIT: u64 = (isize::MAX as u64) / 2;

    /// A decoder refusing payloads longer than `max_payload` bytes (capped
    /// at [`MAX_LIMIT`](Self::MAX_LIMIT)).
    pub fn new(max_payload: u64) -> Self {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max_payload: max_payload.min(Self::MAX_LIMIT),
            failed: None,
        }
    }

    /// The payload limit this decoder enforces.
    pub fn max_payload(&self) -> u64 {
        self.max_payload
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered_len(&self) -> usize {
        self.end - self.start
    }

    /// Whether a frame has been started but not completed: an EOF now means
    /// the peer cut a frame short.
    pub fn is_mid_frame(&self) -> bool {
        self.buffered_len() > 0
    }

    /// Bytes currently allocated for buffering.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// A writable window to read into; call [`advance`](Self::advance) with
    /// the number of bytes written. The window is at least 16 KiB, and large
    /// enough to take a good part of a frame in progress in one read.
    pub fn read_buf(&mut self) -> &mut [u8] {
        let wanted = self.wanted_read_len();
        if self.buf.len() - self.end < wanted {
            self.make_room(wanted);
        }
        &mut self.buf[self.end..]
    }

    /// Marks `n` bytes of the last [`read_buf`](Self::read_buf) window as filled.
    ///
    /// # Panics
    /// If `n` is larger than that window.
    pub fn advance(&mut self, n: usize) {
        assert!(self.end + n <= self.buf.len(), "advance past read_buf");
        self.end += n;
    }

    /// Copies `bytes` into the decoder.
    pub fn extend_from_slice(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let window = self.read_buf();
            let n = window.len().min(bytes.len());
            window[..n].copy_from_slice(&bytes[..n]);
            self.advance(n);
            bytes = &bytes[n..];
        }
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the
    /// error that ends this stream (returned again on every later call).
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, DecodeError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let available = &self.buf[self.start..self.end];
        if available.len() < 4 {
            return Ok(None);
        }
        if let Err(err) = check_magic(available) {
            return Err(self.fail(err));
        }
        let Some(header_bytes) = available.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = Header::decode(header_bytes)?;
        if header.payload_len > self.max_payload {
            let limit = self.max_payload;
            return Err(self.fail(DecodeError::PayloadTooLarge { header, limit }));
        }
        // Cannot overflow: payload_len <= max_payload <= MAX_LIMIT.
        let total = HEADER_LEN + header.payload_len as usize;
        if available.len() < total {
            return Ok(None);
        }
        let payload_start = self.start + HEADER_LEN;
        self.start += total;
        if self.start == self.end {
            // Everything consumed: the next read starts at the front for free.
            self.start = 0;
            self.end = 0;
        }
        Ok(Some(Frame {
            header,
            payload: &self.buf[payload_start..payload_start + total - HEADER_LEN],
        }))
    }

    /// Releases a buffer that grew for a large frame once it is drained, so
    /// many idle connections do not each hold a megabyte.
    pub fn shrink_if_idle(&mut self) {
        if self.start == self.end && self.buf.len() > IDLE_KEEP {
            self.buf = Vec::new();
            self.start = 0;
            self.end = 0;
        }
    }

    /// Releases the buffer, whatever its size, if nothing is buffered:
    /// for a connection that has gone quiet. Returns the bytes released.
    ///
    /// ```
    /// use agentos_proto::{encode_frame, FrameDecoder, Opcode};
    /// let mut decoder = FrameDecoder::new(1024);
    /// decoder.extend_from_slice(&encode_frame(Opcode::NOOP, 0, b"hi"));
    /// assert!(decoder.next_frame().unwrap().is_some());
    /// assert!(decoder.release() > 0);
    /// assert_eq!(decoder.capacity(), 0);
    /// ```
    pub fn release(&mut self) -> usize {
        if self.start != self.end {
            return 0;
        }
        let released = self.buf.len();
        self.buf = Vec::new();
        self.start = 0;
        self.end = 0;
        released
    }

    fn fail(&mut self, err: DecodeError) -> DecodeError {
        self.failed = Some(err.clone());
        err
    }

    /// How much free space the next read should have: enough for the rest of
    /// a frame in progress, but growing at most by doubling what is already
    /// buffered, so memory follows bytes actually received.
    fn wanted_read_len(&self) -> usize {
        let buffered = self.end - self.start;
        let rest_of_frame = self.buf[self.start..self.end]
            .first_chunk::<HEADER_LEN>()
            .and_then(|bytes| Header::decode(bytes).ok())
            .filter(|header| header.payload_len <= self.max_payload)
            .map(|header| (HEADER_LEN + header.payload_len as usize).saturating_sub(buffered))
            .unwrap_or(0);
        rest_of_frame.min(buffered.max(MIN_READ)).max(MIN_READ)
    }

    fn make_room(&mut self, wanted: usize) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < wanted {
            self.buf.resize(self.end + wanted, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: Opcode, agent_id: u32, payload_len: u64) -> Header {
        Header {
            agent_id,
            opcode,
            payload_len,
        }
    }

    #[test]
    fn header_is_little_endian_and_packed() {
        let bytes = header(Opcode::HELLO, 0x0102_0304, 0x0A0B).encode();
        assert_eq!(
            bytes,
            [0x54, 0x4E, 0x47, 0x41, 4, 3, 2, 1, 0xFE, 0x0B, 0x0A, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn bad_magic_is_reported_after_four_bytes() {
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend_from_slice(b"GET ");
        assert_eq!(
            decoder.next_frame(),
            Err(DecodeError::BadMagic { found: 0x2054_4547 })
        );
        // The stream stays failed.
        decoder.extend_from_slice(&encode_frame(Opcode::NOOP, 0, b""));
        assert!(matches!(
            decoder.next_frame(),
            Err(DecodeError::BadMagic { .. })
        ));
    }

    #[test]
    fn oversized_length_is_refused_from_the_header_alone() {
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend_from_slice(&header(Opcode::EXEC, 0, u64::MAX).encode());
        let err = decoder.next_frame().unwrap_err();
        assert_eq!(
            err,
            DecodeError::PayloadTooLarge {
                header: header(Opcode::EXEC, 0, u64::MAX),
                limit: 1024
            }
        );
        assert!(decoder.capacity() <= MIN_READ);
        // Asking for a read window afterwards must not allocate for it either.
        assert!(decoder.read_buf().len() <= MIN_READ);
    }

    #[test]
    fn payload_at_the_limit_is_accepted() {
        let mut decoder = FrameDecoder::new(4);
        decoder.extend_from_slice(&encode_frame(Opcode::NOOP, 9, b"abcd"));
        let frame = decoder.next_frame().unwrap().unwrap();
        assert_eq!(frame.header, header(Opcode::NOOP, 9, 4));
        assert_eq!(frame.payload, b"abcd");
        assert_eq!(decoder.next_frame(), Ok(None));
    }

    #[test]
    fn partial_frame_waits_for_more_bytes() {
        let bytes = encode_frame(Opcode::NOOP, 0, b"hello");
        let mut decoder = FrameDecoder::new(1024);
        decoder.extend_from_slice(&bytes[..10]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert!(decoder.is_mid_frame());
        decoder.extend_from_slice(&bytes[10..]);
        assert_eq!(decoder.next_frame().unwrap().unwrap().payload, b"hello");
        assert!(!decoder.is_mid_frame());
    }

    #[test]
    fn announced_length_does_not_allocate_ahead_of_the_bytes() {
        let mut decoder = FrameDecoder::new(1 << 20);
        decoder.extend_from_slice(&header(Opcode::NOOP, 0, 1 << 20).encode());
        decoder.extend_from_slice(&[0u8; 100]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert!(decoder.read_buf().len() <= MIN_READ);
    }

    #[test]
    fn an_unbounded_limit_is_capped_so_lengths_cannot_overflow() {
        let mut decoder = FrameDecoder::new(u64::MAX);
        decoder.extend_from_slice(&header(Opcode::NOOP, 0, u64::MAX).encode());
        assert!(matches!(
            decoder.next_frame(),
            Err(DecodeError::PayloadTooLarge { .. })
        ));
        assert_eq!(decoder.max_payload(), FrameDecoder::MAX_LIMIT);
    }

    #[test]
    fn large_frame_is_assembled_and_the_buffer_released_after() {
        let payload = vec![7u8; 1 << 20];
        let bytes = encode_frame(Opcode::NOOP, 0, &payload);
        let mut decoder = FrameDecoder::new(1 << 20);
        for chunk in bytes.chunks(5000) {
            decoder.extend_from_slice(chunk);
        }
        assert_eq!(
            decoder.next_frame().unwrap().unwrap().payload.len(),
            1 << 20
        );
        assert!(decoder.capacity() < 4 << 20);
        decoder.shrink_if_idle();
        assert_eq!(decoder.capacity(), 0);
    }
}
