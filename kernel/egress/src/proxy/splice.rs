//! Moving bytes one way between two non-blocking sockets: read until the
//! source would block, write straight on, and keep only what the sink
//! would not take, so an idle tunnel holds no buffer at all and a slow
//! reader stops its peer from being read (backpressure) instead of
//! growing memory.
//!
//! A direction that turns out to carry bulk (a download) moves on through
//! a kernel pipe with splice(2): the bytes go from socket to socket
//! without being copied through the proxy, which on loopback more than
//! doubles what a tunnel carries. Small exchanges never pay for the
//! pipe's two descriptors.
//!
//! A direction bound to a request body (a plain request's) passes on that
//! body's bytes and nothing after them.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use mio::net::TcpStream;

use super::body::{Body, BodyError};

/// The loop's one read buffer, shared by every connection: bytes are
/// copied out of it only when a sink would block.
pub const SCRATCH_BYTES: usize = 64 * 1024;

/// After this many bytes one way, a direction moves through a kernel pipe.
const BULK_BYTES: u64 = 1024 * 1024;

/// How much a kernel pipe holds: what one bulk direction may have in
/// flight inside the proxy (kernel memory, beside the sockets' own
/// buffers, which are larger). Fewer, larger splices: on loopback a 1 MiB
/// pipe measured some 10-20% faster than the default 64 KiB
/// (`scripts/bench-net`, a noisy two-core machine).
const PIPE_BYTES: usize = 1024 * 1024;

/// Kernel pipes open at once, across every sandbox: what bulk transfers
/// may hold in kernel memory is at most this many times [`PIPE_BYTES`]
/// (a sandbox that stops reading after a large download holds its pipe
/// full). Past it, a direction goes on through the loop's own buffer.
const MAX_KERNEL_PIPES: usize = 64;

/// Kernel pipes open now.
static KERNEL_PIPES: AtomicUsize = AtomicUsize::new(0);

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
    /// The kernel pipe a bulk direction moves through.
    kernel: Option<KernelPipe>,
    /// A kernel pipe could not be made (no descriptors): copy instead.
    no_kernel: bool,
    /// The one request body this direction may carry, when it is bound to
    /// one.
    body: Option<Body>,
}

/// A pipe of the kernel's, and how many bytes are in it.
#[derive(Debug)]
struct KernelPipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
    held: usize,
}

impl KernelPipe {
    fn new() -> io::Result<KernelPipe> {
        if KERNEL_PIPES.fetch_add(1, Ordering::Relaxed) >= MAX_KERNEL_PIPES {
            KERNEL_PIPES.fetch_sub(1, Ordering::Relaxed);
            return Err(io::Error::other("the proxy's kernel pipes are all in use"));
        }
        let pipe = Self::open();
        if pipe.is_err() {
            KERNEL_PIPES.fetch_sub(1, Ordering::Relaxed);
        }
        pipe
    }

