//! Sessions: a run child kept for its owner with its interpreter state and
//! `/workspace` ([`Session`](super::waiting::Session)), the orders queued
//! behind each other for it — runs, snapshots and restores — and the
//! requests that waited too long for any child.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{
    ExecReply, ExecRequest, RestoredReply, SessionInfo, SnapshotInfo, SnapshotReply,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::child::{RunChild, Stage};
use super::order::{Finished, Kill, Order};
use super::snapshots;
use super::waiting::{Carried, Session, SessionKey, Waiting};
use super::{Exec, RunCaller};
use crate::address::{Answer, Reply, ReplyTo};
use crate::clock::rfc3339;
use crate::identity::Principal;

impl Exec {
    /// The owner's sessions (`op: sessions`).
    pub fn sessions(&self, owner: Principal) -> Vec<SessionInfo> {
        let mut mine: Vec<(&SessionKey, &Session)> = self
            .sessions
            .iter()
            .filter(|((o, _), _)| *o == owner)
            .collect();
        mine.sort_by_key(|((_, name), session)| (session.created_at, name.clone()));
        mine.into_iter()
            .map(|((_, name), session)| SessionInfo {
                session: name.clone(),
                created_at: rfc3339(session.created_at),
                last_used_at: rfc3339(session.last_used_at),
                runs: session.runs,
                workspace_bytes: self
                    .children
                    .get(session.child)
                    .and_then(|c| c.workspace_bytes)
                    .unwrap_or(0),
            })
            .collect()
    }

    /// Ends a session (`op: close`): its interpreter and /workspace go;
    /// a run of it still going is killed. Whether there was one.
    pub fn close(&mut self, owner: Principal, name: &str, replies: &mut Vec<Reply>) -> bool {
        let key = (owner, name.to_owned());
        self.snapshots.remove(&key);
        // A session being restored waits in its restore, for a sandbox.
        if let Some(restore) = self.take_restore_of(&key) {
            let closed = ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {name:?} was closed before it was restored"),
            );
            self.answer_waiting(restore, &closed, replies);
            return true;
        }
        let Some(session) = self.sessions.remove(&key) else {
            return false;
        };
        for waiting in session.queue {
            let refusal = ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {name:?} was closed before this run could start"),
            );
            replies.push((waiting.reply_to, refusal.into()));
        }
        if let Some(child) = self.children.get_mut(session.child) {
            child.kill(Kill::Closed);
            if !matches!(child.stage, Stage::Running(_)) {
                self.drop_child(session.child);
            }
        }
        true
    }

    /// Answers `timeout` to requests that waited past their deadline, saying
    /// why they waited: behind other work (their owner's share was full, or
    /// every sandbox was busy), or for an exec host that is starting or
    /// failing.
    pub(super) fn expire_waiting(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        let expired = |waiting: &Waiting| waiting.deadline <= now;
        let mut late: Vec<Waiting> = self.queues.take_where(expired);
        for session in self.sessions.values_mut() {
            let (gone, kept): (VecDeque<Waiting>, VecDeque<Waiting>) =
                std::mem::take(&mut session.queue)
                    .into_iter()
                    .partition(expired);
            session.queue = kept;
            late.extend(gone);
        }
        let hosts_up = self.hosts.iter().any(|(_, host)| host.channel.is_some());
        let running = self
            .children
            .iter()
            .filter(|(_, child)| matches!(child.stage, Stage::Running(_)))
            .count();
        for mut waiting in late {
            // A restore that never got its sandbox ends its session: what
            // the session carried is answered, its snapshots deleted.
            if let (Some(carried), Some(key)) = (waiting.carried.take(), &waiting.session) {
                self.snapshots.remove(key);
                for queued in carried.queue {
                    let ended = ErrorReply::new(
                        ErrorCode::NotFound,
                        format!(
                            "session {:?} ended: restoring it found no sandbox within its \
                             timeout",
                            key.1
                        ),
                    );
                    replies.push((queued.reply_to, ended.clone().into()));
                }
            }
            let waited = now.saturating_duration_since(waiting.queued_at).as_millis();
            let why = if !hosts_up || running == 0 {
                format!(
                    "no sandbox was ready for this run within its timeout ({waited} ms); the \
                     exec host is starting or failing (see the kernel's log)"
                )
            } else {
                let caps = self.queues.caps();
                format!(
                    "the run waited {waited} ms, its whole timeout, queued behind other work: \
                     {running} runs were running, {} of them yours (exec.max_running_per_owner \
                     is {}), and {} more waited; retry, or give it a longer timeout_ms",
                    self.queues.held_by(waiting.share),
                    caps.per_owner,
                    self.queues.len()
                )
            };
            let reply = ExecReply {
                timed_out: true,
                error: Some(why),
                code: Some(ErrorCode::Timeout),
                ..Default::default()
            };
            replies.push((waiting.reply_to, reply.into()));
        }
    }

    /// Starts the next queued run of a session whose child is free (a
    /// run refused as it starts leaves it free for the one after).
    pub(super) fn serve_session(
        &mut self,
        key: &SessionKey,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        loop {
            let lending = self.lending_runs();
            let Some(session) = self.sessions.get_mut(key) else {
                return;
            };
            if session.busy
                || !self
                    .children
                    .get(session.child)
                    .is_some_and(RunChild::is_alive)
            {
                return;
            }
            // A run of it counts against its owner's share; it waits for room.
            let Some(head) = session.queue.front() else {
                return;
            };
            let lent = head.is_lent(&lending);
            if matches!(head.order, Order::Run) && !self.queues.has_room(head.share, lent) {
                return;
            }
            let Some(mut waiting) = session.queue.pop_front() else {
                return;
            };
            if let Err(narrowed) = self.network_at_start(&mut waiting) {
                self.refuse_at_start(waiting, narrowed, replies);
                continue;
            }
            if matches!(waiting.order, Order::Restore { .. }) && waiting.carried.is_none() {
                return self.begin_restore(key, waiting, replies, now);
            }
            let Some(session) = self.sessions.get_mut(key) else {
                return;
            };
            session.busy = true;
            session.last_used = now;
            session.last_used_at = SystemTime::now();
            let child = session.child;
            return self.start(child, waiting, replies, now);
        }
    }
}

