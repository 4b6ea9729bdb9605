//! Moving bytes one way between two non-blocking sockets: read until the
//! source would block, write straight on, and keep only what the sink
//! would not take, so an idle tunnel holds no buffer at all and a slow
//! reader stops its peer from being read (backpressure) instead of
//! growing memory.

use std::io::{self, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;

/// The loop's one read buffer, shared by every connection: bytes are
/// copied out of it only when a sink would block.
pub const SCRATCH_BYTES: usize = 256 * 1024;

/// One direction of a connection.
#[derive(Debug, Default)]
pub struct Pipe {
    /// Bytes read but not yet taken by the sink, from `at` on.
    pending: Vec<u8>,
    at: usize,
    /// The first bytes of `pending` that the proxy wrote itself (a `200
    /// Connection established`) and that are not the sandbox's traffic.
    uncounted: usize,
    /// The source has ended (read 0).
    pub eof: bool,
    /// The sink has been told (its write side shut down).
    pub shut: bool,
    /// Bytes the sink has taken, proxy-written ones excepted.
    pub moved: u64,
}

/// What a pump did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Both sides would block (or the sink is full): wait for readiness.
    Waiting,
    /// The source ended and the sink has been shut down.
    Ended,
}

impl Pipe {
    /// Queues `bytes` for the sink ahead of whatever is read next.
    pub fn queue(&mut self, bytes: &[u8], counted: bool) {
        if !counted {
            self.uncounted += bytes.len();
        }
        self.pending.extend_from_slice(bytes);
    }

    /// Whether the sink has bytes it has not taken.
    pub fn is_blocked(&self) -> bool {
        self.at < self.pending.len()
    }

    /// Moves bytes from `from` to `to` until the source would block, ends,
    /// or the sink is full.
    pub fn pump(
        &mut self,
        from: &mut TcpStream,
        to: &mut TcpStream,
        scratch: &mut [u8],
    ) -> io::Result<Flow> {
        if !self.flush(to)? {
            return Ok(Flow::Waiting);
        }
        while !self.eof {
            let n = match from.read(scratch) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Waiting),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let written = write_some(to, &scratch[..n])?;
            self.count(written);
            if written < n {
                self.pending.extend_from_slice(&scratch[written..n]);
                return Ok(Flow::Waiting);
            }
        }
        self.finish(to)
    }

    /// Writes what is pending; whether all of it went.
    pub fn flush(&mut self, to: &mut TcpStream) -> io::Result<bool> {
        if self.at < self.pending.len() {
            let written = write_some(to, &self.pending[self.at..])?;
            self.at += written;
            self.count(written);
            if self.at < self.pending.len() {
                return Ok(false);
            }
        }
        // Drained: give back a buffer only a slow sink made big.
        self.at = 0;
        if self.pending.capacity() > SCRATCH_BYTES {
            self.pending = Vec::new();
        } else {
            self.pending.clear();
        }
        Ok(true)
    }

    /// After the source ended and everything went: shut the sink's write
    /// side so its reader sees the end too (a half-close, not a close).
    fn finish(&mut self, to: &mut TcpStream) -> io::Result<Flow> {
        if !self.shut {
            self.shut = true;
            match to.shutdown(Shutdown::Write) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Flow::Ended)
    }

    fn count(&mut self, written: usize) {
        let proxys = written.min(self.uncounted);
        self.uncounted -= proxys;
        self.moved += (written - proxys) as u64;
    }
}

/// Writes as much of `bytes` as `to` takes now.
fn write_some(to: &mut TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match to.write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}
