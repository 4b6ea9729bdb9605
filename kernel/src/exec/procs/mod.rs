//! Processes in sessions ([`Procs`]): programs a session's owner starts
//! inside it, as `docker exec` does, with the session's namespaces,
//! cgroup, files and network. A session's steward (`steward`), forked by
//! its interpreter on the kernel's order, starts each one on pipes the
//! kernel made; the kernel reads their output into rings of its own
//! (`ring`, `process`), so output never waits on the steward, and answers
//! `output` follows as bytes arrive.
//!
//! A session's processes live as long as its interpreter: closing,
//! hibernating or losing the session ends its namespaces, and with them
//! every process and the steward, whose link then closes here.

mod follows;
mod process;
mod pty;
mod ring;
mod steward;
mod table;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use agentos_proto::payload::{
    ProcDoneReply, ProcEnd, ProcInput, ProcInputReply, ProcOutput, ProcRef, ProcStart,
    ProcStartedReply, ProcessInfo, PtySize, Signal,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Interest, Registry, Token};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use slab::Slab;

use self::follows::{Follow, Follows};
use self::process::{Drained, Process, Written};
use self::steward::{busy_steward, Heard, Link, LinkError, Pending, Report, Steward, StewardOrder};
use self::table::{Table, KEPT_AFTER};
use super::sources::Sources;
use super::waiting::SessionKey;
use crate::address::{Answer, Reply, ReplyTo};
use crate::fd;
use crate::identity::Principal;

/// How long a steward has to answer an order.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long a follow waits when it does not say.
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// Bytes read from one pipe in one turn: one `yes` does not starve the
/// reactor.
const READ_BUDGET: usize = 64 << 10;

/// What one of the processes' tokens stands for.
#[derive(Clone, Copy, Debug)]
enum ProcSource {
    /// A steward's socket.
    Steward(usize),
    /// A process's output pipe (0: stdout, 1: stderr).
    Output(usize, usize),
    /// A process's input, waiting for room.
    Input(usize),
}

/// Why the processes' timers fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProcWake {
    /// A follow's wait is over (by number and serial).
    Follow(usize, u64),
    /// A process's timeout may have come.
    Timeout(usize),
    /// A session's records may be due to go.
    Prune,
    /// A steward's answer to an order (by steward and reference) is due.
    Answer(usize, u64),
}

/// Every session's processes.
#[derive(Debug)]
pub struct Procs {
    sources: Sources<ProcSource>,
    /// Where its tokens start.
    base: usize,
    stewards: Slab<Steward>,
    table: Table,
    follows: Follows,
    timers: Timers<ProcWake>,
    next_ref: u64,
    /// How long a steward has to answer an order.
    answer_within: Duration,
}

/// How a process op is answered: now, or later (`None`).
pub type Answered = Result<Option<Answer>, ErrorReply>;

impl Procs {
    /// None yet; their descriptors are registered with `registry` under
    /// tokens from `base` on.
    pub fn new(registry: &Registry, base: usize) -> io::Result<Procs> {
        Ok(Procs {
            sources: Sources::new(registry, base)?,
            base,
            stewards: Slab::new(),
            table: Table::default(),
            follows: Follows::default(),
            timers: Timers::default(),
            next_ref: 1,
            answer_within: ANSWER_WITHIN,
        })
    }

    /// Whether `token` is one of the processes'.
    pub fn owns(&self, token: Token) -> bool {
        token.0 >= self.base
    }

    /// Whether it holds processes of session `key` (live, or ended
    /// lately).
    pub fn knows(&self, key: &SessionKey) -> bool {
        !self.table.of(key).is_empty()
    }

    /// Whether session `key` has a live process or a waiting follow (it
    /// is in use, not idle).
    pub fn in_use(&self, key: &SessionKey) -> bool {
        (self.table.of(key).into_iter()).any(|p| !self.table[p].ended() || self.follows.waits_on(p))
    }

