//! Where a request's body ends, found by the framing its head gave: a
//! `Content-Length` counted down, a chunked body followed chunk by chunk
//! under RFC 9112's grammar with none of the leniency it allows a
//! recipient (no bare LF, no chunk extensions, no trailer fields), so that
//! the proxy and any server agree on where the body ends and the next
//! request (or nothing) begins.

use crate::request::Framing;

/// The most hex digits a chunk size may have: 15 stay within what a
/// signed 64-bit parser takes, so no server reads a wrapped size.
const MAX_SIZE_DIGITS: u8 = 15;

/// Why a chunked body is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("a chunk-size line ended by a bare LF, not CRLF")]
    BareLf,
    #[error("a bare CR in a chunked body, not followed by LF")]
    BareCr,
    #[error("a chunk extension (`;` after a chunk's size)")]
    Extension,
    #[error("a chunk size that is not 1 to 15 hex digits")]
    Size,
    #[error("a chunk's data not followed by CRLF")]
    DataEnd,
    #[error("trailer fields after a chunked body")]
    Trailer,
}

/// One request body, as far as it has been read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes of a `Content-Length` body are left.
    Length(u64),
    /// In a chunk-size line: its value and digits so far.
    Size {
        size: u64,
        digits: u8,
    },
    /// A chunk-size line's CR was read: its LF is next.
    SizeLf(u64),
    /// This many bytes of a chunk's data are left.
    Data(u64),
    /// The CRLF after a chunk's data: its CR, then its LF.
    DataCr,
    DataLf,
    /// After the last chunk (`0`): the CRLF that ends the body.
    EndCr,
    EndLf,
    Done,
}

impl Body {
    pub fn new(framing: Framing) -> Body {
        let state = match framing {
            Framing::None | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Size { size: 0, digits: 0 },
        };
        Body { state }
    }

    /// Whether the body has ended.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// How many of `input`'s first bytes are the body's: all of them
    /// until it ends, and none once it has.
    pub fn take(&mut self, input: &[u8]) -> Result<usize, BodyError> {
        let mut at = 0;
        while at < input.len() {
            match self.state {
                State::Done => break,
                State::Length(left) | State::Data(left) => {
                    let n = left.min((input.len() - at) as u64);
                    at += n as usize;
                    self.state = match (self.state, left - n) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), left) => State::Length(left),
                        (_, 0) => State::DataCr,
                        (_, left) => State::Data(left),
                    };
                }
                state => {
                    self.state = step(state, input[at])?;
                    at += 1;
                }
            }
        }
        Ok(at)
    }
}

