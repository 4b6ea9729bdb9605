//! The dispatcher, [`Dispatcher`]: it holds EXEC's parts and does what
//! takes more than one of them. An admitted request (see
//! [`super::front`]) waits in the backlog (its owner's queue, or its
//! session's) until the pool has a ready child for it, within its owner's
//! share; it is then sent with its cgroup (`exec_cgroups`) and its network
//! (`network`); its reply is built when the child has ended, and the
//! child let go or kept for its session. Everything here runs on the
//! reactor thread and never blocks.

use std::time::{Duration, Instant, SystemTime};

use agentos_primitives::timers::Timers;
use agentos_proto::payload::{Lifetime, LifetimeEnd};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::Token;

use super::backlog::{Backlog, Closed, Idle};
use super::cgroups::MadeFor;
use super::children::Done;
use super::exec_cgroups::ExecCgroups;
use super::exec_host::HostId;
use super::hosts::HOST_RETRY;
use super::lifetimes::{self, Lifetimes};
use super::network::RunNetwork;
use super::order::{Order, OrderCaps};
use super::pool::{Event, Launch, Pool};
use super::session_meta::{epoch_ms, Ends};
use super::spans::RunSpans;
use super::waiting::{SessionKey, Waiting};
use crate::address::{Reply, ReplyTo};
use crate::cgroup::Freezer;
use crate::sandbox::runtime::{SandboxEvent, Sandboxes};

/// How long a lifetime that ends while its session waits to be opened or
/// restored is put off, at a time.
const LIFETIME_RETRY_MS: u64 = 1000;

/// What one of EXEC's timers is for.
#[derive(Clone, Debug)]
pub(super) enum Wake {
    /// A run's timeout, if it is still that run.
    Timeout { child: usize, started: Instant },
    /// Start the hosts that are missing.
    StartHosts,
    /// Close a session unused since `last_used`, if it still is.
    SessionIdle { key: SessionKey, last_used: Instant },
    /// Answer the waiting requests whose deadline has passed.
    WaitedTooLong,
}

/// EXEC's parts, and what takes more than one of them.
#[derive(Debug)]
pub struct Dispatcher {
    /// The exec hosts and their run children.
    pub(super) pool: Pool,
    /// Requests waiting in their owners' queues, and sessions.
    pub(super) backlog: Backlog,
    /// Runs' cgroups and their limits.
    pub(super) cgroups: ExecCgroups,
    /// Runs' network policies and the proxy that serves them.
    pub(super) network: RunNetwork,
    pub(super) spans: RunSpans,
    pub(super) timers: Timers<Wake>,
    /// When sessions' lifetimes end.
    pub(super) lifetimes: Lifetimes,
    pub(super) caps: OrderCaps,
    pub(super) shutting_down: bool,
}

impl Dispatcher {
    /// Queues `waiting`, in its session's queue (which is served; one
    /// that hibernates a paused session lets it go) or its owner's.
    pub(super) fn queue(&mut self, waiting: Waiting, replies: &mut Vec<Reply>, now: Instant) {
        let hibernates = waiting.order.hibernates();
        match self.backlog.queue(waiting) {
            Some(key) if hibernates => self.let_go_to_hibernate(&key, replies, now),
            Some(key) => self.serve_session(&key, replies, now),
            None => self.dispatch(replies, now),
        }
    }

    /// The request whose reply goes to `reply_to`, if it still waits, is
    /// answered at `deadline` if it waits then.
    pub(super) fn expire_if_waiting(&mut self, reply_to: ReplyTo, deadline: Instant) {
        if self.backlog.is_waiting(reply_to) {
            self.timers.schedule(deadline, Wake::WaitedTooLong);
        }
    }

