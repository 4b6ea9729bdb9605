//! What waits for a run child: requests in their owners' queues
//! (`requests`), and sessions (`sessions`), each with a queue of orders
//! for its own child. A request is admitted here and waits in its
//! session's queue or its owner's until the dispatcher has a child for
//! it; one that cannot start is answered here — refused as its turn
//! comes, cancelled, its owner gone, its deadline passed, the kernel
//! stopping. A restore that is answered so takes its session with it.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{ExecReply, ExecRequest, SessionInfo, SessionUsage};
use agentos_proto::{ErrorCode, ErrorReply};

pub use super::disk_work::{DiskWork, DisksDone};
use super::disks::{no_session, Asked, SessionDisks};
use super::network::{Narrowed, RunNetwork};
use super::order::{Finished, Order};
use super::queues::{Caps, Share};
use super::requests::Requests;
use super::run_cgroup::ChargedTo;
use super::session_meta::{Ends, SessionMeta};
use super::session_ops::{self, memfd, no_interpreter};
pub use super::session_ops::{Idle, SessionOp};
use super::sessions::{hibernates_idle, Sessions};
use super::spans::RunSpans;
use super::waiting::{refuse_each, RunAsk, Session, SessionKey, Waiting};
use crate::address::{Answer, Reply, ReplyTo};
use crate::config::exec::ExecConfig;
use crate::identity::Principal;

/// What closing a session found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// No such session.
    Nothing,
    /// It was waiting to be restored: the restore is answered, and the
    /// session is gone.
    Restoring,
    /// It was open on this child, which is to be killed.
    Open(usize),
}

/// The owners' queues and the sessions, with their disks.
#[derive(Debug)]
pub struct Backlog {
    requests: Requests,
    sessions: Sessions,
    /// Sessions' and templates' disks, and what waits on them.
    disks: DiskWork,
    /// An idle session hibernates rather than ends
    /// (`exec.idle_hibernate_secs`).
    hibernate_idle: bool,
}

impl Backlog {
    /// Nothing waiting, with `exec`'s caps: the runs one owner may hold of
    /// the children its hosts keep ready, and the sessions.
    pub fn new(exec: &ExecConfig, disks: SessionDisks) -> Backlog {
        let slots = exec.hosts * exec.ready_runs;
        let hibernate_idle = hibernates_idle(exec) && disks.available();
        Backlog {
            requests: Requests::new(Caps::for_slots(slots, exec.max_running_per_owner)),
            hibernate_idle,
            sessions: Sessions::new(exec, hibernate_idle),
            disks: DiskWork::new(disks),
        }
    }

    /// Whether one more request of `share` may wait.
    pub fn may_wait(&self, share: Share) -> Result<(), ErrorReply> {
        self.requests.may_wait(share, self.sessions.queued())
    }

