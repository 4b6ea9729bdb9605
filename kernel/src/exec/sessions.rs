//! Sessions: a run child kept for its owner with its interpreter state and
//! /workspace, the runs queued behind each other for it, and the requests
//! that waited too long for any child.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{ExecRequest, RunPermissions, SessionInfo};
use agentos_proto::{ErrorCode, ErrorReply};

use super::run::{Kill, RunChild, Stage, Work};
use super::{Exec, Waiting};
use crate::address::Reply;
use crate::clock::rfc3339;
use crate::identity::Principal;

/// A session by its owner (an agent, an operator's uid, or a run) and name.
pub(super) type SessionKey = (Principal, String);

/// What a run asked for its own kernel connection: a session's runs must
/// all ask the same, for what one run leaves running in the interpreter
/// (a thread) lives on into the next and could use its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RunAsk {
    permissions: Option<RunPermissions>,
    network: Option<bool>,
}

impl RunAsk {
    /// What `request` asks.
    pub(super) fn of(request: &ExecRequest) -> RunAsk {
        RunAsk {
            permissions: request.permissions.clone(),
            network: request.network,
        }
    }
}

/// A session: a run child kept with its interpreter and /workspace.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) child: usize,
    pub(super) created_at: SystemTime,
    pub(super) last_used_at: SystemTime,
    pub(super) last_used: Instant,
    pub(super) runs: u64,
    /// Requests waiting for its child, oldest first.
    pub(super) queue: VecDeque<Waiting>,
    /// A run of it is going.
    pub(super) busy: bool,
    /// What the run that opened it asked for its connection.
    pub(super) grant: RunAsk,
}

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
            let reply = agentos_proto::payload::ExecReply {
                timed_out: true,
                error: Some(why),
                code: Some(ErrorCode::Timeout),
                ..Default::default()
            };
            replies.push((waiting.reply_to, reply.into()));
        }
    }

    /// Starts the next queued run of a session whose child is free.
    pub(super) fn serve_session(
        &mut self,
        key: &SessionKey,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
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
        if matches!(head.work, Work::Run) && !self.queues.has_room(head.share, lent) {
            return;
        }
        let Some(waiting) = session.queue.pop_front() else {
            return;
        };
        if matches!(waiting.work, Work::Restore { .. }) && waiting.carried.is_none() {
            return self.begin_restore(key, waiting, replies, now);
        }
        session.busy = true;
        session.last_used = now;
        session.last_used_at = SystemTime::now();
        let child = session.child;
        self.start(child, waiting, replies, now);
    }
}