    /// Readiness of one of EXEC's tokens.
    pub(super) fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>) {
        let now = Instant::now();
        match self.pool.on_event(token, &self.cgroups, now) {
            Event::Nothing => {}
            Event::Host(host) => {
                while let Some(ready) = self.pool.take_child(host, &self.cgroups, now) {
                    if ready {
                        self.dispatch(replies, now);
                    }
                }
            }
            Event::Ready => self.dispatch(replies, now),
            Event::Gone(child) => self.child_gone(child, replies),
            Event::Progress(child) => self.finish_if_done(child, replies, now),
            Event::Renewed(child) => self.renewed(child, replies, now),
        }
    }

    /// How long until the earliest deadline.
    pub(super) fn next_deadline(&self, now: Instant) -> Option<Duration> {
        let lifetimes = self.lifetimes.time_to_next(SystemTime::now());
        [self.timers.time_to_next(now), lifetimes]
            .into_iter()
            .flatten()
            .min()
    }

    /// Handles the deadlines that are due.
    /// (`in_use`: whether a session's processes, files or watches were in
    /// use since the instant given, which keeps it from idling.)
    pub(super) fn on_deadlines(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        in_use: impl Fn(&SessionKey, Instant) -> bool,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        while let Some(wake) = self.timers.pop_due(now) {
            match wake {
                Wake::Timeout { child, started } => {
                    // A paused run's time limit stands still: it is looked
                    // at again when it may be due.
                    if let Some(due) = self.pool.children_mut().timed_out(child, started, now) {
                        self.timers.schedule(due, Wake::Timeout { child, started });
                    }
                }
                Wake::StartHosts => self.start_hosts(sandboxes, now),
                Wake::WaitedTooLong => {
                    let hosts_up = self.pool.any_up();
                    let running = self.pool.children().running_count();
                    self.backlog.expire(now, hosts_up, running, replies);
                }
                Wake::SessionIdle { key, last_used } if in_use(&key, last_used) => {
                    let (sessions, _) = self.backlog.sessions_and_disks();
                    if let Some(idle_at) = sessions.touch(&key, now) {
                        let last_used = now;
                        self.timers
                            .schedule(idle_at, Wake::SessionIdle { key, last_used });
                    }
                }
                Wake::SessionIdle { key, last_used: at } => {
                    match self.backlog.idle(&key, at, now) {
                        Idle::Used => {}
                        Idle::Ends => drop(self.end_interpreter(&key, replies)),
                        Idle::Hibernates => self.let_go_to_hibernate(&key, replies, now),
                    }
                }
            }
        }
        let wall = SystemTime::now();
        let wall_ms = epoch_ms(wall);
        while let Some((key, _)) = self.lifetimes.pop_due(wall) {
            self.lifetime_ended(&key, wall_ms, replies, now);
        }
    }

    /// Session `key`'s lifetime has ended by `now_ms` (on the wall
    /// clock): it is closed or hibernated, as it was set to be.
    fn lifetime_ended(
        &mut self,
        key: &SessionKey,
        now_ms: u64,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        if self.backlog.is_opening(key) {
            // A restore or an open of it waits for a child: it ends once
            // that is done.
            self.lifetimes
                .set(key, Some(now_ms.saturating_add(LIFETIME_RETRY_MS)));
            return;
        }
        let (sessions, disks) = self.backlog.sessions_and_disks();
        match lifetimes::lifetime_ended(key, now_ms, sessions, disks) {
            None => {}
            Some(LifetimeEnd::Close) => drop(self.close(key, replies)),
            Some(LifetimeEnd::Hibernate) => match self.backlog.hibernate_now(key, true, now) {
                Idle::Hibernates => self.let_go_to_hibernate(key, replies, now),
                // It cannot hibernate (no session disks): its interpreter
                // ends, as an idle one's would.
                Idle::Ends => drop(self.end_interpreter(key, replies)),
                Idle::Used => {}
            },
        }
    }

    /// Asks the runtime for the hosts that are missing.
    pub(super) fn start_hosts(&mut self, sandboxes: &mut impl Sandboxes<HostId>, now: Instant) {
        self.pool.start_hosts(sandboxes, now, &self.cgroups);
    }

    /// Takes in what happened to a host's sandbox. A host that failed or
    /// ended takes its children with it; another starts after a pause.
    pub(super) fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        now: Instant,
    ) {
        let gone = self.pool.on_sandbox(sandboxes, event, &self.cgroups);
        if gone && !self.shutting_down {
            self.timers.schedule(now + HOST_RETRY, Wake::StartHosts);
        }
    }

    /// Sends the cgroups made since the last call to their hosts, and keeps
    /// those made inside agents' for their runs, which may start now.
    pub(super) fn on_wake(&mut self, replies: &mut Vec<Reply>) {
        let done = self.backlog.disks_done(replies);
        let mut hibernated = self.backlog.hibernated(&done.hibernated);
        for (key, why) in &done.not_hibernated {
            hibernated.extend(self.backlog.not_hibernated(key, why));
        }
        // What waited for a hibernated session waits for a fresh child.
        let mut dispatch_again = !hibernated.is_empty();
        for child in done.refused.into_iter().chain(hibernated) {
            self.pool.children().kill_quietly(child);
            self.drop_child(child);
        }
        for child in done.warmed {
            self.pool.children_mut().settle_template(child);
        }
        for (child, waiting) in done.ready {
            self.start(child, waiting, replies, Instant::now());
        }
        for key in done.sessions {
            self.serve_session(&key, replies, Instant::now());
        }
        for made in self.cgroups.made() {
            match made.made_for {
                MadeFor::Host(host) => self.pool.cgroup_made(host, made.result, &self.cgroups),
                MadeFor::Agent(to) => {
                    dispatch_again = true;
                    if let Err(failed) = self.cgroups.made_for_agent(&to, made.result) {
                        self.backlog.refuse_charged(to.agent, &failed, replies);
                    }
                }
            }
        }
        if dispatch_again {
            self.dispatch(replies, Instant::now());
        }
    }

    /// Gives waiting requests to ready children, owner by owner in turn,
    /// each within its share; a request for a session opened meanwhile
    /// joins that session's queue.
    pub(super) fn dispatch(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        for key in self.backlog.join_opened() {
            self.serve_session(&key, replies, now);
        }
        self.cgroups.ask_for_agents(self.backlog.charges());
        while self.pool.has_ready() {
            let lending = self.pool.children().lending_runs();
            let cgroups = &self.cgroups;
            let ready = |w: &Waiting| cgroups.has_for(w.charged_to.as_ref());
            let (network, spans) = (&self.network, &self.spans);
            let next = self.backlog.next(ready, &lending, network, spans, replies);
            let Some(mut waiting) = next else {
                self.backlog.disks().top_up(&mut self.pool);
                return;
            };
            let warm = self
                .backlog
                .disks()
                .take_warm(&waiting, self.pool.children());
            let Some(child) = warm.or_else(|| self.pool.take_ready(waiting.is_bash())) else {
                self.backlog.push_front(waiting);
                return;
            };
            let opened = self.backlog.open_session(child, &mut waiting, now);
            if waiting.session.is_some() {
                self.pool.children_mut().count_session_usage(child);
            }
            if let Some((key, ends)) = opened {
                self.lifetime_set(&key, Some(ends));
            }
            self.backlog.disks().warm_for(&waiting, &mut self.pool);
            if warm.is_some() || !waiting.needs_disks() {
                self.start(child, waiting, replies, now);
                continue;
            }
            let pidfd = self.pool.children().pidfd(child);
            if let Some(gone) = self.backlog.give_disks(child, pidfd, waiting, replies) {
                self.child_gone(gone, replies);
            }
        }
    }

    /// Starts the next queued order of a session whose child is free. A
    /// restore gives the session a fresh child first: the old one goes, and
    /// the restore waits first in line for another, carrying the session.
    pub(super) fn serve_session(
        &mut self,
        key: &SessionKey,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let children = self.pool.children();
        let lending = children.lending_runs();
        let alive = |child| children.is_alive(child);
        let (network, spans) = (&self.network, &self.spans);
        let next = self
            .backlog
            .next_for_session(key, alive, &lending, network, spans, replies);
        let Some(waiting) = next else {
            return;
        };
        let fresh = waiting.carried.is_some() || waiting.given_disk;
        if matches!(waiting.order, Order::Restore { .. }) && !fresh {
            if let Some(child) = self.backlog.begin_restore(key, waiting) {
                self.pool.children().kill_quietly(child);
                self.drop_child(child);
                self.dispatch(replies, now);
            }
            return;
        }
        if let Some(child) = self.backlog.begin(key, now) {
            self.start(child, waiting, replies, now);
        }
    }

    /// Sends a request to a child (a session's keeps it for more). A run
    /// counts against its owner's share until it ends.
    pub(super) fn start(
        &mut self,
        child: usize,
        waiting: Waiting,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let reply_to = waiting.reply_to;
        let with = Launch {
            network: &self.network,
            cgroups: &mut self.cgroups,
            caps: &self.caps,
        };
        match self.pool.launch(child, waiting, with, now) {
            None => {}
            Some(Ok(launched)) => {
                if let Some(share) = launched.holds {
                    self.backlog.started(share);
                }
                let (deadline, started) = (now + launched.timeout, now);
                let wake = Wake::Timeout { child, started };
                self.timers.schedule(deadline, wake);
                self.finish_if_done(child, replies, now);
            }
            Some(Err(refusal)) => {
                // Its child (and a session it held) ends, unused.
                replies.push((reply_to, refusal.into()));
                self.child_gone(child, replies);
            }
        }
    }

    /// Answers a run that has ended, and lets its child go — unless a
    /// session keeps it. Its owner's share has room again: what waited
    /// for that room starts, sessions' queued runs and the queues each
    /// first in turn, so neither can keep the room from the other.
    pub(super) fn finish_if_done(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(done) = self.pool.finish(child, now) else {
            return;
        };
        let holds = done.holds;
        self.finish_order(child, done, replies, now);
        let Some(share) = holds else {
            return;
        };
        self.backlog.ended(share);
        let sessions_first = self.backlog.sessions_turn();
        if !sessions_first {
            self.dispatch(replies, now);
        }
        for key in self.backlog.sessions_waiting() {
            self.serve_session(&key, replies, now);
        }
        if sessions_first {
            self.dispatch(replies, now);
        }
    }

    /// The reply to a finished order, and what becomes of its child.
    pub(super) fn finish_order(
        &mut self,
        child: usize,
        done: Done,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let key = self.backlog.session_of(child);
        let finished = done.finished;
        let ran_code = matches!(finished.order, Order::Run);
        let bytes = finished.workspace_bytes;
        if let Some(span) = done.span {
            self.spans.ended(span, &finished.reply);
        }
        let reply_to = finished.reply_to;
        let reply = match &key {
            Some(key) => self.backlog.answer(key, finished),
            // A template build's reply waits for the template.
            None => match self
                .backlog
                .disks()
                .build_ran(child, reply_to, finished.reply)
            {
                Some(reply) => Some(reply.into()),
                None => return self.drop_child(child),
            },
        };
        // A snapshot's goes once the kernel has stored it.
        replies.extend(reply.map(|reply| (reply_to, reply)));
        let Some(key) = key else {
            return self.drop_child(child);
        };
        if !done.alive {
            self.backlog.session_died(&key, replies);
            self.forget_lifetime_if_gone(&key);
            return self.drop_child(child);
        }
        if self.backlog.session_of(child).is_none() {
            // The kernel's own hibernation of it failed: the session let
            // it go at its answer (see [`Backlog::not_hibernated`]).
            self.pool.children().kill_quietly(child);
            self.drop_child(child);
            return self.dispatch(replies, now);
        }
        if let Err(err) = self.pool.keep(child, &self.cgroups) {
            log::warn!("exec session: cannot watch its output: {err}");
            self.backlog.end_session(&key);
            return self.drop_child(child);
        }
        if let Some(idle_at) = self.backlog.order_ended(&key, ran_code, bytes, now) {
            let (key, last_used) = (key.clone(), now);
            self.timers
                .schedule(idle_at, Wake::SessionIdle { key, last_used });
        }
        self.serve_session(&key, replies, now);
    }

    /// A session's child has handed over its next run's pipes: watched,
    /// they let the session's next run start.
    pub(super) fn renewed(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(key) = self.backlog.session_of(child) else {
            return self.drop_child(child);
        };
        if let Err(err) = self.pool.renew(child) {
            log::warn!("exec session: cannot watch its output: {err}");
            return self.child_gone(child, replies);
        }
        self.serve_session(&key, replies, now);
    }

    /// A waiting child went away: a session it held ends with it. If the
    /// memory controller killed it (its agent's runs and sessions together
    /// went over the agent's limit, say), the session's next run is told.
    pub(super) fn child_gone(&mut self, child: usize, replies: &mut Vec<Reply>) {
        if let Some(key) = self.backlog.session_of(child) {
            if self.pool.children().was_oom_killed(child) {
                self.backlog.note_lost(&key);
            }
            self.end_interpreter(&key, replies);
        }
        self.drop_child(child);
    }

    /// Lets a child go; the share its run held has room again.
    pub(super) fn drop_child(&mut self, child: usize) {
        self.backlog.disks().child_dropped(child);
        if let Some(share) = self.pool.drop_child(child, &self.cgroups) {
            self.backlog.ended(share);
        }
    }

    /// PAUSE (`frozen`) or RESUME of session `key`: its interpreter's
    /// freezer, to wait on (see [`Backlog::freeze`]). Resumed, what waited
    /// for it starts.
    pub(super) fn freeze_session(
        &mut self,
        key: &SessionKey,
        frozen: bool,
        replies: &mut Vec<Reply>,
    ) -> Result<Freezer, ErrorReply> {
        let (now, children) = (Instant::now(), self.pool.children_mut());
        let freezer =
            (self.backlog).freeze(key, frozen, |child| children.freeze(child, frozen, now))?;
        self.serve_session(key, replies, now);
        Ok(freezer)
    }

    /// Sets session `key`'s lifetime from now, or clears it (`op:
    /// lifetime`; see [`lifetimes::set_lifetime`]): when it ends now. A
    /// session waiting to be restored or opened is `busy`: what opens it
    /// would undo the change.
    pub(super) fn set_lifetime(
        &mut self,
        key: &SessionKey,
        lifetime: Option<Lifetime>,
    ) -> Result<Option<Ends>, ErrorReply> {
        if self.backlog.is_opening(key) {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "session {:?} is being opened or restored; retry once it is",
                    key.1
                ),
            ));
        }
        let (sessions, disks) = self.backlog.sessions_and_disks();
        let ends = lifetimes::set_lifetime(key, lifetime, SystemTime::now(), sessions, disks)?;
        self.lifetime_set(key, ends);
        Ok(ends)
    }

    /// Session `key`'s lifetime ends at `ends` (at once, if that has
    /// passed), or (`None`) it has none.
    pub(super) fn lifetime_set(&mut self, key: &SessionKey, ends: Option<Ends>) {
        self.lifetimes.set(key, ends.map(|ends| ends.at_ms));
    }

    /// Session `key`'s interpreter ends: a session without a disk is gone
    /// with it, and so is its lifetime.
    fn forget_lifetime_if_gone(&mut self, key: &SessionKey) {
        if self.backlog.disks().store.stored.record(key).is_none() {
            self.lifetimes.set(key, None);
        }
    }

    /// Ends session `key` (`op: close`, or its lifetime's end): its
    /// interpreter and its files go; a run of it still going is killed.
    /// Whether there was one.
    pub(super) fn close(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) -> bool {
        self.lifetimes.set(key, None);
        let had_disk = self.backlog.disks().store.remove(key);
        self.end_interpreter(key, replies) || had_disk
    }

    /// A hibernation of session `key` waits in its queue: a paused session
    /// is let go, for its interpreter to pickle its globals (a refused
    /// hibernation, never queued, leaves it paused); another is served.
    pub(super) fn let_go_to_hibernate(
        &mut self,
        key: &SessionKey,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        if self.backlog.is_paused(key) {
            // Resuming serves it.
            drop(self.freeze_session(key, false, replies));
        } else {
            self.serve_session(key, replies, now);
        }
    }

    /// Ends session `key`'s interpreter (a run of it still going is
    /// killed); its disk, if it has one, stays. Whether it had one.
    pub(super) fn end_interpreter(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) -> bool {
        self.forget_lifetime_if_gone(key);
        match self.backlog.close(key, replies) {
            Closed::Nothing => false,
            Closed::Restoring => true,
            Closed::Open(child) => {
                // A run of it still going is answered first; its child
                // goes then.
                if self.pool.children_mut().close(child) {
                    self.drop_child(child);
                }
                true
            }
        }
    }
}
