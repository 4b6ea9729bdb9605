//! The kernel's end of a session's steward: orders written as frames
//! (descriptors attached to their first bytes), reports read and checked.
//! The steward runs inside the sandbox and is as hostile as anything
//! there: a report that is not one of the few it may send, a frame over
//! [`Steward::max_report`], a descriptor, or a `ref` the kernel never issued
//! ends the link, and with it every order still waiting.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_proto::payload::{ProcEnd, ProcSignalledReply, WatchEvent};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Interest, Token};
use nix::sys::socket::{socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

use super::files::FileAsked;
use super::process::Process;
use super::tokens::ProcSource;
use crate::address::{Answer, Reply, ReplyTo};
use crate::exec::sources::Sources;
use crate::exec::waiting::SessionKey;
use crate::exec::wire::{frame, DoneReport, FILE_REPORT_MAX, FRAME_HEADER};
pub use crate::exec::wire::{Report, StewardOrder};
use crate::fd;

/// How long a steward has to answer an order.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Orders one steward may have unanswered.
pub const MAX_ORDERS_PER_STEWARD: usize = 64;
/// Bytes of orders that may wait to be written to one steward (one that
/// does not read holds no more of the kernel's memory).
pub const MAX_UNSENT_BYTES: usize = 4 << 20;
/// How many times longer than a process order a steward has to carry
/// out a file op.
const FILE_OP_ANSWER_FACTOR: u32 = 6;
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
    /// A file op.
    File {
        /// Where its reply goes.
        reply_to: ReplyTo,
        /// What was asked, which its reply must fit.
        asked: FileAsked,
    },
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
    /// When each is to be answered by, once it has said hello.
    dues: HashMap<u64, Instant>,
    /// When it was last given an order.
    pub last_order: Instant,
    /// The session's interpreter it serves (none: one yet to open).
    interpreter: Option<u64>,
}

/// `busy`: a steward has as many orders unanswered as it may.
pub fn busy_steward(key: &SessionKey) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Busy,
        format!(
            "session {:?}'s steward has {MAX_ORDERS_PER_STEWARD} orders unanswered, or \
             {MAX_UNSENT_BYTES} bytes of them unread; retry",
            key.1
        ),
    )
}

impl Steward {
    /// A steward of session `key` on `link`, yet to say hello.
    /// A steward of session `key`'s `interpreter` (none: one yet to
    /// open, whose fork waits for it).
    pub fn new(key: SessionKey, link: Link, interpreter: Option<u64>) -> Steward {
        Steward {
            key,
            link,
            pid: None,
            pending: HashMap::new(),
            dues: HashMap::new(),
            last_order: Instant::now(),
            interpreter,
        }
    }

    /// Whether it serves the session's `interpreter`, taking it for its
    /// own if it was made before that one opened. One forked by an
    /// earlier interpreter does not: that has ended, and so will it.
    pub fn serves(&mut self, interpreter: Option<u64>) -> bool {
        match (self.interpreter, interpreter) {
            (None, now) => {
                self.interpreter = now;
                true
            }
            (Some(its), now) => now == Some(its),
        }
    }

    /// The watches it was asked for and has not yet made.
    pub fn watches_asked(&self) -> usize {
        (self.pending.values())
            .filter(|pending| matches!(pending, Pending::File { asked, .. } if asked.is_watch()))
            .count()
    }

    /// Whether it has as many orders owed, or as many bytes of them
    /// unread, as it may.
    pub fn is_busy(&self) -> bool {
        self.pending.len() >= MAX_ORDERS_PER_STEWARD || self.link.unsent_bytes() >= MAX_UNSENT_BYTES
    }

    /// When order `reference` is to be answered by, if the clock runs
    /// (from its hello on): `within` after those owed before it are due
    /// (it carries them out one at a time), or `now`; a file op (which may
    /// walk a large tree) has [`FILE_OP_ANSWER_FACTOR`] times that.
    pub fn due(&mut self, reference: u64, within: Duration, now: Instant) -> Option<Instant> {
        self.pid?;
        let allowed = match self.pending.get(&reference) {
            Some(Pending::File { .. }) => within * FILE_OP_ANSWER_FACTOR,
            _ => within,
        };
        let pending = &self.pending;
        self.dues.retain(|owed, _| pending.contains_key(owed));
        let after = self.dues.values().copied().max().unwrap_or(now).max(now);
        let due = after + allowed;
        self.dues.insert(reference, due);
        Some(due)
    }

