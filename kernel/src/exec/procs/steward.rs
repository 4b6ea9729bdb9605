//! The kernel's end of a session's steward: orders written as frames
//! (descriptors attached to their first bytes), reports read and checked.
//! The steward runs inside the sandbox and is as hostile as anything
//! there: a report that is not one of the few it may send, a frame over
//! [`MAX_REPORT_BYTES`], a descriptor, or a `ref` the kernel never issued
//! ends the link, and with it every order still waiting.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use agentos_proto::{ErrorCode, ErrorReply};
use mio::Token;
use nix::sys::socket::MsgFlags;

use super::process::Process;
use crate::address::ReplyTo;
use crate::exec::waiting::SessionKey;
use crate::exec::wire::{frame, take_frame, FRAME_HEADER};
pub use crate::exec::wire::{Report, StewardOrder};
use crate::fd;

/// Orders one steward may have unanswered.
pub const MAX_ORDERS_PER_STEWARD: usize = 64;
/// The largest report a steward may send.
pub const MAX_REPORT_BYTES: usize = 64 << 10;

/// What a steward's order is waiting to answer.
#[derive(Debug)]
pub enum Pending {
    /// A `start`: the process, pid to come.
    Start {
        /// Where its reply goes.
        reply_to: ReplyTo,
        /// The process, its pid to come.
        process: Box<Process>,
    },
    /// A `signal` asked for.
    Signal {
        /// Where its reply goes.
        reply_to: ReplyTo,
    },
    /// The kernel's own kill at a process's timeout.
    Timeout,
}

/// One session's steward.
#[derive(Debug)]
pub struct Steward {
    /// Its session.
    pub key: SessionKey,
    /// Its socket.
    pub link: Link,
    /// Its pid, once it has said hello.
    pub pid: Option<u32>,
    /// Its orders not yet answered, by reference.
    pub pending: HashMap<u64, Pending>,
}

/// `busy`: a steward has as many orders unanswered as it may.
pub fn busy_steward(key: &SessionKey) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Busy,
        format!(
            "session {:?}'s steward has {MAX_ORDERS_PER_STEWARD} orders unanswered; retry",
            key.1
        ),
    )
}

/// Why a steward's link ended.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The steward closed it (it ended, or its session did).
    #[error("the steward ended")]
    Closed,
    /// Reading or writing failed.
    #[error("the steward's socket failed: {0}")]
    Io(#[from] io::Error),
    /// It sent what it may not.
    #[error("the steward sent what it may not: {0}")]
    Hostile(String),
}

/// One frame on its way out.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    sent: usize,
    fds: Vec<OwnedFd>,
}

/// The kernel's end of one steward's socket.
#[derive(Debug)]
pub struct Link {
    socket: OwnedFd,
    /// Its token while watched.
    pub token: Token,
    outgoing: VecDeque<Outgoing>,
    received: Vec<u8>,
}

impl Link {
    /// The kernel's end `socket` (non-blocking), watched under `token`.
    pub fn new(socket: OwnedFd, token: Token) -> Link {
        Link {
            socket,
            token,
            outgoing: VecDeque::new(),
            received: Vec::new(),
        }
    }

    /// Its socket.
    pub fn socket(&self) -> &OwnedFd {
        &self.socket
    }

    /// Queues `order` with `fds` and writes what the socket takes;
    /// whether bytes remain (the socket is then to be watched for
    /// writing).
    pub fn send(&mut self, order: &StewardOrder<'_>, fds: Vec<OwnedFd>) -> Result<bool, LinkError> {
        self.outgoing.push_back(Outgoing {
            bytes: frame(order),
            sent: 0,
            fds,
        });
        self.flush()
    }

