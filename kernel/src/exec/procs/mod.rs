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

mod files;
mod follows;
mod process;
mod pty;
mod ring;
mod steward;
mod table;
#[cfg(test)]
mod tests;
mod tokens;
mod watches;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use agentos_proto::payload::{
    FileCall, FileEvents, FileRemovedReply, FileWatchReply, ProcDoneReply, ProcEnd, ProcInput,
    ProcInputReply, ProcOutput, ProcRef, ProcStart, ProcStartedReply, ProcessInfo, PtySize, Signal,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Interest, Registry, Token};
use slab::Slab;

use self::files::FileAsked;
use self::follows::{news_for, Follow, Followed, Follows, DEFAULT_WAIT};
use self::process::{Process, READ_BUDGET};
use self::steward::{
    busy_steward, internal, Heard, Link, LinkError, Pending, Report, Steward, StewardOrder,
    ANSWER_WITHIN,
};
use self::table::{Table, KEPT_AFTER};
use self::tokens::{ProcSource, ProcWake, Refs};
use self::watches::Watches;
use super::sources::Sources;
use super::waiting::SessionKey;
use crate::address::{Answer, Reply, ReplyTo};
use crate::identity::Principal;

/// Every session's processes.
#[derive(Debug)]
pub struct Procs {
    sources: Sources<ProcSource>,
    /// Where its tokens start.
    base: usize,
    stewards: Slab<Steward>,
    table: Table,
    follows: Follows,
    watches: Watches,
    timers: Timers<ProcWake>,
    refs: Refs,
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
            watches: Watches::default(),
            timers: Timers::default(),
            refs: Refs::default(),
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

    /// Whether session `key` is in use, not idle: a live process, a
    /// waiting follow, or an order to its steward owed or given after
    /// `since`.
    pub fn in_use(&self, key: &SessionKey, since: Instant) -> bool {
        let steward = (self.table.steward_of(key)).and_then(|s| self.stewards.get(s));
        let ordered = steward.is_some_and(|s| !s.pending.is_empty() || s.last_order > since);
        let waiting = |followed| self.follows.waits_on(followed);
        ordered
            || (self.table.of(key).into_iter())
                .any(|p| !self.table[p].ended() || waiting(Followed::Output(p)))
            || (self.watches.of(key).into_iter()).any(|w| waiting(Followed::Events(w)))
    }