    /// When each order it owes is due, anew from `now` (its session was
    /// paused, and it could not answer).
    pub fn dues_anew(&mut self, within: Duration, now: Instant) -> Vec<(u64, Instant)> {
        self.dues.clear();
        let mut owed: Vec<u64> = self.pending.keys().copied().collect();
        owed.sort_unstable();
        (owed.into_iter())
            .filter_map(|reference| Some((reference, self.due(reference, within, now)?)))
            .collect()
    }

    /// Whether order `reference` is still owed past when it was due (a
    /// timer set before its time was given anew is not).
    pub fn overdue(&self, reference: u64, now: Instant) -> bool {
        self.pending.contains_key(&reference)
            && self.dues.get(&reference).is_some_and(|due| *due <= now)
    }

    /// Answers every order it owes `unavailable`: it has ended (`why`).
    pub fn answer_owed(self, why: &LinkError, replies: &mut Vec<Reply>) {
        for (_, pending) in self.pending {
            if let Pending::Start { reply_to, .. }
            | Pending::Signal { reply_to }
            | Pending::File { reply_to, .. } = pending
            {
                let why = format!(
                    "session {:?}'s steward ended before it was done ({why}); the session may \
                     have ended",
                    self.key.1
                );
                let refusal = ErrorReply::new(ErrorCode::Unavailable, why);
                replies.push((reply_to, refusal.into()));
            }
        }
    }

    /// The largest report it may send now: more only while it owes a
    /// file op (whose reply may be long).
    pub fn max_report(&self) -> usize {
        let owes_file =
            (self.pending.values()).any(|pending| matches!(pending, Pending::File { .. }));
        match owes_file {
            true => FILE_REPORT_MAX,
            false => MAX_REPORT_BYTES,
        }
    }
}

/// The longest directory a steward may say a process started in.
const MAX_CWD_BYTES: usize = 4096;

/// What a steward's report answers, checked.
#[derive(Debug)]
pub enum Heard {
    /// Its hello: the orders it owes, whose time to answer starts now.
    Hello(Vec<u64>),
    /// A start, with its process (its pid and directory known).
    Started(ReplyTo, Box<Process>),
    /// An order answered: this reply goes out.
    Reply(ReplyTo, Answer),
    /// The kernel's own order answered: nobody waits.
    Nobody,
    /// A process it started has ended, by its pid: how.
    Ended(u32, ProcEnd),
    /// A watch was made by order `reference`: its reply goes to the
    /// caller once the kernel has named it.
    Watching(ReplyTo, u64),
    /// Watch `reference` saw these.
    Events(u64, Vec<WatchEvent>),
}

impl Steward {
    /// What `report` answers among the orders it owes, which it leaves
    /// owed unless it is a whole answer to one: a report it may not send
    /// is an error (the caller drops the steward, answering what it owes).
    pub fn answer(&mut self, report: Report) -> Result<Heard, LinkError> {
        let unasked = |what: &str| LinkError::Hostile(format!("{what} the kernel did not order"));
        let owed = |reference: &u64, start: bool| match self.pending.get(reference) {
            Some(Pending::Start { .. }) => start,
            Some(Pending::Signal { .. } | Pending::Timeout) => !start,
            Some(Pending::File { .. }) | None => false,
        };
        Ok(match report {
            Report::Hello { hello } if self.pid.is_none() && hello > 1 => {
                self.pid = Some(hello);
                let mut owed: Vec<u64> = self.pending.keys().copied().collect();
                owed.sort_unstable();
                Heard::Hello(owed)
            }
            Report::Hello { .. } => return Err(LinkError::Hostile("a second hello".to_owned())),
            Report::Started { started, pid, cwd } => {
                if pid <= 1 || !cwd.starts_with('/') || cwd.len() > MAX_CWD_BYTES {
                    let what = format!("a process of pid {pid} in {cwd:?}");
                    return Err(LinkError::Hostile(what));
                }
                if !owed(&started, true) {
                    return Err(unasked("a start"));
                }
                let Some(Pending::Start {
                    reply_to,
                    mut process,
                }) = self.pending.remove(&started)
                else {
                    return Err(unasked("a start"));
                };
                process.pid = pid;
                process.cwd = cwd;
                Heard::Started(reply_to, process)
            }
            Report::Failed {
                failed,
                errno,
                error,
            } => match self.pending.remove(&failed) {
                Some(Pending::Start { reply_to, .. }) => {
                    let failure = failure("start the process", errno, &error);
                    Heard::Reply(reply_to, failure.into())
                }
                Some(Pending::Signal { reply_to }) => {
                    let failure = failure("signal the process", errno, &error);
                    Heard::Reply(reply_to, failure.into())
                }
                Some(Pending::File { reply_to, asked }) => {
                    Heard::Reply(reply_to, failure(&asked.what, errno, &error).into())
                }
                Some(Pending::Timeout) => Heard::Nobody,
                None => return Err(unasked("a failure of an order")),
            },
            Report::Signalled { signalled, sent } => {
                if !owed(&signalled, false) {
                    return Err(unasked("a signal"));
                }
                match self.pending.remove(&signalled) {
                    Some(Pending::Signal { reply_to }) => {
                        let done = ProcSignalledReply {
                            success: true,
                            signalled: sent,
                        };
                        Heard::Reply(reply_to, Answer::json(&done))
                    }
                    _ => Heard::Nobody,
                }
            }
            Report::Done { done, reply } => {
                // Checked while still owed: a reply that does not fit ends
                // the link, and the caller is told with the rest.
                let answer = match self.pending.get(&done) {
                    Some(Pending::File { asked, .. }) => (asked.checked(&reply))
                        .map_err(|unfit| LinkError::Hostile(unfit.to_string()))?,
                    _ => return Err(unasked("a file op")),
                };
                match self.pending.remove(&done) {
                    Some(Pending::File { reply_to, asked }) if asked.is_watch() => {
                        Heard::Watching(reply_to, done)
                    }
                    Some(Pending::File { reply_to, .. }) => Heard::Reply(reply_to, answer),
                    _ => return Err(unasked("a file op")),
                }
            }
            Report::Events { events, list } => Heard::Events(events, list),
            Report::Ended {
                ended,
                exit_code,
                signal,
            } => Heard::Ended(
                ended,
                ProcEnd {
                    exit_code,
                    signal,
                    ..ProcEnd::default()
                },
            ),
        })
    }
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
    /// Its socket is watched for room to write.
    pub watching_writable: bool,
}

