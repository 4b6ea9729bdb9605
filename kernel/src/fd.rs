//! Descriptors between processes and on the reactor: passing them over Unix
//! sockets (`SCM_RIGHTS`), putting one in non-blocking mode, and watching
//! one with mio. This module imports nothing from the rest of the kernel,
//! so the daemon, a sandbox's init and EXEC all use the one copy.
//!
//! Nothing here may run between `clone3` and `execve` (it allocates): the
//! launcher's child places its descriptors with raw system calls of its own.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Why descriptors could not be received.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// recvmsg(2) failed.
    #[error("cannot receive: {0}")]
    Receive(#[source] Errno),
    /// The descriptors that came could not be taken: more came than there
    /// was room for.
    #[error("cannot take the descriptors that came: {0}")]
    Descriptors(#[source] Errno),
}

impl From<ReceiveError> for io::Error {
    fn from(err: ReceiveError) -> io::Error {
        match err {
            ReceiveError::Receive(errno) | ReceiveError::Descriptors(errno) => errno.into(),
        }
    }
}

/// Sends `bytes` on `socket` with `fds` attached to them (none: a plain
/// message), never blocking and never raising SIGPIPE; returns how many
/// bytes went. Each descriptor stays open here: the peer gets a copy.
pub fn send_with_fds<F: AsFd>(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[F],
) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_fd().as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(bytes)],
        control,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(sent)
}

/// One recvmsg(2) on `socket` with `flags`: the bytes into `buffer`, and
/// the descriptors that came with them (close-on-exec, owned), with room
/// for `max_fds` of them; retried on EINTR. `(0, _)`: the peer closed.
pub fn receive_with_fds(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    flags: MsgFlags,
    max_fds: usize,
) -> Result<(usize, Vec<OwnedFd>), ReceiveError> {
    let mut space = vec![0u8; rights_space(max_fds)];
    loop {
        let mut iov = [IoSliceMut::new(buffer)];
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            flags | MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => {
                let fds: Vec<RawFd> = message
                    .cmsgs()
                    .map_err(ReceiveError::Descriptors)?
                    .flat_map(|cmsg| match cmsg {
                        ControlMessageOwned::ScmRights(fds) => fds,
                        _ => Vec::new(),
                    })
                    .collect();
                let length = message.bytes;
                // SAFETY: each descriptor was just received and belongs to
                // nobody else.
                let owned = fds
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
                    .collect();
                return Ok((length, owned));
            }
            Err(Errno::EINTR) => {}
            Err(err) => return Err(ReceiveError::Receive(err)),
        }
    }
}

/// Bytes of control-message space for `count` descriptors.
fn rights_space(count: usize) -> usize {
    let bytes = (count * std::mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    unsafe { libc::CMSG_SPACE(bytes) as usize }
}

/// Puts `fd` in non-blocking mode, keeping its other status flags.
pub fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fd = fd.as_fd();
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Registers `fd` with `registry` under `token`, for `interest`.
pub fn watch(registry: &Registry, fd: RawFd, token: Token, interest: Interest) -> io::Result<()> {
    registry.register(&mut SourceFd(&fd), token, interest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn descriptors_sent_arrive_owned_with_their_bytes() {
        let (a, b) = UnixDatagram::pair().expect("a socket pair");
        let (pipe_r, pipe_w) = nix::unistd::pipe().expect("a pipe");
        let sent = send_with_fds(a.as_fd(), b"hi", &[pipe_r, pipe_w]).expect("sent");
        assert_eq!(sent, 2);
        let mut buffer = [0u8; 8];
        let (length, fds) =
            receive_with_fds(b.as_fd(), &mut buffer, MsgFlags::empty(), 4).expect("received");
        assert_eq!((&buffer[..length], fds.len()), (&b"hi"[..], 2));
        nix::unistd::write(&fds[1], b"x").expect("the pipe came whole");
        let mut byte = [0u8; 1];
        assert_eq!(nix::unistd::read(&fds[0], &mut byte), Ok(1));
    }

    #[test]
    fn more_descriptors_than_room_is_an_error() {
        let (a, b) = UnixDatagram::pair().expect("a socket pair");
        let (pipe_r, pipe_w) = nix::unistd::pipe().expect("a pipe");
        let fds = [
            pipe_r.as_fd(),
            pipe_w.as_fd(),
            pipe_w.as_fd(),
            pipe_r.as_fd(),
        ];
        send_with_fds(a.as_fd(), b"hi", &fds).expect("sent");
        let mut buffer = [0u8; 8];
        let received = receive_with_fds(b.as_fd(), &mut buffer, MsgFlags::empty(), 1);
        assert!(matches!(received, Err(ReceiveError::Descriptors(_))));
    }

    #[test]
    fn a_message_without_descriptors_goes_plain() {
        let (a, b) = UnixDatagram::pair().expect("a socket pair");
        send_with_fds::<OwnedFd>(a.as_fd(), b"plain", &[]).expect("sent");
        let mut buffer = [0u8; 8];
        let (length, fds) =
            receive_with_fds(b.as_fd(), &mut buffer, MsgFlags::MSG_DONTWAIT, 4).expect("received");
        assert_eq!((&buffer[..length], fds.len()), (&b"plain"[..], 0));
        let empty = receive_with_fds(b.as_fd(), &mut buffer, MsgFlags::MSG_DONTWAIT, 4);
        assert!(matches!(empty, Err(ReceiveError::Receive(Errno::EAGAIN))));
    }

    #[test]
    fn nonblocking_keeps_the_other_flags() {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let (read, _write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("a pipe");
        set_nonblocking(&read).expect("set");
        let flags = OFlag::from_bits_retain(fcntl(&read, FcntlArg::F_GETFL).expect("flags"));
        assert!(flags.contains(OFlag::O_NONBLOCK));
        let mut byte = [0u8; 1];
        assert_eq!(nix::unistd::read(&read, &mut byte), Err(Errno::EAGAIN));
    }
}
