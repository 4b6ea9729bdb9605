//! The init's side of the control socket: the claim that says what to run,
//! then the start that says its cgroup is ready for it.

use std::io::{self, Read};
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;

use super::spec::{fds, Claim, ControlMessage};
use crate::fd::{self, ReceiveError};

/// What went wrong on the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The claim's message could not be received.
    #[error("cannot read the claim: {0}")]
    ReceiveClaim(#[source] Errno),
    /// The descriptors it carries could not be read.
    #[error("bad claim: {0}")]
    ClaimDescriptors(#[source] Errno),
    /// It did not carry its spec and its log (and at most a channel).
    #[error("a claim must carry its spec, its log and at most a channel")]
    ClaimIncomplete,
    /// Its spec could not be read from its memfd.
    #[error("cannot read the claim: {0}")]
    ReadClaim(#[source] io::Error),
    /// Its spec is not a [`Claim`].
    #[error("bad claim: {0}")]
    ParseClaim(#[source] serde_json::Error),
    /// The start could not be received.
    #[error("cannot read the start: {0}")]
    ReceiveStart(#[source] Errno),
    /// Another message came than the one the init waits for.
    #[error("the control socket said {got:?} where the init waits for {expected:?}")]
    Unexpected {
        /// The message waited for.
        expected: ControlMessage,
        /// What came instead.
        got: String,
    },
}

/// Checks that `received` is `expected`.
fn expect(expected: ControlMessage, received: &[u8]) -> Result<(), ControlError> {
    if expected.is(received) {
        return Ok(());
    }
    Err(ControlError::Unexpected {
        expected,
        got: String::from_utf8_lossy(received).into_owned(),
    })
}

/// Blocks until a workload claims this sandbox; takes over the log it
/// brings as the init's stdout, stderr and `fds::LOG`, and the channel it
/// may bring as `fds::CHANNEL` (close-on-exec: only the workload's own
/// process keeps it, see `pid1`).
pub fn wait_for_claim() -> Result<Claim, ControlError> {
    let mut tag = [0u8; 16];
    // SAFETY: the control socket is open at its fixed number for the life
    // of the init.
    let control = unsafe { BorrowedFd::borrow_raw(fds::CONTROL) };
    let received: Vec<RawFd> = match fd::receive_with_fds(control, &mut tag, MsgFlags::empty(), 3) {
        Ok((0, _)) => std::process::exit(0),
        // Placed by hand below, at fixed numbers.
        Ok((length, owned)) => {
            // What came with another message closes as `owned` goes.
            expect(ControlMessage::Claim, &tag[..length])?;
            owned.into_iter().map(IntoRawFd::into_raw_fd).collect()
        }
        Err(ReceiveError::Receive(err)) => return Err(ControlError::ReceiveClaim(err)),
        Err(ReceiveError::Descriptors(err)) => return Err(ControlError::ClaimDescriptors(err)),
    };
    let (memfd, log, channel) = match received[..] {
        [memfd, log] => (memfd, log, None),
        [memfd, log, channel] => (memfd, log, Some(channel)),
        _ => return Err(ControlError::ClaimIncomplete),
    };
    // The descriptors arrive at the lowest free numbers, which may be the
    // channel's fixed one: park the channel out of the way until the spec
    // and the log are in place.
    // SAFETY: F_DUPFD_CLOEXEC of a descriptor just received, then closing
    // that original, which nothing else owns.
    let channel = channel.map(|channel| unsafe {
        let parked = libc::fcntl(channel, libc::F_DUPFD_CLOEXEC, PARKED_FLOOR);
        libc::close(channel);
        parked
    });
    // SAFETY: both descriptors were just received and belong to nobody else.
    let (mut claim_file, log) = unsafe { (std::fs::File::from_raw_fd(memfd), log) };
    // SAFETY: dup2 onto our own standard descriptors and the fixed log slot;
    // the descriptor received is then closed, unless it already is one of
    // them (recvmsg hands out the lowest free numbers).
    unsafe {
        let targets = [1, 2, fds::LOG];
        for target in targets {
            if log != target {
                libc::dup2(log, target);
            }
        }
        libc::fcntl(fds::LOG, libc::F_SETFD, libc::FD_CLOEXEC);
        if !targets.contains(&log) {
            libc::close(log);
        }
    }
    let mut text = String::new();
    claim_file
        .read_to_string(&mut text)
        .map_err(ControlError::ReadClaim)?;
    drop(claim_file);
    if let Some(parked) = channel {
        // SAFETY: dup3 onto the fixed channel slot, free now that the spec
        // and the log's original are closed; the parked copy is closed.
        unsafe {
            libc::dup3(parked, fds::CHANNEL, libc::O_CLOEXEC);
            libc::close(parked);
        }
    }
    serde_json::from_str(&text).map_err(ControlError::ParseClaim)
}

/// Where a received channel waits while the other descriptors are placed:
/// above every fixed number.
const PARKED_FLOOR: RawFd = 100;

/// Blocks until the daemon says the workload may start: it has put the
/// sandbox's cgroup in order (name, limits) while the init entered its
/// root. EOF: it gave up on this sandbox, and the init leaves quietly.
pub fn wait_for_start() -> Result<(), ControlError> {
    let mut message = [0u8; 16];
    loop {
        match nix::sys::socket::recv(fds::CONTROL, &mut message, MsgFlags::empty()) {
            Ok(0) => std::process::exit(0),
            Ok(length) => return expect(ControlMessage::Start, &message[..length]),
            Err(Errno::EINTR) => {}
            Err(err) => return Err(ControlError::ReceiveStart(err)),
        }
    }
}