impl Link {
    /// A new steward's link, numbered `number`: the kernel's end watched
    /// in `sources`, the sandbox's end returned.
    pub fn open(sources: &mut Sources<ProcSource>, number: usize) -> io::Result<(Link, OwnedFd)> {
        let flags = SockFlag::SOCK_CLOEXEC;
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, flags)?;
        fd::set_nonblocking(&ours)?;
        let source = ProcSource::Steward(number);
        let token = sources.register(ours.as_raw_fd(), source, Interest::READABLE)?;
        Ok((Link::new(ours, token), theirs))
    }

    /// Watches its socket in `sources` anew (reported again if ready)
    /// for reports, and for room to write when orders wait (`writable`).
    pub fn rewatch(&mut self, sources: &Sources<ProcSource>, writable: bool) {
        let interest = match writable {
            true => Interest::READABLE | Interest::WRITABLE,
            false => Interest::READABLE,
        };
        let _ = sources.reregister(self.socket.as_raw_fd(), self.token, interest);
        self.watching_writable = writable;
    }

    /// The kernel's end `socket` (non-blocking), watched under `token`.
    pub fn new(socket: OwnedFd, token: Token) -> Link {
        Link {
            socket,
            token,
            outgoing: VecDeque::new(),
            received: Vec::new(),
            watching_writable: false,
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

    /// Whether orders wait to be written.
    pub fn has_unsent(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// Bytes of orders waiting to be written.
    pub fn unsent_bytes(&self) -> usize {
        self.outgoing
            .iter()
            .map(|out| out.bytes.len() - out.sent)
            .sum()
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

    /// Reads at most `budget` bytes of what the socket holds, into the
    /// reports they make, none over `max_report` bytes: whether bytes may
    /// remain (the socket is then to be watched anew, so that one steward
    /// cannot hold the reactor).
    pub fn read(
        &mut self,
        reports: &mut Vec<Report>,
        budget: usize,
        max_report: usize,
    ) -> Result<bool, LinkError> {
        let mut buffer = [0u8; 16 << 10];
        let mut read = 0;
        while read < budget {
            let received =
                fd::receive_with_fds(self.socket.as_fd(), &mut buffer, MsgFlags::MSG_DONTWAIT, 1);
            let (length, fds) = match received {
                Ok(received) => received,
                Err(err) => {
                    let err = io::Error::from(err);
                    if err.kind() == io::ErrorKind::WouldBlock {
                        return Ok(false);
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
            read += length;
            self.received.extend_from_slice(&buffer[..length]);
            self.take_reports(reports, max_report)?;
        }
        Ok(true)
    }

    /// The whole reports received, in order (what follows the last whole
    /// one is kept, moved once).
    fn take_reports(&mut self, reports: &mut Vec<Report>, max: usize) -> Result<(), LinkError> {
        let mut at = 0;
        let taken = loop {
            let Some(header) = self.received.get(at..at + FRAME_HEADER) else {
                break Ok(());
            };
            let length = u32::from_le_bytes(header.try_into().unwrap_or_default()) as usize;
            if length > max {
                break Err(LinkError::Hostile(format!("a frame of {length} bytes")));
            }
            let body = at + FRAME_HEADER..at + FRAME_HEADER + length;
            let Some(body) = self.received.get(body) else {
                break Ok(());
            };
            // Only a file op's reply may be long (and is never read into
            // a tree of values first).
            if length > MAX_REPORT_BYTES && !body.starts_with(DoneReport::OPENING) {
                break Err(LinkError::Hostile(format!("a frame of {length} bytes")));
            }
            match read_report(body) {
                Ok(report) => reports.push(report),
                Err(err) => break Err(LinkError::Hostile(format!("not a report: {err}"))),
            }
            at += FRAME_HEADER + length;
        };
        self.received.drain(..at);
        taken
    }
}

/// One report: a `done` read as such, its reply kept as text; any other
/// as the one it is.
fn read_report(body: &[u8]) -> serde_json::Result<Report> {
    if body.starts_with(DoneReport::OPENING) {
        let done: DoneReport<'_> = serde_json::from_slice(body)?;
        return Ok(Report::Done {
            done: done.done,
            reply: done.reply.get().to_owned(),
        });
    }
    serde_json::from_slice(body)
}

/// How a steward's failure to carry out an order (`what`: to start the
/// process, to signal it) is told, by its errno.
pub fn failure(what: &str, errno: i32, error: &str) -> ErrorReply {
    use nix::errno::Errno;
    let code = match Errno::from_raw(errno) {
        Errno::ENOENT | Errno::ENOTDIR | Errno::ESRCH => ErrorCode::NotFound,
        Errno::EACCES | Errno::EPERM | Errno::EROFS => ErrorCode::PermissionDenied,
        Errno::EAGAIN | Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => ErrorCode::LimitExceeded,
        Errno::EEXIST | Errno::ENOTEMPTY => ErrorCode::AlreadyExists,
        Errno::EINVAL
        | Errno::EISDIR
        | Errno::ELOOP
        | Errno::ENAMETOOLONG
        | Errno::EXDEV
        | Errno::ENOTSUP
        | Errno::EBUSY
        | Errno::ENXIO => ErrorCode::BadRequest,
        _ => ErrorCode::Internal,
    };
    ErrorReply::new(code, format!("cannot {what}: {error}"))
}

/// `internal`: the kernel could not make `what`.
pub fn internal(what: &str, err: io::Error) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, format!("cannot make {what}: {err}"))
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
        link.read(&mut reports, 1 << 20, MAX_REPORT_BYTES).unwrap();
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
        assert!(matches!(
            link.read(&mut reports, 1 << 20, MAX_REPORT_BYTES),
            Err(LinkError::Closed)
        ));
    }

    #[test]
    fn one_read_takes_at_most_its_budget() {
        let (mut link, mut peer) = pair();
        let frame = {
            let mut frame = 11u32.to_le_bytes().to_vec();
            frame.extend_from_slice(br#"{"hello":7}"#);
            frame
        };
        let count = (64 << 10) / frame.len();
        peer.write_all(&frame.repeat(count)).unwrap();
        let mut reports = Vec::new();
        assert!(
            link.read(&mut reports, 16 << 10, MAX_REPORT_BYTES).unwrap(),
            "bytes remain"
        );
        assert!(
            !reports.is_empty() && reports.len() < count / 2,
            "{}",
            reports.len()
        );
        let mut rest = Vec::new();
        assert!(
            !link.read(&mut rest, 1 << 20, MAX_REPORT_BYTES).unwrap(),
            "all read"
        );
        assert_eq!(reports.len() + rest.len(), count);
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
            let got = link.read(&mut Vec::new(), 1 << 20, MAX_REPORT_BYTES);
            assert!(matches!(got, Err(LinkError::Hostile(_))), "{bad}: {got:?}");
        }
        let (mut link, mut peer) = pair();
        peer.write_all(&(70u32 << 10).to_le_bytes()).unwrap();
        assert!(matches!(
            link.read(&mut Vec::new(), 1 << 20, MAX_REPORT_BYTES),
            Err(LinkError::Hostile(_))
        ));
        let (mut link, peer) = pair();
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        fd::send_with_fds(peer.as_fd(), b"\x02", &[pipe_r]).unwrap();
        assert!(matches!(
            link.read(&mut Vec::new(), 1 << 20, MAX_REPORT_BYTES),
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