    /// `start` in session `key`, whose environment is `session_env`.
    /// Returns the sandbox's end of a new steward's socket if the session
    /// has no steward yet: the caller has its interpreter fork one on it
    /// (the order waits here for it meanwhile).
    pub fn start(
        &mut self,
        key: &SessionKey,
        start: ProcStart,
        session_env: &BTreeMap<String, String>,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<Option<OwnedFd>, ErrorReply> {
        let starting: Vec<&Process> = (self.stewards.iter())
            .flat_map(|(_, steward)| steward.pending.values())
            .filter_map(|pending| match pending {
                Pending::Start { process, .. } => Some(&**process),
                Pending::Signal { .. } | Pending::Timeout => None,
            })
            .collect();
        self.table.may_start(key, &start, &starting)?;
        let (process, fds) = Process::plumbed(key, &start).map_err(|err| internal("pipes", err))?;
        let (steward, new_socket) = match self.table.steward_of(key) {
            Some(steward) if self.stewards[steward].is_busy() => return Err(busy_steward(key)),
            Some(steward) => (steward, None),
            None => {
                let (steward, theirs) =
                    (self.new_steward(key)).map_err(|err| internal("a steward's socket", err))?;
                (steward, Some(theirs))
            }
        };
        let mut env = session_env.clone();
        env.extend(start.env);
        let reference = self.next_ref();
        let order = StewardOrder::Start {
            reference,
            argv: &start.argv,
            env: &env,
            cwd: start.cwd.as_deref(),
            stdin: start.stdin,
            pty: start.pty.is_some(),
        };
        self.answer_due(steward, reference);
        self.stewards[steward].pending.insert(
            reference,
            Pending::Start {
                reply_to,
                process: Box::new(process),
            },
        );
        let sent = self.stewards[steward].link.send(&order, fds);
        self.sent(steward, sent, replies);
        Ok(new_socket)
    }

    /// A new steward's link for session `key`: the kernel's end watched,
    /// the sandbox's end returned.
    fn new_steward(&mut self, key: &SessionKey) -> io::Result<(usize, OwnedFd)> {
        let flags = SockFlag::SOCK_CLOEXEC;
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, flags)?;
        fd::set_nonblocking(&ours)?;
        let entry = self.stewards.vacant_entry();
        let number = entry.key();
        let token = self.sources.register(
            ours.as_raw_fd(),
            ProcSource::Steward(number),
            Interest::READABLE,
        )?;
        entry.insert(Steward {
            key: key.clone(),
            link: Link::new(ours, token),
            pid: None,
            pending: HashMap::new(),
        });
        self.table.set_steward(key, Some(number), Instant::now());
        Ok((number, theirs))
    }

    fn next_ref(&mut self) -> u64 {
        let reference = self.next_ref;
        self.next_ref += 1;
        reference
    }

    /// After an order was written: its socket watched for room if bytes
    /// remain; a failed link ends the steward.
    fn sent(&mut self, steward: usize, sent: Result<bool, LinkError>, replies: &mut Vec<Reply>) {
        match sent {
            // Watched anew only when that changes (a system call per order
            // otherwise).
            Ok(more) if more != self.stewards[steward].link.watching_writable => {
                self.watch_steward(steward, more);
            }
            Ok(_) => {}
            Err(err) => self.end_steward(steward, &err, replies),
        }
    }

    /// Watches a steward's socket (anew: reported again if ready) for
    /// reports, and for room to write when orders wait (`writable`).
    fn watch_steward(&mut self, steward: usize, writable: bool) {
        let link = &mut self.stewards[steward].link;
        let interest = match writable {
            true => Interest::READABLE | Interest::WRITABLE,
            false => Interest::READABLE,
        };
        let _ = (self.sources).reregister(link.socket().as_raw_fd(), link.token, interest);
        link.watching_writable = writable;
    }