    /// `start` in session `key`, whose environment is `session_env`.
    /// Returns the sandbox's end of a new steward's socket if the session
    /// has no steward yet: the caller has its interpreter fork one on it
    /// (the order waits here for it meanwhile).
    pub fn start(
        &mut self,
        (key, interpreter): (&SessionKey, Option<u64>),
        start: ProcStart,
        session_env: &BTreeMap<String, String>,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<Option<OwnedFd>, ErrorReply> {
        let starting: Vec<&Process> = (self.stewards.iter())
            .flat_map(|(_, steward)| steward.pending.values())
            .filter_map(|pending| match pending {
                Pending::Start { process, .. } => Some(&**process),
                Pending::Signal { .. } | Pending::Timeout | Pending::File { .. } => None,
            })
            .collect();
        self.table.may_start(key, &start, &starting)?;
        let (process, fds) = Process::plumbed(key, &start).map_err(|err| internal("pipes", err))?;
        let (steward, new_socket) = self.steward_for((key, interpreter), replies)?;
        let mut env = session_env.clone();
        env.extend(start.env);
        let reference = self.refs.next();
        let order = StewardOrder::Start {
            reference,
            argv: &start.argv,
            env: &env,
            cwd: start.cwd.as_deref(),
            stdin: start.stdin,
            pty: start.pty.is_some(),
        };
        let process = Box::new(process);
        let pending = Pending::Start { reply_to, process };
        self.order(steward, reference, &order, pending, fds, replies);
        Ok(new_socket)
    }

    /// A file op in session `key`, carried out by its steward (made as
    /// for [`Procs::start`] if it has none).
    pub fn file(
        &mut self,
        (key, interpreter): (&SessionKey, Option<u64>),
        call: &FileCall,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<Option<OwnedFd>, ErrorReply> {
        if let FileCall::Watch(_) = call {
            let asked =
                (self.table.steward_of(key)).map_or(0, |s| self.stewards[s].watches_asked());
            self.watches.may_watch(key, asked)?;
        }
        let (steward, new_socket) = self.steward_for((key, interpreter), replies)?;
        let reference = self.refs.next();
        let order = StewardOrder::File { reference, call };
        let asked = FileAsked::of(call);
        let pending = Pending::File { reply_to, asked };
        self.order(steward, reference, &order, pending, Vec::new(), replies);
        Ok(new_socket)
    }

    /// The steward of session `key`'s `interpreter`, and the sandbox's end
    /// of its socket if it is new. One of an interpreter that has ended
    /// (its link's end not yet read) ends now.
    fn steward_for(
        &mut self,
        (key, interpreter): (&SessionKey, Option<u64>),
        replies: &mut Vec<Reply>,
    ) -> Result<(usize, Option<OwnedFd>), ErrorReply> {
        let ended = (self.table.steward_of(key)).filter(|&s| !self.stewards[s].serves(interpreter));
        if let Some(ended) = ended {
            self.end_steward(ended, &LinkError::Closed, replies);
        }
        match self.table.steward_of(key) {
            Some(steward) if self.stewards[steward].is_busy() => Err(busy_steward(key)),
            Some(steward) => Ok((steward, None)),
            None => {
                let (steward, theirs) = (self.new_steward(key, interpreter))
                    .map_err(|err| internal("a steward's socket", err))?;
                Ok((steward, Some(theirs)))
            }
        }
    }

    /// Sends `order` (numbered `reference`, with `fds`) to `steward`,
    /// which owes `pending` from then on.
    fn order(
        &mut self,
        steward: usize,
        reference: u64,
        order: &StewardOrder<'_>,
        pending: Pending,
        fds: Vec<OwnedFd>,
        replies: &mut Vec<Reply>,
    ) {
        self.stewards[steward].pending.insert(reference, pending);
        self.stewards[steward].last_order = Instant::now();
        self.answer_due(steward, reference);
        let sent = self.stewards[steward].link.send(order, fds);
        self.sent(steward, sent, replies);
    }

    /// A new steward's link for session `key`: the kernel's end watched,
    /// the sandbox's end returned.
    fn new_steward(
        &mut self,
        key: &SessionKey,
        interpreter: Option<u64>,
    ) -> io::Result<(usize, OwnedFd)> {
        let entry = self.stewards.vacant_entry();
        let number = entry.key();
        let (link, theirs) = Link::open(&mut self.sources, number)?;
        entry.insert(Steward::new(key.clone(), link, interpreter));
        self.table.set_steward(key, Some(number), Instant::now());
        Ok((number, theirs))
    }

    /// After an order was written: its socket watched for room if bytes
    /// remain; a failed link ends the steward.
    fn sent(&mut self, steward: usize, sent: Result<bool, LinkError>, replies: &mut Vec<Reply>) {
        match sent {
            // Watched anew only when that changes (a system call per order
            // otherwise).
            Ok(more) if more != self.stewards[steward].link.watching_writable => {
                self.stewards[steward].link.rewatch(&self.sources, more);
            }
            Ok(_) => {}
            Err(err) => self.end_steward(steward, &err, replies),
        }
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
        let asked = Follow {
            followed: Followed::Output(process),
            after: output.after,
            reply_to,
            quota,
        };
        self.answer_or_follow(asked, output.follow, output.wait_ms, now)
    }

    /// `events`: what a watch saw after `after`, answered as `output` is.
    pub fn events(
        &mut self,
        key: &SessionKey,
        events: FileEvents,
        quota: Principal,
        reply_to: ReplyTo,
        now: Instant,
    ) -> Answered {
        let asked = Follow {
            followed: Followed::Events(self.watches.find(key, &events.watch)?),
            after: events.after,
            reply_to,
            quota,
        };
        self.answer_or_follow(asked, events.follow, events.wait_ms, now)
    }

    /// Answers `asked` now if it has something to say or does not
    /// `follow`; else it waits up to `wait_ms` (answered later).
    fn answer_or_follow(
        &mut self,
        asked: Follow,
        follow: bool,
        wait_ms: Option<u64>,
        now: Instant,
    ) -> Answered {
        let news = news_for(
            (&self.table, &self.watches),
            asked.followed,
            asked.after,
            !follow,
        );
        if let Some(answer) = news {
            return Ok(Some(answer));
        }
        let wait = wait_ms.map_or(DEFAULT_WAIT, Duration::from_millis);
        let (id, serial) = self.follows.add(asked)?;
        self.timers
            .schedule(now + wait, ProcWake::Follow(id, serial));
        Ok(None)
    }

    /// Answers the follows of `followed` that now have something to say
    /// (all of them, with `all`).
    fn answer_follows(&mut self, followed: Followed, all: bool, replies: &mut Vec<Reply>) {
        (self.follows).answer(followed, all, (&self.table, &self.watches), replies);
    }

    /// `unwatch`: the watch ends (its follows answered), and its steward
    /// stops watching.
    pub fn unwatch(&mut self, key: &SessionKey, name: &str, replies: &mut Vec<Reply>) -> Answered {
        let reference = self.end_watch(self.watches.find(key, name)?, replies);
        if let Some(steward) = self.table.steward_of(key) {
            let sent = (self.stewards[steward].link)
                .send(&StewardOrder::Unwatch { reference }, Vec::new());
            self.sent(steward, sent, replies);
        }
        let removed = FileRemovedReply {
            success: true,
            removed: true,
        };
        Ok(Some(Answer::json(&removed)))
    }

    /// Ends watch `id`, answering its follows: the steward's number for it.
    fn end_watch(&mut self, id: usize, replies: &mut Vec<Reply>) -> u64 {
        let watch = &mut self.watches[id];
        watch.ended = true;
        let reference = watch.reference;
        self.answer_follows(Followed::Events(id), true, replies);
        self.watches.remove(id);
        reference
    }

    /// `input`: bytes for a process's stdin, answered once they are in
    /// its pipe.
    pub fn input(&mut self, key: &SessionKey, input: ProcInput) -> Answered {
        let process = self.table.find(key, &input.process()?)?;
        let written = self.table[process].take_input(&input.data, input.eof)?;
        self.table[process].flush_input(process, &mut self.sources);
        Ok(Some(Answer::json(&ProcInputReply {
            success: true,
            written,
        })))
    }

    /// A process printed or ended: its follows are answered; once it has
    /// ended its input closes and the oldest ended records beyond the caps
    /// go.
    fn moved_on(&mut self, process: usize, replies: &mut Vec<Reply>) {
        let ended = self.table[process].ended();
        self.answer_follows(Followed::Output(process), ended, replies);
        if ended {
            self.table[process].close_input(&mut self.sources);
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
        self.table[self.table.find(key, &which)?].resize(size)?;
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
        let reference = self.refs.next();
        let order = StewardOrder::Signal {
            reference,
            pid,
            signal,
        };
        self.order(steward, reference, &order, pending, Vec::new(), replies);
    }

    /// A steward that has said hello answers order `reference` within
    /// `answer_within` ([`ANSWER_WITHIN`]), or is dropped (one stopped by a process of its
    /// sandbox would keep its callers waiting for ever). Orders sent
    /// before its hello are given the time from then.
    fn answer_due(&mut self, steward: usize, reference: u64) {
        let (within, now) = (self.answer_within, Instant::now());
        if let Some(due) = self.stewards[steward].due(reference, within, now) {
            self.timers
                .schedule(due, ProcWake::Answer(steward, reference));
        }
    }

    /// One of the processes' descriptors is ready.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>, now: Instant) {
        match self.sources.get(token) {
            Some(ProcSource::Steward(steward)) => self.on_steward(steward, replies, now),
            Some(ProcSource::Output(process, index)) => {
                self.table[process].on_output(index, READ_BUDGET, &mut self.sources);
                self.moved_on(process, replies);
            }
            Some(ProcSource::Input(process)) => {
                self.table[process].flush_input(process, &mut self.sources)
            }
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
        let max_report = this.max_report();
        let read = this.link.read(&mut reports, READ_BUDGET, max_report);
        for report in reports {
            if let Err(err) = self.on_report(steward, report, replies, now) {
                return self.end_steward(steward, &err, replies);
            }
        }
        match read {
            Err(err) => self.end_steward(steward, &err, replies),
            // Edge-triggered: watched anew, it is reported again next
            // turn, after the others' events.
            Ok(true) => {
                let link = &mut self.stewards[steward].link;
                link.rewatch(&self.sources, link.has_unsent());
            }
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
            Heard::Watching(reply_to, reference) => {
                let watch = self.watches.add(key, reference);
                let name = self.watches[watch].name();
                let watching = FileWatchReply {
                    success: true,
                    watch: name,
                };
                replies.push((reply_to, Answer::json(&watching)));
            }
            Heard::Events(reference, events) => {
                // One unwatched a moment ago may still report.
                if let Some(watch) = self.watches.by_reference(&key, reference) {
                    self.watches[watch].push(events);
                    self.answer_follows(Followed::Events(watch), false, replies);
                }
            }
            Heard::Nobody => {}
            Heard::Ended(pid, end) => {
                let Some(process) = self.table.unreported(&key, pid) else {
                    return Err(LinkError::Hostile(format!(
                        "the end of pid {pid}, not ours"
                    )));
                };
                self.table[process].ended_as_reported(end, now);
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
            self.answer_follows(Followed::Output(process), true, replies);
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
        let key = this.key.clone();
        this.answer_owed(why, replies);
        for watch in self.watches.of(&key) {
            self.end_watch(watch, replies);
        }
        let now = Instant::now();
        if self.table.steward_of(&key) == Some(steward) {
            self.table.set_steward(&key, None, now);
            for process in self.table.of(&key) {
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
            for (reference, due) in self.stewards[steward].dues_anew(self.answer_within, now) {
                self.timers
                    .schedule(due, ProcWake::Answer(steward, reference));
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
                    let follow = self.follows.take_if(id, serial);
                    if let Some(follow) = follow {
                        let followed = (&self.table, &self.watches);
                        if let Some(answer) =
                            news_for(followed, follow.followed, follow.after, true)
                        {
                            replies.push((follow.reply_to, answer));
                        }
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
                    if owed.is_some_and(|s| s.overdue(reference, now)) {
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