    /// Whether a run `request` for session `key` may wait for it (or, if
    /// the session is neither open nor about to open, for a child to open
    /// it); the reply it gets at once instead, if the memory controller
    /// ended the session while it waited.
    pub fn admit(
        &mut self,
        key: &SessionKey,
        request: &ExecRequest,
        share: Share,
    ) -> Result<Option<ExecReply>, ErrorReply> {
        // An `open` starts afresh: it is told nothing of a session lost.
        let lost = self.sessions.take_lost(key);
        if let Some(lost) = lost.filter(|_| request.opens.is_none()) {
            return Ok(Some(lost));
        }
        let live = self.is_live(key);
        if request.opens.is_some() && live {
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!("session {:?} is open already", key.1),
            ));
        }
        let requests = &self.requests;
        self.sessions
            .same_grant(key, || requests.opening_grant(key), request)?;
        if !live {
            self.sessions.may_open(key.0, requests.sessions())?;
            self.disks.store.may_make(key, share, requests.sessions())?;
        }
        Ok(None)
    }

    /// Queues `waiting` in its session's queue if the session is open
    /// (whose key is returned: the session is to be served), else in its
    /// owner's.
    pub fn queue(&mut self, mut waiting: Waiting) -> Option<SessionKey> {
        waiting.on_disk = waiting.session.is_some() && self.disks.store.available();
        let open = waiting.session.clone();
        match open.filter(|key| self.sessions.contains(key)) {
            Some(key) => {
                self.sessions.queue(&key, waiting);
                Some(key)
            }
            None => {
                self.requests.push_back(waiting);
                None
            }
        }
    }

    /// Whether the request whose reply goes to `reply_to` waits.
    pub fn is_waiting(&self, reply_to: ReplyTo) -> bool {
        self.requests
            .iter()
            .chain(self.sessions.queued())
            .any(|w| w.reply_to == reply_to)
    }

    /// Requests for sessions opened since they were queued join those
    /// sessions' queues: the sessions, to be served.
    pub fn join_opened(&mut self) -> Vec<SessionKey> {
        let sessions = &self.sessions;
        let opened = self
            .requests
            .take_where(|w| w.session.as_ref().is_some_and(|k| sessions.contains(k)));
        let mut keys = Vec::new();
        for waiting in opened {
            if let Some(key) = waiting.session.clone() {
                self.sessions.queue(&key, waiting);
                keys.push(key);
            }
        }
        keys
    }

    /// The agents' cgroups waiting requests are to be charged under.
    pub fn charges(&self) -> impl Iterator<Item = &ChargedTo> {
        self.requests
            .iter()
            .chain(self.sessions.queued())
            .filter_map(|w| w.charged_to.as_ref())
    }

    /// The next request in the owners' queues to start, owner by owner in
    /// turn: one `ready` accepts, within its owner's share (see
    /// [`Requests::next`]). One whose network its owner's policy no longer
    /// covers is answered instead (`network`), and the next is taken.
    pub fn next(
        &mut self,
        mut ready: impl FnMut(&Waiting) -> bool,
        lending: &HashSet<u64>,
        network: &RunNetwork,
        spans: &RunSpans,
        replies: &mut Vec<Reply>,
    ) -> Option<Waiting> {
        self.first_startable(network, spans, replies, |backlog| {
            backlog.requests.next(&mut ready, lending)
        })
    }

    /// Puts `waiting` back first in its owner's line: no child was ready.
    pub fn push_front(&mut self, waiting: Waiting) {
        self.requests.push_front(waiting);
    }

    /// `child` is given to `waiting`: the session it names, if it names
    /// one, opens on it (a new one, or one its restore carries over).
    /// Its environment, labels and lifetime are `open`'s, else a stored
    /// session's (a restore carries its own): when its lifetime ends.
    pub fn open_session(
        &mut self,
        child: usize,
        waiting: &mut Waiting,
        now: Instant,
    ) -> Option<(SessionKey, Ends)> {
        let key = waiting.session.clone()?;
        let grant = RunAsk::of(&waiting.request);
        let carried = waiting.carried.take();
        let restored = carried.is_some();
        let mut session = Session::open(child, carried, grant, now);
        session.orders_as = Some(waiting.orders_as());
        let stored = self
            .disks
            .store
            .stored
            .record(&key)
            .map(|record| &record.meta);
        match waiting.request.opens.take() {
            Some(setup) => session.meta = SessionMeta::opened(*setup, stored, SystemTime::now()),
            None if restored => {}
            None => session.meta = stored.cloned().unwrap_or_default(),
        }
        let ends = session.meta.ends.map(|ends| (key.clone(), ends));
        self.sessions.insert(key, session);
        ends
    }

    /// The next order queued for session `key`, if the session's child is
    /// free and `alive`, and the order has room in its owner's share. One
    /// whose network its owner's policy no longer covers is answered
    /// instead, leaving the child free for the next.
    pub fn next_for_session(
        &mut self,
        key: &SessionKey,
        alive: impl Fn(usize) -> bool,
        lending: &HashSet<u64>,
        network: &RunNetwork,
        spans: &RunSpans,
        replies: &mut Vec<Reply>,
    ) -> Option<Waiting> {
        self.first_startable(network, spans, replies, |backlog| {
            let requests = &backlog.requests;
            let room = |w: &Waiting| requests.has_room(w, lending);
            backlog.sessions.next(key, &alive, room)
        })
    }

    /// `waiting` has been given `child`, whose pidfd is `pidfd`: it waits
    /// while the child is given its disks (see [`DiskWork::give`]).
    pub fn give_disks(
        &mut self,
        child: usize,
        pidfd: Option<OwnedFd>,
        waiting: Waiting,
        replies: &mut Vec<Reply>,
    ) -> Option<usize> {
        self.disks
            .give(child, pidfd, waiting, &mut self.sessions, replies)
    }

    /// What the disks' thread has answered (see [`DiskWork::done`]).
    pub fn disks_done(&mut self, replies: &mut Vec<Reply>) -> DisksDone {
        self.disks.done(&mut self.sessions, replies)
    }

    /// The disks of sessions and templates, and what waits on them.
    pub fn disks(&mut self) -> &mut DiskWork {
        &mut self.disks
    }

    /// An order of session `key` starts `now`: the session's child.
    pub fn begin(&mut self, key: &SessionKey, now: Instant) -> Option<usize> {
        self.sessions.begin(key, now)
    }

    /// A restore's turn has come: the session is taken out, carried by
    /// `restore`, which waits first in its owner's line for a fresh child.
    /// The session's old child, to go.
    pub fn begin_restore(&mut self, key: &SessionKey, mut restore: Waiting) -> Option<usize> {
        let (child, carried) = self.sessions.end(key)?.into_carried();
        self.restores_next(key, &restore);
        restore.carried = Some(carried);
        self.requests.push_front(restore);
        Some(child)
    }

    /// A run of `share` has started: it holds its place until it ends.
    pub fn started(&mut self, share: Share) {
        self.requests.started(share);
    }

    /// A run of `share` has ended.
    pub fn ended(&mut self, share: Share) {
        self.requests.ended(share);
    }

    /// Whether sessions' queued runs go before the owners' queues now that
    /// room has come (the two take turns).
    pub fn sessions_turn(&mut self) -> bool {
        self.requests.sessions_turn()
    }

    /// Sessions whose child is free and which have orders queued.
    pub fn sessions_waiting(&self) -> Vec<SessionKey> {
        self.sessions.waiting()
    }

    /// The session that keeps `child`, if one does.
    pub fn session_of(&self, child: usize) -> Option<SessionKey> {
        self.sessions.of_child(child)
    }

    /// The reply to a finished order of session `key`'s; none yet for a
    /// snapshot whose globals were saved: the kernel reads the session's
    /// files then (the session held busy meanwhile), and answers. A
    /// hibernation the kernel asked for that failed lets the session go
    /// of its child (see [`Backlog::not_hibernated`]).
    pub fn answer(&mut self, key: &SessionKey, mut finished: Finished) -> Option<Answer> {
        let kernels_hibernation =
            finished.order.hibernates() && finished.reply_to == ReplyTo::Nobody;
        let saved = finished.reply.exit_code == Some(0) && finished.reply.error.is_none();
        // Why a hibernation the kernel asked for failed, if it did.
        let mut why = (kernels_hibernation && !saved).then(|| match &finished.reply.error {
            Some(error) => error.clone(),
            None => format!("its interpreter ended with {:?}", finished.reply.exit_code),
        });
        let answer = match finished.order.take_snapshot().filter(|_| saved) {
            Some((name, state, hibernate)) => {
                let asked = Asked {
                    key: key.clone(),
                    reply_to: finished.reply_to,
                    not_saved: std::mem::take(&mut finished.left_out),
                    hibernate,
                    fleet: hibernate && self.disks.store.fleet_staging.keeps(key.0),
                };
                match self.disks.store.take_snapshot(name, state, asked) {
                    Ok(()) => {
                        self.sessions.hold(key);
                        return None;
                    }
                    Err(refusal) => {
                        why.get_or_insert_with(|| refusal.error.clone());
                        refusal.into()
                    }
                }
            }
            None => self.sessions.answer(key, finished),
        };
        if kernels_hibernation {
            // Its child, no longer the session's, is the caller's to end.
            self.not_hibernated(key, why.as_deref().unwrap_or("it saved no globals"));
        }
        Some(answer)
    }

    /// The kernel's own hibernation of session `key` failed (`why`): its
    /// idle time (or its lifetime) has come all the same, so its
    /// interpreter ends (its disk
    /// stays) rather than be tried again and again; what waited for it
    /// waits for a fresh one. The old child, to go.
    pub fn not_hibernated(&mut self, key: &SessionKey, why: &str) -> Vec<usize> {
        log::warn!(
            "exec session {:?}: it could not hibernate ({why}); its interpreter ends",
            key.1
        );
        self.hibernated(std::slice::from_ref(key))
    }

    /// Session `key`'s interpreter is gone (killed at a timeout, or it
    /// died): so is the session, its snapshots, and what waited for it.
    pub fn session_died(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) {
        if let Some(session) = self.sessions.end(key) {
            let ended = ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "session {:?} ended before this run could start (its interpreter was \
                     killed); run again to start a new one",
                    key.1
                ),
            );
            refuse_each(session.queue, &ended, replies);
        }
    }

    /// Session `key` ends, with its snapshots, and what waited for it.
    pub fn end_session(&mut self, key: &SessionKey) {
        self.sessions.end(key);
    }

    /// An order of session `key` has ended `now` (it `ran_code`, or was a
    /// snapshot or restore): when the session is closed if unused until
    /// then.
    pub fn order_ended(
        &mut self,
        key: &SessionKey,
        ran_code: bool,
        workspace_bytes: Option<u64>,
        now: Instant,
    ) -> Option<Instant> {
        let idle_at = self.sessions.order_ended(key, ran_code, now);
        if let Some((runs, last_used)) = self.sessions.to_record(key) {
            self.disks.store.note(key, runs, last_used, workspace_bytes);
        }
        idle_at
    }

    /// What becomes of session `key` if it has been unused since
    /// `last_used`: nothing, if it has been used since; hibernated (its
    /// order queued) with `exec.idle_hibernate_secs`; else its
    /// interpreter ends.
    pub fn idle(&mut self, key: &SessionKey, last_used: Instant, now: Instant) -> Idle {
        if !self.sessions.is_idle(key, last_used) {
            return Idle::Used;
        }
        self.hibernate_now(key, self.hibernate_idle, now)
    }

    /// The kernel hibernates session `key` `now` (its order queued), if
    /// it `may` and sessions have disks to hibernate onto; else its
    /// interpreter ends.
    pub fn hibernate_now(&mut self, key: &SessionKey, may: bool, now: Instant) -> Idle {
        if self.sessions.hibernates_next(key) {
            // One is queued already (a PAUSE asked for it).
            return Idle::Hibernates;
        }
        let may = may && self.disks.store.available();
        let orders_as = self.sessions.orders_as(key).filter(|_| may);
        let Some((caller, limits, timeout)) = orders_as else {
            log::debug!("exec session {:?}: its interpreter ends", key.1);
            return Idle::Ends;
        };
        let Ok(state) = memfd() else {
            return Idle::Ends;
        };
        log::debug!("exec session {:?}: it hibernates", key.1);
        let order = Order::hibernate(state);
        let to = ReplyTo::Nobody;
        let waiting = Waiting::for_session(key, caller, order, to, limits, timeout, now);
        self.sessions.queue(key, waiting);
        Idle::Hibernates
    }

    /// The open sessions and the sessions' disks, for what both keep of
    /// a session (its lifetime, see [`lifetimes`]).
    pub fn sessions_and_disks(&mut self) -> (&mut Sessions, &mut SessionDisks) {
        (&mut self.sessions, &mut self.disks.store)
    }

    /// Whether session `key` is open, or about to be (a run or restore
    /// waits to open it).
    pub fn is_live(&self, key: &SessionKey) -> bool {
        self.sessions.contains(key) || self.is_opening(key)
    }

    /// Whether session `key` is not open but about to be: a run or a
    /// restore waits for a child to open it on.
    pub fn is_opening(&self, key: &SessionKey) -> bool {
        !self.sessions.contains(key) && self.requests.sessions().any(|k| k == key)
    }

    /// Whether session `key` is paused.
    pub fn is_paused(&self, key: &SessionKey) -> bool {
        self.sessions.is_paused(key)
    }

    /// Session `key`'s idle interpreter was killed for memory: its owner is
    /// told when it names the session again.
    pub fn note_lost(&mut self, key: &SessionKey) {
        self.sessions.note_lost(key);
    }

    /// `owner`'s sessions (`op: sessions`); see [`Sessions::list`].
    pub fn sessions(
        &self,
        owner: Principal,
        figures: impl Fn(usize) -> (u64, Option<SessionUsage>),
    ) -> Vec<SessionInfo> {
        let open = self.sessions.list(owner, figures);
        self.disks.store.stored.list(owner, open)
    }

    /// The order `op` asks of session `key`, to wait its turn in the
    /// session's queue; or none, the disks' thread asked to do it (see
    /// [`session_ops::order_for`]).
    pub fn order_for(
        &mut self,
        key: &SessionKey,
        op: SessionOp<'_>,
        share: Share,
        reply_to: ReplyTo,
    ) -> Result<Option<Order>, ErrorReply> {
        let (sessions, requests) = (&self.sessions, &self.requests);
        let asked = (key, op, share, reply_to);
        session_ops::order_for(asked, sessions, requests, &mut self.disks.store)
    }

    /// The interpreters of sessions `keys` have saved their globals
    /// (hibernated), or are to end for another reason: what waited for
    /// each waits again, first in its owner's line, for a fresh one (a
    /// restore first among them restores onto it); the old children, to
    /// go.
    pub fn hibernated(&mut self, keys: &[SessionKey]) -> Vec<usize> {
        let mut gone = Vec::new();
        for key in keys {
            let Some(session) = self.sessions.end(key) else {
                continue;
            };
            if let Some(first) = session.queue.front() {
                self.restores_next(key, first);
            }
            for waiting in session.queue.into_iter().rev() {
                self.requests.push_front(waiting);
            }
            gone.push(session.child);
        }
        gone
    }

    /// If `waiting` is a restore of session `key` that will open it on a
    /// fresh child, the snapshot is restored onto its disk first.
    fn restores_next(&mut self, key: &SessionKey, waiting: &Waiting) {
        if let Order::Restore { name } = &waiting.order {
            self.disks.store.restore_next(key, name);
        }
    }

    /// PAUSE (`frozen`) or RESUME of session `key`: its child is frozen or
    /// thawed (`freeze`), and the session marked so — its queued orders
    /// wait while it is paused.
    pub fn freeze<F>(
        &mut self,
        key: &SessionKey,
        frozen: bool,
        freeze: impl FnOnce(usize) -> Result<F, ErrorReply>,
    ) -> Result<F, ErrorReply> {
        if let Some(child) = self.sessions.child_of(key) {
            let done = freeze(child)?;
            self.sessions.set_paused(key, frozen);
            return Ok(done);
        }
        if self.disks.store.stored.record(key).is_none() {
            return Err(no_session(key));
        }
        let op = if frozen {
            SessionOp::Hibernate
        } else {
            SessionOp::Wake
        };
        Err(no_interpreter(key, op))
    }

    /// Closes session `key` (`op: close`): its snapshots go, and what
    /// waited for it is answered.
    pub fn close(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) -> Closed {
        // A session being restored waits in its restore, for a sandbox.
        if let Some(restore) = self.requests.take_restore_of(key) {
            let closed = ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {:?} was closed before it was restored", key.1),
            );
            self.refuse(restore, &closed, replies);
            return Closed::Restoring;
        }
        match self.sessions.close(key, replies) {
            Some(child) => Closed::Open(child),
            None => Closed::Nothing,
        }
    }

    /// `owner` has ended: its sessions' disks go; the names of its open
    /// sessions, to be closed; what it lost to memory is not to be told.
    pub fn end_owner(&mut self, owner: Principal) -> Vec<String> {
        self.sessions.forget_lost_of(owner);
        self.disks.store.remove_owner(owner);
        self.sessions.names_of(owner)
    }

    /// Answers a request taken from a queue with `refusal`. A restore that
    /// carries its session takes the session's interpreter with it: what
    /// waited for the session is answered too.
    pub fn refuse(&mut self, mut waiting: Waiting, refusal: &ErrorReply, replies: &mut Vec<Reply>) {
        self.disks.not_started(&waiting);
        if let (Some(carried), Some(key)) = (waiting.carried.take(), &waiting.session) {
            let ended = "ended while it was being restored; run again to start a new one";
            self.sessions.drop_carried(key, carried, ended, replies);
        }
        replies.push((waiting.reply_to, refusal.clone().into()));
    }

    /// Answers a request that cannot start because of `narrowed`; nothing
    /// of it ran, and a session it was queued for stays as it was.
    /// The first request `take` gives whose network its owner's policy
    /// still covers; those it no longer covers are answered on the way.
    fn first_startable(
        &mut self,
        network: &RunNetwork,
        spans: &RunSpans,
        replies: &mut Vec<Reply>,
        mut take: impl FnMut(&mut Backlog) -> Option<Waiting>,
    ) -> Option<Waiting> {
        loop {
            let mut waiting = take(self)?;
            match network.at_start(&mut waiting) {
                Ok(()) => return Some(waiting),
                Err(narrowed) => self.refuse_at_start(waiting, narrowed, spans, replies),
            }
        }
    }

    fn refuse_at_start(
        &mut self,
        mut waiting: Waiting,
        narrowed: Narrowed,
        spans: &RunSpans,
        replies: &mut Vec<Reply>,
    ) {
        let refusal = ErrorReply::from(narrowed);
        match waiting.run {
            Some(number) => log::info!("exec run {number}: not started: {}", refusal.error),
            None => log::info!("exec: a session's order not started: {}", refusal.error),
        }
        if let Some(span) = waiting.span.take() {
            spans.refused(span, &refusal.error);
        }
        self.refuse(waiting, &refusal, replies);
    }

    /// Takes the waiting requests `pick` picks, from owners' queues and
    /// sessions'.
    fn take_where(&mut self, mut pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        let mut taken = self.requests.take_where(&mut pick);
        taken.extend(self.disks.take_attaching_where(&mut pick));
        taken.extend(self.sessions.take_queued(pick));
        taken
    }

    /// Drops the request whose reply goes to `reply_to`, if it waits
    /// (answered all the same: the answer is what tells the kernel the run
    /// is over); whether it did.
    pub fn cancel(&mut self, reply_to: ReplyTo, replies: &mut Vec<Reply>) -> bool {
        let its = |w: &Waiting| w.reply_to == reply_to;
        let mut waiting = self.take_where(its);
        // One waiting in a restored session's queue, carried by the restore.
        waiting.extend(self.requests.take_carried(its));
        let found = !waiting.is_empty();
        let cancelled = ErrorReply::new(ErrorCode::Unavailable, "the run was cancelled");
        for waiting in waiting {
            self.refuse(waiting, &cancelled, replies);
        }
        found
    }

    /// Answers the waiting requests `pick` picks: they were not started,
    /// for `why`.
    pub fn end_where(
        &mut self,
        pick: impl FnMut(&Waiting) -> bool,
        why: &str,
        replies: &mut Vec<Reply>,
    ) {
        let why = format!("the run was not started: {why}");
        let refusal = ErrorReply::new(ErrorCode::Unavailable, why);
        for waiting in self.take_where(pick) {
            self.refuse(waiting, &refusal, replies);
        }
    }

    /// Answers with `refusal` the requests in the owners' queues charged
    /// to `agent`.
    pub fn refuse_charged(&mut self, agent: u32, refusal: &ErrorReply, replies: &mut Vec<Reply>) {
        let its = |w: &Waiting| w.charged_to.as_ref().is_some_and(|c| c.agent == agent);
        for waiting in self.requests.take_where(its) {
            self.refuse(waiting, refusal, replies);
        }
    }

    /// Answers `timeout` to requests that waited past their deadline, saying
    /// why they waited: behind other work (`running` orders were going), or
    /// for an exec host that is starting or failing (none `hosts_up`).
    pub fn expire(
        &mut self,
        now: Instant,
        hosts_up: bool,
        running: usize,
        replies: &mut Vec<Reply>,
    ) {
        for mut waiting in self.take_where(|waiting| waiting.deadline <= now) {
            self.disks.not_started(&waiting);
            // A restore that never got its sandbox ends its session.
            if let (Some(carried), Some(key)) = (waiting.carried.take(), &waiting.session) {
                let ended = "ended: restoring it found no sandbox within its timeout";
                self.sessions.drop_carried(key, carried, ended, replies);
            }
            let reply = self
                .requests
                .waited_too_long(&waiting, hosts_up, running, now);
            replies.push((waiting.reply_to, reply.into()));
        }
    }

    /// The kernel is stopping: every request in the owners' queues is
    /// refused, and what waits for a session a restore carries.
    pub fn shut_down(&mut self, replies: &mut Vec<Reply>) {
        let waiting = self.requests.take_where(|_| true);
        let carried = waiting
            .iter()
            .flat_map(|w| w.carried.iter().flat_map(|c| c.queue.iter()));
        let refusal = ErrorReply::new(ErrorCode::Unavailable, "the kernel is shutting down");
        let waiting = waiting.iter().chain(carried);
        replies.extend(waiting.map(|w| (w.reply_to, refusal.clone().into())));
    }
}
