//! An owner's work ends with it: a run cancelled (a task's), the runs of
//! a connection that closed, everything of an agent or a run that has
//! ended (its runs, sessions and their snapshots, its agent's spare
//! cgroups), and everything at shutdown.

use std::collections::VecDeque;

use agentos_proto::{ErrorCode, ErrorReply};

use super::child::Stage;
use super::order::{Kill, Running};
use super::waiting::{SessionKey, Waiting};
use super::{Exec, HostId};
use crate::address::{Reply, ReplyTo};
use crate::identity::Principal;
use crate::sandbox::runtime::Sandboxes;

impl Exec {
    /// Cancels the run whose reply goes to `reply_to`: one still waiting
    /// for a sandbox is dropped; a running one is killed (SIGKILL to PID 1
    /// of its namespace, so everything it started dies), and its reply
    /// still goes out, saying so. Returns whether there was one.
    pub fn cancel(&mut self, reply_to: ReplyTo, replies: &mut Vec<Reply>) -> bool {
        let mut waiting = self.queues.take_where(|w| w.reply_to == reply_to);
        let queues = self
            .sessions
            .values_mut()
            .map(|session| &mut session.queue)
            // One waiting in a restored session's queue, carried by the
            // restore.
            .chain(
                self.queues
                    .iter_mut()
                    .filter_map(|w| w.carried.as_mut().map(|c| &mut c.queue)),
            );
        for queue in queues {
            let (gone, kept): (VecDeque<Waiting>, VecDeque<Waiting>) = std::mem::take(queue)
                .into_iter()
                .partition(|w| w.reply_to == reply_to);
            *queue = kept;
            waiting.extend(gone);
        }
        let mut found = !waiting.is_empty();
        // Answered (to no one who waits) all the same: the answer is what
        // tells the kernel the run is over.
        let cancelled = ErrorReply::new(ErrorCode::Unavailable, "the run was cancelled");
        for waiting in waiting {
            self.answer_waiting(waiting, &cancelled, replies);
        }
        for (_, run) in self.children.iter_mut() {
            if matches!(&run.stage, Stage::Running(r) if r.reply_to == reply_to) {
                run.kill(Kill::Cancelled);
                found = true;
            }
        }
        found
    }

    /// A connection closed: the runs it asked for end with it — those
    /// waiting are answered (to no one) at once, those running are killed.
    pub fn connection_closed(&mut self, serial: u64, replies: &mut Vec<Reply>) {
        let of_it = |to: &ReplyTo| to.connection() == Some(serial);
        self.end_where(
            |w| of_it(&w.reply_to),
            |r| of_it(&r.reply_to),
            "the connection that asked for it closed",
            Kill::Cancelled,
            replies,
        );
    }

    /// `principal` has ended (an agent that exited, was killed or is
    /// restarting; a run whose reply has gone): its waiting and running
    /// runs end, and so do its sessions, with their snapshots. An agent's
    /// spare cgroups go with the cgroup they were made in. Its policy as
    /// NET `set` left it is forgotten: nothing of it waits to start.
    pub fn end_work_of(&mut self, principal: Principal, why: &str, replies: &mut Vec<Reply>) {
        self.end_where(
            |w| w.owner == principal,
            |r| r.of.owner == principal,
            why,
            Kill::OwnerEnded,
            replies,
        );
        let sessions: Vec<String> = self
            .sessions
            .keys()
            .filter(|(owner, _)| *owner == principal)
            .map(|(_, name)| name.clone())
            .collect();
        for name in sessions {
            self.close(principal, &name, replies);
        }
        self.lost_to_memory.retain(|(owner, _)| *owner != principal);
        self.policies_now.remove(&principal);
        if let Principal::Agent { id } = principal {
            self.forget_agent_cgroups(id);
        }
    }

    /// Ends the runs `waiting` or `running` picks: waiting ones are
    /// answered with `why`, running ones killed (their replies say so).
    pub(super) fn end_where(
        &mut self,
        mut waiting: impl FnMut(&Waiting) -> bool,
        running: impl Fn(&Running) -> bool,
        why: &str,
        kill: Kill,
        replies: &mut Vec<Reply>,
    ) {
        let mut ended = self.queues.take_where(&mut waiting);
        for session in self.sessions.values_mut() {
            let (gone, kept): (VecDeque<Waiting>, VecDeque<Waiting>) =
                std::mem::take(&mut session.queue)
                    .into_iter()
                    .partition(&mut waiting);
            session.queue = kept;
            ended.extend(gone);
        }
        for waiting in ended {
            let refusal = ErrorReply::new(
                ErrorCode::Unavailable,
                format!("the run was not started: {why}"),
            );
            self.answer_waiting(waiting, &refusal, replies);
        }
        for (_, child) in self.children.iter_mut() {
            if matches!(&child.stage, Stage::Running(r) if running(r)) {
                child.kill(kill);
            }
        }
    }

    /// Answers a request taken from a queue with `refusal`. A restore that
    /// carries its session takes the session with it: what waited for the
    /// session is answered too, and its snapshots go.
    pub(super) fn answer_waiting(
        &mut self,
        mut waiting: Waiting,
        refusal: &ErrorReply,
        replies: &mut Vec<Reply>,
    ) {
        if let (Some(carried), Some(key)) = (waiting.carried.take(), &waiting.session) {
            self.snapshots.remove(key);
            let ended = ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "session {:?} ended while it was being restored; run again to start a new \
                     one",
                    key.1
                ),
            );
            for queued in carried.queue {
                replies.push((queued.reply_to, ended.clone().into()));
            }
        }
        replies.push((waiting.reply_to, refusal.clone().into()));
    }

    /// The restore waiting for a sandbox that carries session `key`, taken
    /// out of its queue, if there is one.
    pub(super) fn take_restore_of(&mut self, key: &SessionKey) -> Option<Waiting> {
        self.queues
            .take_where(|w| w.carried.is_some() && w.session.as_ref() == Some(key))
            .pop()
    }

    /// Stops taking runs: waiting ones are refused, running ones killed
    /// (their replies still go out), hosts stopped.
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
    ) {
        self.shutting_down = true;
        let waiting = self.queues.take_where(|_| true);
        // A restore waiting for its sandbox carries its session's queue.
        let carried = waiting
            .iter()
            .flat_map(|w| w.carried.iter().flat_map(|c| c.queue.iter()));
        for reply_to in waiting.iter().chain(carried).map(|w| w.reply_to) {
            let refusal = ErrorReply::new(ErrorCode::Unavailable, "the kernel is shutting down");
            replies.push((reply_to, refusal.into()));
        }
        for (_, run) in self.children.iter_mut() {
            if matches!(run.stage, Stage::Running(_)) {
                run.kill(Kill::Shutdown);
            }
        }
        for (_, host) in self.hosts.iter() {
            if let Some(sandbox) = host.sandbox {
                sandboxes.signal(sandbox, libc::SIGKILL);
            }
        }
    }

    /// Last step of shutdown (may block briefly): the runs' cgroups are
    /// removed, and whatever is left in them killed.
    pub fn finish_shutdown(&mut self) {
        let Some(mut cgroups) = self.run_cgroups.take() else {
            return;
        };
        for (_, host) in self.hosts.iter_mut() {
            host.cgroups.drain().for_each(|(_, c)| cgroups.recycle(c));
        }
        for (_, child) in self.children.iter_mut() {
            child.cgroups().for_each(|c| cgroups.recycle(c));
        }
        for (_, agent) in self.agent_cgroups.drain() {
            agent.spare.into_iter().for_each(|c| cgroups.recycle(c));
        }
        cgroups.finish();
    }
}