impl Exec {
    /// `op: snapshot`: queued behind the session's runs; answered once the
    /// session's child has written it.
    pub fn snapshot(
        &mut self,
        caller: RunCaller,
        session: &str,
        name: &str,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let key = (caller.principal, session.to_owned());
        self.live_session(&key)?;
        self.snapshots.room_for(&key, name)?;
        let data = snapshots::memfd().map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot make room for the snapshot: {err}"),
            )
        })?;
        let order = Order::Snapshot {
            name: name.to_owned(),
            data,
        };
        self.queue_for_session(key, caller, order, reply_to, replies)
    }

    /// `op: restore`: queued behind the session's runs; then the session
    /// gets a fresh interpreter whose `/workspace` is the snapshot's.
    pub fn restore(
        &mut self,
        caller: RunCaller,
        session: &str,
        name: &str,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let key = (caller.principal, session.to_owned());
        self.live_session(&key)?;
        let snapshot = self.snapshots.data(&key, name).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {session:?} has no snapshot named {name:?}"),
            )
        })?;
        let data = snapshot.try_clone().map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot read the snapshot: {err}"),
            )
        })?;
        self.queue_for_session(key, caller, Order::Restore { data }, reply_to, replies)
    }

    /// `op: snapshots`: a session's snapshots, oldest first.
    pub fn snapshots(
        &self,
        owner: Principal,
        session: &str,
    ) -> Result<Vec<SnapshotInfo>, ErrorReply> {
        let key = (owner, session.to_owned());
        self.live_session(&key)?;
        Ok(self.snapshots.list(&key))
    }

    fn live_session(&self, key: &SessionKey) -> Result<(), ErrorReply> {
        if self.sessions.contains_key(key) {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!("no session {:?} (a run with `session` opens one)", key.1),
        ))
    }

    fn queue_for_session(
        &mut self,
        key: SessionKey,
        caller: RunCaller,
        order: Order,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let now = Instant::now();
        let limits = self.run_limits(&caller, None)?;
        self.may_wait(caller.share)?;
        let waiting = Waiting {
            request: ExecRequest {
                session: Some(key.1.clone()),
                ..ExecRequest::default()
            },
            reply_to,
            owner: caller.principal,
            share: caller.share,
            run: None,
            charged_to: caller.charged_to,
            limits,
            timeout: self.default_timeout,
            deadline: now + self.default_timeout,
            session: Some(key.clone()),
            order,
            carried: None,
            queued_at: now,
            policy: None,
            net_record: None,
            span: None,
        };
        if let Some(session) = self.sessions.get_mut(&key) {
            session.queue.push_back(waiting);
        }
        self.serve_session(&key, replies, now);
        Ok(())
    }

    /// A restore's turn has come: the session's child goes, and the
    /// restore waits first in line for a fresh one, carrying the session.
    pub(super) fn begin_restore(
        &mut self,
        key: &SessionKey,
        mut waiting: Waiting,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let Some(session) = self.sessions.remove(key) else {
            return;
        };
        if let Some(child) = self.children.get(session.child) {
            child.kill_quietly();
        }
        self.drop_child(session.child);
        waiting.carried = Some(Carried {
            created_at: session.created_at,
            runs: session.runs,
            queue: session.queue,
            grant: session.grant,
        });
        self.queues.push_front(waiting.share, waiting);
        self.dispatch(replies, now);
    }

    /// The reply to a finished order of a session's: a run's is its own,
    /// a snapshot's or restore's says what was saved or restored.
    pub(super) fn snapshot_reply(&mut self, key: &SessionKey, finished: Finished) -> Answer {
        let failure = match (&finished.reply.exit_code, &finished.reply.error) {
            (Some(0), None) => None,
            (_, Some(error)) => Some(error.clone()),
            (_, None) => Some("the session's interpreter ended before it was done".to_owned()),
        };
        match finished.order {
            Order::Run => finished.reply.into(),
            Order::Restore { .. } => match failure {
                None => Answer::json(&RestoredReply {
                    success: true,
                    left_out: finished.left_out,
                }),
                Some(error) => ErrorReply::new(ErrorCode::Internal, error).into(),
            },
            Order::Snapshot { name, data } => {
                let bytes = finished.snapshot_bytes.unwrap_or(0);
                let taken = match failure {
                    None => self.snapshots.keep(key, name, data, bytes),
                    Some(error) => Err(ErrorReply::new(ErrorCode::Internal, error)),
                };
                match taken {
                    Ok(snapshot) => Answer::json(&SnapshotReply {
                        success: true,
                        snapshot,
                        left_out: finished.left_out,
                    }),
                    Err(err) => err.into(),
                }
            }
        }
    }
}