/// The state after one byte of a chunked body's framing.
fn step(state: State, byte: u8) -> Result<State, BodyError> {
    Ok(match (state, byte) {
        (State::Size { size, digits }, b'\r') if digits > 0 => State::SizeLf(size),
        (State::Size { size, digits }, _) if byte.is_ascii_hexdigit() => {
            if digits == MAX_SIZE_DIGITS {
                return Err(BodyError::Size);
            }
            let digit = (byte as char).to_digit(16).map_or(0, u64::from);
            State::Size {
                size: size << 4 | digit,
                digits: digits + 1,
            }
        }
        // An extension is refused rather than skipped: servers disagree on
        // its quoted strings, and on a bare LF inside one.
        (State::Size { digits, .. }, b';') if digits > 0 => return Err(BodyError::Extension),
        (State::Size { .. }, b'\n') => return Err(BodyError::BareLf),
        (State::Size { .. }, _) => return Err(BodyError::Size),
        (State::SizeLf(0), b'\n') => State::EndCr,
        (State::SizeLf(size), b'\n') => State::Data(size),
        (State::SizeLf(_), _) => return Err(BodyError::BareCr),
        (State::DataCr, b'\r') => State::DataLf,
        (State::DataLf, b'\n') => State::Size { size: 0, digits: 0 },
        (State::DataCr | State::DataLf, _) => return Err(BodyError::DataEnd),
        (State::EndCr, b'\r') => State::EndLf,
        (State::EndCr, b'\n') => return Err(BodyError::BareLf),
        // Trailer fields would be a second head to check; no client of a
        // request needs them.
        (State::EndCr, _) => return Err(BodyError::Trailer),
        (State::EndLf, b'\n') => State::Done,
        (State::EndLf, _) => return Err(BodyError::BareCr),
        // Counted in bulk by `take`, never a byte at a time.
        (State::Length(_) | State::Data(_) | State::Done, _) => state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes` one at a time; how many were the body's.
    fn bytewise(body: &mut Body, bytes: &[u8]) -> Result<usize, BodyError> {
        let mut taken = 0;
        for byte in bytes {
            taken += body.take(std::slice::from_ref(byte))?;
        }
        Ok(taken)
    }

    #[test]
    fn a_length_body_ends_after_its_bytes_and_takes_nothing_more() {
        let mut body = Body::new(Framing::Length(5));
        assert_eq!(body.take(b"hel"), Ok(3));
        assert!(!body.done());
        assert_eq!(body.take(b"loGET / HTTP/1.1\r\n"), Ok(2));
        assert!(body.done());
        assert_eq!(body.take(b"more"), Ok(0));
        let mut none = Body::new(Framing::None);
        assert!(none.done());
        assert_eq!(none.take(b"GET / HTTP/1.1\r\n\r\n"), Ok(0));
        assert!(Body::new(Framing::Length(0)).done());
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_however_it_is_split() {
        let stream =
            b"5\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n000\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        let body_len = stream.len() - "GET / HTTP/1.1\r\n\r\n".len();
        let mut whole = Body::new(Framing::Chunked);
        assert_eq!(whole.take(stream), Ok(body_len));
        assert!(whole.done());
        let mut split = Body::new(Framing::Chunked);
        assert_eq!(bytewise(&mut split, stream), Ok(body_len));
        assert!(split.done());
    }

    #[test]
    fn every_lenient_chunk_form_is_refused() {
        for (bytes, error) in [
            (&b"5\nhello\r\n0\r\n\r\n"[..], BodyError::BareLf),
            (b"5\r\nhello\r\n0\n\r\n", BodyError::BareLf),
            (b"5\r\nhello\r\n0\r\n\n", BodyError::BareLf),
            (b"5\rhello", BodyError::BareCr),
            (b"0\r\n\rX", BodyError::BareCr),
            (b"5;a=b\r\nhello\r\n0\r\n\r\n", BodyError::Extension),
            (b"5;a=\"\n\"\r\n", BodyError::Extension),
            (b"5 \r\nhello\r\n", BodyError::Size),
            (b" 5\r\nhello\r\n", BodyError::Size),
            (b"0x5\r\nhello\r\n", BodyError::Size),
            (b"+5\r\nhello\r\n", BodyError::Size),
            (b"\r\nhello\r\n", BodyError::Size),
            (b";a\r\n", BodyError::Size),
            (b"1000000000000000\r\n", BodyError::Size),
            (b"5\r\nhelloX\r\n", BodyError::DataEnd),
            (b"5\r\nhello\n0\r\n\r\n", BodyError::DataEnd),
            (b"5\r\nhello\r\r\n", BodyError::DataEnd),
            (b"0\r\nX-A: 1\r\n\r\n", BodyError::Trailer),
        ] {
            let mut whole = Body::new(Framing::Chunked);
            assert_eq!(whole.take(bytes), Err(error.clone()), "{bytes:?}");
            let mut split = Body::new(Framing::Chunked);
            assert_eq!(bytewise(&mut split, bytes), Err(error), "{bytes:?}");
        }
        // Fifteen digits are a size still.
        let mut body = Body::new(Framing::Chunked);
        assert_eq!(body.take(b"000000000000005\r\nhe"), Ok(19));
    }
}
