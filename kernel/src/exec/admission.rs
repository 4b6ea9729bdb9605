//! Who may wait for a run child, and who may go past their cap: the
//! caps on waiting requests (per owner, in all, and the room kept for
//! operators) and on sessions, what a session's runs must all ask, the
//! runs that lend their place to a run of their own, and a request's
//! deadline while it waits.

use std::collections::HashSet;
use std::time::Instant;

use agentos_proto::{ErrorCode, ErrorReply};

use super::child::Stage;
use super::queues::Share;
use super::waiting::{RunAsk, SessionKey};
use super::{Exec, Wake, MAX_WAITING, MAX_WAITING_PER_OWNER, OPERATOR_WAITING};
use crate::address::ReplyTo;
use crate::identity::Principal;

impl Exec {
    /// Whether one more request of `share` may wait: at most
    /// [`MAX_WAITING_PER_OWNER`] of one owner's, [`MAX_WAITING`] in all, of
    /// which agents leave [`OPERATOR_WAITING`] to operators.
    pub(super) fn may_wait(&self, share: Share) -> Result<(), ErrorReply> {
        let waiting = self
            .queues
            .iter()
            .chain(self.sessions.values().flat_map(|s| s.queue.iter()));
        let (mut own, mut agents, mut all) = (0, 0, 0);
        for w in waiting {
            own += usize::from(w.share == share);
            agents += usize::from(matches!(w.share, Share::Tree(_)));
            all += 1;
        }
        let room_for_agents = MAX_WAITING - OPERATOR_WAITING;
        let full = own >= MAX_WAITING_PER_OWNER
            || all >= MAX_WAITING
            || (matches!(share, Share::Tree(_)) && agents >= room_for_agents);
        if full {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "{all} runs are waiting for a sandbox, {own} of them yours (at most \
                     {MAX_WAITING_PER_OWNER} of one owner's); retry later"
                ),
            ));
        }
        Ok(())
    }

    /// The runs that have a run of their own going (each may lend its place
    /// to one at a time).
    pub(super) fn lending_runs(&self) -> HashSet<u64> {
        self.children
            .iter()
            .filter_map(|(_, child)| match &child.stage {
                Stage::Running(running) => match running.of.owner {
                    Principal::Run { number } => Some(number),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// What the run waiting to open session `key` asked of its connection,
    /// or a restore carrying it holds.
    pub(super) fn opening_grant(&self, key: &SessionKey) -> Option<RunAsk> {
        self.queues
            .iter()
            .find(|w| w.session.as_ref() == Some(key))
            .map(|w| match &w.carried {
                Some(carried) => carried.grant.clone(),
                None => RunAsk::of(&w.request),
            })
    }

    /// Whether `owner` may open one more session: sessions open, and those
    /// a waiting run will open, count against its cap and the kernel's.
    pub(super) fn may_open_session(&self, owner: Principal) -> Result<(), ErrorReply> {
        let mut keys: HashSet<&SessionKey> = self.sessions.keys().collect();
        keys.extend(self.queues.iter().filter_map(|w| w.session.as_ref()));
        let held = keys.iter().filter(|(o, _)| *o == owner).count();
        if held >= self.max_sessions {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you hold {held} sessions, the most exec.max_sessions allows; close \
                     one ({{\"op\":\"close\"}}) first"
                ),
            ));
        }
        if keys.len() >= self.max_sessions_total {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "the kernel holds {} sessions, the most exec.max_sessions_total allows; \
                     retry later",
                    keys.len()
                ),
            ));
        }
        Ok(())
    }

    /// A request that could not start at once is answered at its deadline
    /// if it is still waiting then.
    pub(super) fn expire_if_still_waiting(&mut self, reply_to: ReplyTo, deadline: Instant) {
        let waiting = self
            .queues
            .iter()
            .chain(self.sessions.values().flat_map(|s| s.queue.iter()))
            .any(|w| w.reply_to == reply_to);
        if waiting {
            self.timers.schedule(deadline, Wake::WaitedTooLong);
        }
    }
}