    /// `processes` of session `key`: live ones, then those ended lately.
    pub fn processes(&self, key: &SessionKey) -> Vec<ProcessInfo> {
        self.table.infos(key)
    }

    /// `output`: what the process has printed after `after`; a follow with
    /// nothing to say yet waits (answered later). `quota`: whose follows
    /// it counts among.
    pub fn output(
        &mut self,
        key: &SessionKey,
        output: ProcOutput,
        quota: Principal,
        reply_to: ReplyTo,
        now: Instant,
    ) -> Answered {
        let process = self.table.find(key, &output.process()?)?;
        let answer = self.table[process].output_after(output.after);
        if !output.follow || !answer.chunks.is_empty() || answer.ended {
            return Ok(Some(Answer::json(&answer)));
        }
        let wait = output.wait_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
        let (follow, serial) = self.follows.add(Follow {
            process,
            after: output.after,
            reply_to,
            quota,
        })?;
        self.timers
            .schedule(now + wait, ProcWake::Follow(follow, serial));
        Ok(None)
    }

    /// Answers the follows of `process` that now have something to say
    /// (all of them, with `all`).
    fn answer_follows(&mut self, process: usize, all: bool, replies: &mut Vec<Reply>) {
        for id in self.follows.of(process) {
            let Some(follow) = self.follows.get(id) else {
                continue;
            };
            let answer = self.table[process].output_after(follow.after);
            if all || !answer.chunks.is_empty() || answer.ended {
                if let Some(follow) = self.follows.take(id) {
                    replies.push((follow.reply_to, Answer::json(&answer)));
                }
            }
        }
    }

    /// `input`: bytes for a process's stdin, answered once they are in
    /// its pipe.
    pub fn input(&mut self, key: &SessionKey, input: ProcInput) -> Answered {
        let process = self.table.find(key, &input.process()?)?;
        let written = self.table[process].take_input(&input.data, input.eof)?;
        self.flush_input(process);
        Ok(Some(Answer::json(&ProcInputReply {
            success: true,
            written,
        })))
    }

    /// Writes a process's buffered input; watches its pipe for room while
    /// bytes remain.
    fn flush_input(&mut self, process: usize) {
        let Some(input) = &mut self.table[process].input else {
            return;
        };
        match (input.write(), input.token) {
            (Written::More, None) => {
                let (fd, source) = (input.fd.as_raw_fd(), ProcSource::Input(process));
                if let Ok(token) = self.sources.register(fd, source, Interest::WRITABLE) {
                    input.token = Some(token);
                }
            }
            (Written::More, Some(_)) => {}
            (Written::All, token) => {
                if let Some(token) = token {
                    self.sources.forget(input.fd.as_raw_fd(), token);
                    input.token = None;
                }
            }
            (Written::Close, _) => self.close_input(process),
        }
    }

    /// Closes a process's input, no longer watched.
    fn close_input(&mut self, process: usize) {
        if let Some(input) = self.table[process].input.take() {
            if let Some(token) = input.token {
                // A PTY's writer is a copy of the master, which stays
                // open: its watch would outlive it otherwise.
                self.sources.forget(input.fd.as_raw_fd(), token);
            }
        }
    }

    /// A process printed or ended: its follows are answered; once it has
    /// ended its input closes and the oldest ended records beyond the caps
    /// go.
    fn moved_on(&mut self, process: usize, replies: &mut Vec<Reply>) {
        let ended = self.table[process].ended();
        self.answer_follows(process, ended, replies);
        if ended {
            self.close_input(process);
            let key = self.table[process].key.clone();
            let beyond = self.table.ended_beyond_caps(&key);
            self.forget(beyond, replies);
        }
    }