    /// Writes what the socket takes; whether bytes remain.
    pub fn flush(&mut self) -> Result<bool, LinkError> {
        while let Some(out) = self.outgoing.front_mut() {
            let fds = if out.sent == 0 { &out.fds[..] } else { &[] };
            match fd::send_with_fds(self.socket.as_fd(), &out.bytes[out.sent..], fds) {
                Ok(n) => {
                    out.sent += n;
                    // The steward has its copies once the first bytes went.
                    out.fds.clear();
                    if out.sent == out.bytes.len() {
                        self.outgoing.pop_front();
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(false)
    }

    /// Reads what the socket holds, into the reports it makes.
    pub fn read(&mut self, reports: &mut Vec<Report>) -> Result<(), LinkError> {
        let mut buffer = [0u8; 16 << 10];
        loop {
            let received =
                fd::receive_with_fds(self.socket.as_fd(), &mut buffer, MsgFlags::MSG_DONTWAIT, 1);
            let (length, fds) = match received {
                Ok(received) => received,
                Err(err) => {
                    let err = io::Error::from(err);
                    if err.kind() == io::ErrorKind::WouldBlock {
                        return Ok(());
                    }
                    return Err(err.into());
                }
            };
            if !fds.is_empty() {
                return Err(LinkError::Hostile("a descriptor".to_owned()));
            }
            if length == 0 {
                return Err(LinkError::Closed);
            }
            self.received.extend_from_slice(&buffer[..length]);
            self.take_reports(reports)?;
        }
    }

    /// The whole reports received, in order.
    fn take_reports(&mut self, reports: &mut Vec<Report>) -> Result<(), LinkError> {
        loop {
            if let Some(header) = self.received.get(..FRAME_HEADER) {
                let length = u32::from_le_bytes(header.try_into().unwrap_or_default());
                if length as usize > MAX_REPORT_BYTES {
                    return Err(LinkError::Hostile(format!("a frame of {length} bytes")));
                }
            }
            match take_frame::<Report>(&mut self.received) {
                None => return Ok(()),
                Some(Ok(report)) => reports.push(report),
                Some(Err(err)) => return Err(LinkError::Hostile(format!("not a report: {err}"))),
            }
        }
    }
}

/// How a steward's failure to carry out an order is told, by its errno.
pub fn failure(errno: i32, error: &str) -> ErrorReply {
    use nix::errno::Errno;
    let code = match Errno::from_raw(errno) {
        Errno::ENOENT | Errno::ENOTDIR => ErrorCode::NotFound,
        Errno::EACCES | Errno::EPERM => ErrorCode::PermissionDenied,
        Errno::EAGAIN => ErrorCode::LimitExceeded,
        Errno::EINVAL => ErrorCode::BadRequest,
        _ => ErrorCode::Internal,
    };
    ErrorReply::new(code, format!("the process could not start: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn pair() -> (Link, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        (Link::new(OwnedFd::from(ours), Token(0)), theirs)
    }

    fn report(peer: &mut UnixStream, json: &str) {
        let mut bytes = (json.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        peer.write_all(&bytes).unwrap();
    }

    #[test]
    fn reports_are_read_whole_and_in_order() {
        let (mut link, mut peer) = pair();
        report(&mut peer, r#"{"hello":7}"#);
        report(&mut peer, r#"{"started":1,"pid":9,"cwd":"/w"}"#);
        report(&mut peer, r#"{"ended":9,"exit_code":null,"signal":9}"#);
        let mut reports = Vec::new();
        link.read(&mut reports).unwrap();
        assert_eq!(
            reports,
            vec![
                Report::Hello { hello: 7 },
                Report::Started {
                    started: 1,
                    pid: 9,
                    cwd: "/w".to_owned()
                },
                Report::Ended {
                    ended: 9,
                    exit_code: None,
                    signal: Some(9)
                },
            ]
        );
        drop(peer);
        assert!(matches!(link.read(&mut reports), Err(LinkError::Closed)));
    }

    #[test]
    fn what_a_steward_may_not_send_ends_the_link() {
        for bad in [
            r#"{"hello":7,"extra":1}"#,
            r#"{"started":1}"#,
            "not json",
            r#"{"x":1}"#,
        ] {
            let (mut link, mut peer) = pair();
            report(&mut peer, bad);
            let got = link.read(&mut Vec::new());
            assert!(matches!(got, Err(LinkError::Hostile(_))), "{bad}: {got:?}");
        }
        let (mut link, mut peer) = pair();
        peer.write_all(&(70u32 << 10).to_le_bytes()).unwrap();
        assert!(matches!(
            link.read(&mut Vec::new()),
            Err(LinkError::Hostile(_))
        ));
        let (mut link, peer) = pair();
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        fd::send_with_fds(peer.as_fd(), b"\x02", &[pipe_r]).unwrap();
        assert!(matches!(
            link.read(&mut Vec::new()),
            Err(LinkError::Hostile(_))
        ));
    }

    #[test]
    fn an_order_goes_out_as_a_frame_with_its_descriptors() {
        let (mut link, peer) = pair();
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        let env = Default::default();
        let argv = vec!["true".to_owned()];
        let order = StewardOrder::Start {
            reference: 3,
            argv: &argv,
            env: &env,
            cwd: None,
            stdin: false,
            pty: false,
        };
        assert!(!link.send(&order, vec![pipe_r]).unwrap());
        let mut buffer = [0u8; 4096];
        let (length, fds) =
            fd::receive_with_fds(peer.as_fd(), &mut buffer, MsgFlags::empty(), 4).unwrap();
        assert_eq!(fds.len(), 1);
        let body: serde_json::Value =
            serde_json::from_slice(&buffer[FRAME_HEADER..length]).unwrap();
        assert_eq!(body["op"], "start");
        assert_eq!(body["ref"], 3);
    }
}
