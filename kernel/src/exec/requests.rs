//! Requests waiting for a run child in their owners' queues ([`Queues`],
//! served in turn), with the caps on how many may wait, and the turn that
//! sessions' queued runs and these queues take when room comes. A restore
//! whose turn has come waits here too, first in its owner's line, carrying
//! its session.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use agentos_proto::payload::ExecReply;
use agentos_proto::{ErrorCode, ErrorReply};

use super::queues::{Caps, Queues, Share};
use super::waiting::{RunAsk, SessionKey, Waiting};

/// Requests that may wait for a run child, from everyone; beyond this,
/// `busy`.
const MAX_WAITING: usize = 1024;
/// Of those, from one owner (its sessions' queues included)...
const MAX_WAITING_PER_OWNER: usize = 256;
/// ...and kept for operators: agents cannot fill the queues.
const OPERATOR_WAITING: usize = 256;

/// The owners' queues of requests.
#[derive(Debug)]
pub struct Requests {
    queues: Queues<Waiting>,
    /// Whether sessions' queued runs were served before the queues last
    /// time room came (the two take turns).
    sessions_first: bool,
}

impl Requests {
    /// Empty queues with these caps on the runs owners hold.
    pub fn new(caps: Caps) -> Requests {
        Requests {
            queues: Queues::new(caps),
            sessions_first: false,
        }
    }

    /// Whether one more request of `share` may wait, with `in_sessions`
    /// queued for sessions: at most [`MAX_WAITING_PER_OWNER`] of one
    /// owner's, [`MAX_WAITING`] in all, of which agents leave
    /// [`OPERATOR_WAITING`] to operators.
    pub fn may_wait<'a>(
        &'a self,
        share: Share,
        in_sessions: impl Iterator<Item = &'a Waiting>,
    ) -> Result<(), ErrorReply> {
        let (mut own, mut agents, mut all) = (0, 0, 0);
        for w in self.queues.iter().chain(in_sessions) {
            own += usize::from(w.share.held_as() == share.held_as());
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

    /// What the run waiting to open session `key` asked of its connection,
    /// or a restore carrying it holds.
    pub fn opening_grant(&self, key: &SessionKey) -> Option<RunAsk> {
        self.queues
            .iter()
            .find(|w| w.session.as_ref() == Some(key))
            .map(|w| match &w.carried {
                Some(carried) => carried.grant.clone(),
                None => RunAsk::of(&w.request),
            })
    }

    /// The sessions waiting requests will open (or restores carry).
    pub fn sessions(&self) -> impl Iterator<Item = &SessionKey> {
        self.queues.iter().filter_map(|w| w.session.as_ref())
    }

    /// Every request waiting.
    pub fn iter(&self) -> impl Iterator<Item = &Waiting> {
        self.queues.iter()
    }

    /// Queues `waiting` last in its owner's line.
    pub fn push_back(&mut self, waiting: Waiting) {
        self.queues.push_back(waiting.share, waiting);
    }

    /// Queues `waiting` first in its owner's line (work that was under way
    /// already).
    pub fn push_front(&mut self, waiting: Waiting) {
        self.queues.push_front(waiting.share, waiting);
    }

    /// The next request to start, owner by owner in turn, each within its
    /// share: one `ready` accepts, or that may go past its owner's cap (a
    /// run's own run, while `lending` has none of that run's going).
    pub fn next(
        &mut self,
        ready: impl FnMut(&Waiting) -> bool,
        lending: &HashSet<u64>,
    ) -> Option<Waiting> {
        let (_, waiting) = self.queues.next(ready, |w| w.is_lent(lending))?;
        Some(waiting)
    }

    /// Whether `waiting` has room to start: not a run, or a run its owner's
    /// share has room for.
    pub fn has_room(&self, waiting: &Waiting, lending: &HashSet<u64>) -> bool {
        !waiting.holds_share()
            || self
                .queues
                .has_room(waiting.share, waiting.is_lent(lending))
    }

    /// A run of `share` has started: it holds its place until it ends.
    pub fn started(&mut self, share: Share) {
        self.queues.started(share);
    }

    /// A run of `share` has ended.
    pub fn ended(&mut self, share: Share) {
        self.queues.ended(share);
    }

    /// Takes every waiting request `pick` picks.
    pub fn take_where(&mut self, pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        self.queues.take_where(pick)
    }

    /// Takes the requests that `pick` picks from the sessions waiting
    /// restores carry.
    pub fn take_carried(&mut self, mut pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        let mut taken = Vec::new();
        for carried in self.queues.iter_mut().filter_map(|w| w.carried.as_mut()) {
            let (gone, kept): (VecDeque<Waiting>, VecDeque<Waiting>) =
                std::mem::take(&mut carried.queue)
                    .into_iter()
                    .partition(&mut pick);
            carried.queue = kept;
            taken.extend(gone);
        }
        taken
    }

    /// The restore waiting for a sandbox that carries session `key`, taken
    /// out of its queue, if there is one.
    pub fn take_restore_of(&mut self, key: &SessionKey) -> Option<Waiting> {
        self.queues
            .take_where(|w| w.carried.is_some() && w.session.as_ref() == Some(key))
            .pop()
    }

    /// Whose turn it is when room comes: sessions' queued runs (`true`) or
    /// these queues. The two take turns, so neither can keep the room from
    /// the other.
    pub fn sessions_turn(&mut self) -> bool {
        self.sessions_first = !self.sessions_first;
        self.sessions_first
    }

    /// The reply to `waiting`, which waited past its deadline, saying why
    /// it waited: behind other work (its owner's share was full, or every
    /// sandbox was busy: `running` orders were going), or for an exec host
    /// that is starting or failing (none `hosts_up`).
    pub fn waited_too_long(
        &self,
        waiting: &Waiting,
        hosts_up: bool,
        running: usize,
        now: Instant,
    ) -> ExecReply {
        let waited = now.saturating_duration_since(waiting.queued_at).as_millis();
        let why = if !hosts_up || running == 0 {
            format!(
                "no sandbox was ready for this run within its timeout ({waited} ms); the \
                 exec host is starting or failing (see the kernel's log)"
            )
        } else {
            format!(
                "the run waited {waited} ms, its whole timeout, queued behind other work: \
                 {running} runs were running, {} of them yours (exec.max_running_per_owner \
                 is {}), and {} more waited; retry, or give it a longer timeout_ms",
                self.queues.held_by(waiting.share),
                self.queues.caps().per_owner,
                self.queues.len()
            )
        };
        ExecReply {
            timed_out: true,
            error: Some(why),
            code: Some(ErrorCode::Timeout),
            ..Default::default()
        }
    }
}