    fn open() -> io::Result<KernelPipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` is an array of two ints, as pipe2 fills.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both are open descriptors nothing else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ on an open pipe; failure (a lower
        // pipe-max-size) leaves the default size, which F_GETPIPE_SZ reads.
        let capacity = unsafe {
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PIPE_BYTES as libc::c_int,
            );
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        Ok(KernelPipe {
            read,
            write,
            capacity: usize::try_from(capacity).unwrap_or(0).max(4096),
            held: 0,
        })
    }
}

impl Drop for KernelPipe {
    fn drop(&mut self) {
        KERNEL_PIPES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// splice(2) between two descriptors (one a pipe), without blocking.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open for the call (their owners are
        // borrowed by the caller); null offsets mean the current position,
        // as sockets and pipes require.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Why a pump stopped short.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The body this direction is bound to is malformed.
    #[error(transparent)]
    Body(#[from] BodyError),
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

    /// Passes on only `body`'s bytes from now on: what the source sends
    /// after the body's end is read and dropped, never sent.
    pub fn bound(&mut self, body: Body) {
        self.body = Some(body);
    }

    /// Whether the sink has bytes it has not taken.
    pub fn is_blocked(&self) -> bool {
        self.at < self.pending.len() || self.kernel.as_ref().is_some_and(|k| k.held > 0)
    }

    /// Moves bytes from `from` to `to` until the source would block, ends,
    /// or the sink is full.
    pub fn pump(
        &mut self,
        from: &mut TcpStream,
        to: &mut TcpStream,
        scratch: &mut [u8],
    ) -> Result<Flow, PumpError> {
        if !self.flush(to)? {
            return Ok(Flow::Waiting);
        }
        // A bound direction's bytes are all looked at: no kernel pipe.
        let bulk = self.body.is_none() && self.moved >= BULK_BYTES;
        if bulk && self.kernel.is_none() && !self.no_kernel {
            match KernelPipe::new() {
                Ok(kernel) => self.kernel = Some(kernel),
                Err(_) => self.no_kernel = true,
            }
        }
        if self.kernel.is_some() {
            return Ok(self.pump_kernel(from, to)?);
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
                Err(e) => return Err(e.into()),
            };
            let n = match self.body.as_mut() {
                Some(body) => body.take(&scratch[..n])?,
                None => n,
            };
            let written = write_some(to, &scratch[..n])?;
            self.count(written);
            if written < n {
                self.pending.extend_from_slice(&scratch[written..n]);
                return Ok(Flow::Waiting);
            }
        }
        Ok(self.finish(to)?)
    }

    /// [`Pipe::pump`] through the kernel pipe.
    fn pump_kernel(&mut self, from: &mut TcpStream, to: &mut TcpStream) -> io::Result<Flow> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(Flow::Waiting);
        };
        loop {
            while kernel.held > 0 {
                match splice(kernel.read.as_raw_fd(), to.as_raw_fd(), kernel.held) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        kernel.held -= n;
                        self.moved += n as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Waiting),
                    Err(e) => return Err(e),
                }
            }
            if self.eof {
                break;
            }
            match splice(from.as_raw_fd(), kernel.write.as_raw_fd(), kernel.capacity) {
                Ok(0) => self.eof = true,
                Ok(n) => kernel.held += n,
                // The pipe is empty here, so it is the socket that has
                // nothing more.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Waiting),
                Err(e) => return Err(e),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::Duration;

    use mio::{Events, Interest, Poll, Token};

    fn pattern(at: u64) -> u8 {
        (at % 251) as u8
    }

    #[test]
    fn a_pipe_moves_100_mb_intact_copying_then_splicing() {
        const TOTAL: u64 = 100 * 1024 * 1024;
        let source = TcpListener::bind("127.0.0.1:0").unwrap();
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let source_address = source.local_addr().unwrap();
        let writer = thread::spawn(move || {
            let mut stream = std::net::TcpStream::connect(source_address).unwrap();
            let chunk: Vec<u8> = (0..TOTAL.min(1 << 20)).map(pattern).collect();
            let mut sent = 0;
            while sent < TOTAL {
                // The chunk's pattern lines up: 1 MiB is not a multiple
                // of 251, so each chunk starts where the last one ended.
                let start = (sent % 251) as usize;
                let n = (TOTAL - sent).min(chunk.len() as u64 - 251) as usize;
                stream.write_all(&chunk[start..start + n]).unwrap();
                sent += n as u64;
            }
        });
        let sink_address = sink.local_addr().unwrap();
        let reader = thread::spawn(move || {
            let (mut stream, _) = sink.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0u64;
            loop {
                let n = stream.read(&mut buf).unwrap();
                if n == 0 {
                    return got;
                }
                for (i, byte) in buf[..n].iter().enumerate() {
                    assert_eq!(*byte, pattern(got + i as u64), "byte {}", got + i as u64);
                }
                got += n as u64;
            }
        });
        let (from, _) = source.accept().unwrap();
        from.set_nonblocking(true).unwrap();
        let mut from = TcpStream::from_std(from);
        let to = std::net::TcpStream::connect(sink_address).unwrap();
        to.set_nonblocking(true).unwrap();
        let mut to = TcpStream::from_std(to);
        let mut poll = Poll::new().unwrap();
        poll.registry()
            .register(&mut from, Token(0), Interest::READABLE)
            .unwrap();
        poll.registry()
            .register(&mut to, Token(1), Interest::WRITABLE)
            .unwrap();
        let mut events = Events::with_capacity(8);
        let mut pipe = Pipe::default();
        let mut scratch = vec![0u8; SCRATCH_BYTES];
        while pipe.pump(&mut from, &mut to, &mut scratch).unwrap() == Flow::Waiting {
            poll.poll(&mut events, Some(Duration::from_secs(10)))
                .unwrap();
            assert!(
                !events.is_empty(),
                "no progress for 10 s at {} bytes",
                pipe.moved
            );
        }
        writer.join().unwrap();
        drop(to);
        assert_eq!(reader.join().unwrap(), TOTAL);
        assert_eq!(pipe.moved, TOTAL);
        assert!(pipe.kernel.is_some(), "the bulk went through a kernel pipe");
    }
}