    /// `signal`: sent by the steward to the process's group; answered
    /// when it says so.
    pub fn signal(
        &mut self,
        key: &SessionKey,
        which: ProcRef,
        signal: Signal,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Answered {
        let process = self.table.find(key, &which)?;
        let record = &self.table[process];
        // Its leader may have exited while what it started still holds its
        // output: the group is signalled until it has wholly ended.
        if record.ended() {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("process {} has ended", record.pid),
            ));
        }
        let pid = record.pid;
        let steward = self.live_steward(key)?;
        if self.stewards[steward].is_busy() {
            return Err(busy_steward(key));
        }
        let pending = Pending::Signal { reply_to };
        self.order_signal(steward, pid, signal.number(), pending, replies);
        Ok(None)
    }

    /// `resize`: a PTY's new size (the kernel's own, on its master).
    pub fn resize(&mut self, key: &SessionKey, which: ProcRef, size: PtySize) -> Answered {
        let record = &self.table[self.table.find(key, &which)?];
        let Some(master) = &record.master else {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("process {} has no PTY to resize", record.pid),
            ));
        };
        pty::resize(master, size).map_err(|err| internal("the PTY's new size", err))?;
        Ok(Some(Answer::json(&ProcDoneReply { success: true })))
    }

    /// Session `key`'s steward, if it has one.
    fn live_steward(&self, key: &SessionKey) -> Result<usize, ErrorReply> {
        self.table.steward_of(key).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::Unavailable,
                format!("session {:?} has no steward running", key.1),
            )
        })
    }

    fn order_signal(
        &mut self,
        steward: usize,
        pid: u32,
        signal: i32,
        pending: Pending,
        replies: &mut Vec<Reply>,
    ) {
        let reference = self.next_ref();
        let order = StewardOrder::Signal {
            reference,
            pid,
            signal,
        };
        self.answer_due(steward, reference);
        self.stewards[steward].pending.insert(reference, pending);
        let sent = self.stewards[steward].link.send(&order, Vec::new());
        self.sent(steward, sent, replies);
    }

    /// A steward that has said hello answers order `reference` within
    /// `answer_within` ([`ANSWER_WITHIN`]), or is dropped (one stopped by a process of its
    /// sandbox would keep its callers waiting for ever). Orders sent
    /// before its hello are given the time from then.
    fn answer_due(&mut self, steward: usize, reference: u64) {
        if self.stewards[steward].pid.is_some() {
            let due = Instant::now() + self.answer_within;
            self.timers
                .schedule(due, ProcWake::Answer(steward, reference));
        }
    }

    /// One of the processes' descriptors is ready.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>, now: Instant) {
        match self.sources.get(token) {
            Some(ProcSource::Steward(steward)) => self.on_steward(steward, replies, now),
            Some(ProcSource::Output(process, index)) => {
                let record = &mut self.table[process];
                match (
                    record.read_output(index, READ_BUDGET),
                    &record.outputs[index],
                ) {
                    (Drained::Closed, _) => {
                        if let Some(pipe) = record.outputs[index].take() {
                            self.sources.forget(pipe.fd.as_raw_fd(), pipe.token);
                        }
                        record.stamp_end();
                    }
                    // Edge-triggered: watched anew, it is reported again
                    // next turn, after the others' events.
                    (Drained::More, Some(pipe)) => {
                        let (fd, token) = (pipe.fd.as_raw_fd(), pipe.token);
                        let _ = self.sources.reregister(fd, token, Interest::READABLE);
                    }
                    (Drained::More | Drained::Empty, _) => {}
                }
                self.moved_on(process, replies);
            }
            Some(ProcSource::Input(process)) => self.flush_input(process),
            None => {}
        }
    }

    /// A steward's socket is ready: orders written, reports read.
    fn on_steward(&mut self, steward: usize, replies: &mut Vec<Reply>, now: Instant) {
        let flushed = self.stewards[steward].link.flush();
        self.sent(steward, flushed, replies);
        let Some(this) = self.stewards.get_mut(steward) else {
            return;
        };
        let mut reports = Vec::new();
        let read = this.link.read(&mut reports, READ_BUDGET);
        for report in reports {
            if let Err(err) = self.on_report(steward, report, replies, now) {
                return self.end_steward(steward, &err, replies);
            }
        }
        match read {
            Err(err) => self.end_steward(steward, &err, replies),
            // Edge-triggered: watched anew, it is reported again next
            // turn, after the others' events.
            Ok(true) => self.watch_steward(steward, self.stewards[steward].link.has_unsent()),
            Ok(false) => {}
        }
    }

    /// What one report of a steward comes to (checked against the orders
    /// it was given by [`Steward::answer`]).
    fn on_report(
        &mut self,
        steward: usize,
        report: Report,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) -> Result<(), LinkError> {
        let key = self.stewards[steward].key.clone();
        match self.stewards[steward].answer(report)? {
            Heard::Hello(owed) => {
                for reference in owed {
                    self.answer_due(steward, reference);
                }
            }
            Heard::Started(reply_to, process) => {
                let (pid, tag) = (process.pid, process.tag.clone());
                self.adopt(*process, now);
                let beyond = self.table.ended_beyond_caps(&key);
                self.forget(beyond, replies);
                let started = ProcStartedReply {
                    success: true,
                    session: key.1,
                    pid,
                    tag,
                };
                replies.push((reply_to, Answer::json(&started)));
            }
            Heard::Reply(reply_to, answer) => replies.push((reply_to, answer)),
            Heard::Nobody => {}
            Heard::Ended(pid, end) => {
                let Some(process) = self.table.unreported(&key, pid) else {
                    return Err(LinkError::Hostile(format!(
                        "the end of pid {pid}, not ours"
                    )));
                };
                let record = &mut self.table[process];
                let timed_out = record.deadline.is_some_and(|at| at <= now);
                record.ends(ProcEnd {
                    timed_out,
                    reason: timed_out.then(|| "timeout".to_owned()),
                    ..end
                });
                self.moved_on(process, replies);
            }
        }
        Ok(())
    }

    /// Watches a started process's output and keeps its record; its
    /// timeout, if it has one, is scheduled.
    fn adopt(&mut self, process: Process, now: Instant) -> usize {
        let deadline = process.deadline;
        let id = self.table.insert(process);
        for index in 0..2 {
            let record = &mut self.table[id];
            let Some(pipe) = &mut record.outputs[index] else {
                continue;
            };
            let source = ProcSource::Output(id, index);
            match (self.sources).register(pipe.fd.as_raw_fd(), source, Interest::READABLE) {
                Ok(token) => pipe.token = token,
                // Unwatched, it counts as closed.
                Err(_) => record.outputs[index] = None,
            }
        }
        if let Some(at) = deadline {
            self.timers.schedule(at.max(now), ProcWake::Timeout(id));
        }
        id
    }

    /// Forgets `processes` (ended), answering their follows.
    fn forget(&mut self, processes: Vec<usize>, replies: &mut Vec<Reply>) {
        for process in processes {
            self.answer_follows(process, true, replies);
            self.table.remove(process);
        }
    }

    /// A steward's link has ended (`why`): its orders are answered, its
    /// processes end once their output closes (those it never reported
    /// ended say so), and the next `start` gets a new one.
    fn end_steward(&mut self, steward: usize, why: &LinkError, replies: &mut Vec<Reply>) {
        let Some(this) = self.stewards.try_remove(steward) else {
            return;
        };
        if let LinkError::Hostile(what) = why {
            log::warn!(
                "exec: session {:?}'s steward is dropped: {what}",
                this.key.1
            );
        }
        self.sources
            .forget(this.link.socket().as_raw_fd(), this.link.token);
        for (_, pending) in this.pending {
            if let Pending::Start { reply_to, .. } | Pending::Signal { reply_to } = pending {
                let why = format!(
                    "session {:?}'s steward ended before it was done ({why}); the session may \
                     have ended",
                    this.key.1
                );
                replies.push((
                    reply_to,
                    ErrorReply::new(ErrorCode::Unavailable, why).into(),
                ));
            }
        }
        let now = Instant::now();
        if self.table.steward_of(&this.key) == Some(steward) {
            self.table.set_steward(&this.key, None, now);
            for process in self.table.of(&this.key) {
                // One ending can send an older record over the caps.
                let Some(record) = self.table.get_mut(process) else {
                    continue;
                };
                record.ends(ProcEnd {
                    reason: Some("its steward or its session ended".to_owned()),
                    ..ProcEnd::default()
                });
                self.moved_on(process, replies);
            }
        }
        self.timers.schedule(now + KEPT_AFTER, ProcWake::Prune);
    }

    /// Session `key` is paused (`frozen`) or resumed `now`: on resuming,
    /// its processes' deadlines move on by the time it stood still, and
    /// its steward's orders are given their time to answer anew.
    pub fn frozen(&mut self, key: &SessionKey, frozen: bool, now: Instant) {
        for (process, deadline) in self.table.frozen(key, frozen, now) {
            self.timers.schedule(deadline, ProcWake::Timeout(process));
        }
        if let Some(steward) = self.table.steward_of(key).filter(|_| !frozen) {
            let owed: Vec<u64> = self.stewards[steward].pending.keys().copied().collect();
            for reference in owed {
                self.answer_due(steward, reference);
            }
        }
    }

    /// When the processes' timers next fire.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.timers.time_to_next(now)
    }

    /// What is due: follows answered, processes past their timeout
    /// killed, sessions long without a steward forgotten.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        while let Some(wake) = self.timers.pop_due(now) {
            match wake {
                ProcWake::Follow(id, serial) => {
                    if let Some(follow) = self.follows.take_if(id, serial) {
                        let answer = self.table[follow.process].output_after(follow.after);
                        replies.push((follow.reply_to, Answer::json(&answer)));
                    }
                }
                ProcWake::Timeout(process) => self.time_out(process, now, replies),
                ProcWake::Prune => {
                    let due = self.table.due_to_go(now);
                    self.forget(due, replies);
                    if self.table.any_to_go() {
                        // Some still run: looked at again later.
                        self.timers.schedule(now + KEPT_AFTER, ProcWake::Prune);
                    }
                }
                ProcWake::Answer(steward, reference) => {
                    // A paused one cannot answer: its time is given anew
                    // when it resumes.
                    let owed =
                        (self.stewards.get(steward)).filter(|s| !self.table.is_paused(&s.key));
                    if owed.is_some_and(|s| s.pending.contains_key(&reference)) {
                        let within = self.answer_within.as_millis();
                        let why = format!("no answer to an order within {within} ms");
                        self.end_steward(steward, &LinkError::Hostile(why), replies);
                    }
                }
            }
        }
    }

    /// Kills `process` if its timeout has come and it still runs.
    fn time_out(&mut self, process: usize, now: Instant, replies: &mut Vec<Reply>) {
        let Some(record) = self.table.get(process) else {
            return;
        };
        // A paused session's process is looked at again when it resumes.
        let paused = self.table.is_paused(&record.key);
        if paused || record.ended() || record.deadline.is_none_or(|at| at > now) {
            return;
        }
        let (pid, key) = (record.pid, record.key.clone());
        if let Ok(steward) = self.live_steward(&key) {
            self.order_signal(steward, pid, libc::SIGKILL, Pending::Timeout, replies);
        }
    }

    /// A connection closed: the follows it was waiting on go (its
    /// processes go on).
    pub fn connection_closed(&mut self, serial: u64) {
        self.follows.connection_closed(serial);
    }
}

/// `internal`: the kernel could not make `what`.
fn internal(what: &str, err: io::Error) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, format!("cannot make {what}: {err}"))
}
