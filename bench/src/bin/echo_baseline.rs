//! The baseline for `bench-ipc`: the least a server can do with the same
//! traffic — one thread, level-triggered epoll, read bytes, write them back.
//! It knows nothing of frames; since a NOOP reply is as long as its request,
//! clients cannot tell it from agentosd except by speed.
//!
//! Usage: `echo-baseline SOCKET_PATH`. Runs until killed.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

struct Conn {
    stream: UnixStream,
    /// Bytes read but not yet written back.
    pending: Vec<u8>,
    /// Registered for EPOLLOUT (only while `pending` is not empty).
    wants_out: bool,
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: echo-baseline SOCKET_PATH"))?;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    // SAFETY: epoll_create1 has no memory-safety preconditions.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(io::Error::last_os_error().into());
    }
    let listen_fd = listener.as_raw_fd();
    control(epoll, libc::EPOLL_CTL_ADD, listen_fd, libc::EPOLLIN as u32)?;
    let mut conns: HashMap<RawFd, Conn> = HashMap::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `events` is a valid, writable array of the length passed.
        let n = unsafe { libc::epoll_wait(epoll, events.as_mut_ptr(), events.len() as i32, -1) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err.into());
        }
        for event in &events[..n as usize] {
            let fd = event.u64 as RawFd;
            if fd == listen_fd {
                while let Ok((stream, _)) = listener.accept() {
                    stream.set_nonblocking(true)?;
                    let fd = stream.as_raw_fd();
                    control(epoll, libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32)?;
                    conns.insert(
                        fd,
                        Conn {
                            stream,
                            pending: Vec::new(),
                            wants_out: false,
                        },
                    );
                }
                continue;
            }
            let Some(conn) = conns.get_mut(&fd) else {
                continue;
            };
            if serve(conn, &mut buf).is_err() {
                let _ = control(epoll, libc::EPOLL_CTL_DEL, fd, 0);
                conns.remove(&fd);
                continue;
            }
            // Change interest only when it changes: one epoll_ctl per
            // request would make the baseline slower than it need be.
            let wants_out = !conn.pending.is_empty();
            if wants_out != conn.wants_out {
                let interest = if wants_out {
                    libc::EPOLLOUT
                } else {
                    libc::EPOLLIN
                };
                control(epoll, libc::EPOLL_CTL_MOD, fd, interest as u32)?;
                conn.wants_out = wants_out;
            }
        }
    }
}

/// One readiness event: flush what is pending, else read once and echo.
fn serve(conn: &mut Conn, buf: &mut [u8]) -> io::Result<()> {
    if !conn.pending.is_empty() {
        let n = conn.stream.write(&conn.pending)?;
        conn.pending.drain(..n);
        return Ok(());
    }
    let n = match conn.stream.read(buf) {
        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(n) => n,
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
        Err(err) => return Err(err),
    };
    match conn.stream.write(&buf[..n]) {
        Ok(written) => conn.pending.extend_from_slice(&buf[written..n]),
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
            conn.pending.extend_from_slice(&buf[..n])
        }
        Err(err) => return Err(err),
    }
    Ok(())
}

fn control(epoll: RawFd, op: i32, fd: RawFd, events: u32) -> io::Result<()> {
    let mut event = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: `event` is a valid epoll_event for the duration of the call.
    if unsafe { libc::epoll_ctl(epoll, op, fd, &mut event) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
