//! Sessions: a run child kept for its owner with its interpreter state and
//! `/workspace` ([`Session`]), and the orders queued behind each other for
//! it — runs, snapshots and restores — one going at a time; each owner's
//! and the kernel's caps on them; an idle session's end; and the sessions
//! the memory controller ended while they waited, until their owners are
//! told. (Its snapshots lie on disk, with its disk: `disks`.)

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{
    ExecReply, ExecRequest, ProcDoneReply, RestoredReply, SessionInfo, SessionOpenedReply,
    SessionPauseReply, SessionState, SessionUsage,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::disks::SessionRecord;
use super::order::{Finished, Order};
use super::session_meta::{Ends, SessionMeta};
use super::waiting::{refuse_each, Carried, RunAsk, RunCaller, Session, SessionKey, Waiting};
use crate::address::{Answer, Reply};
use crate::cgroup::CgroupLimits;
use crate::clock::rfc3339;
use crate::config::exec::ExecConfig;
use crate::identity::Principal;

/// Whether an idle session hibernates (`exec.idle_hibernate_secs`) before
/// its interpreter would end (`exec.session_idle_secs`).
pub fn hibernates_idle(exec: &ExecConfig) -> bool {
    exec.idle_hibernate_secs != 0 && exec.idle_hibernate_secs <= exec.session_idle_secs
}

/// Sessions lost to the memory controller remembered for their owners.
const MAX_LOST_SESSIONS: usize = 1024;

/// Every open session, by owner and name.
#[derive(Debug)]
pub struct Sessions {
    open: HashMap<SessionKey, Session>,
    /// Sessions whose idle interpreter the memory controller killed, until
    /// their owner names them again and is told (at most
    /// [`MAX_LOST_SESSIONS`] remembered).
    lost_to_memory: HashSet<SessionKey>,
    /// A session unused this long is closed.
    idle: Duration,
    /// Sessions one owner may hold.
    max_per_owner: usize,
    /// Sessions all owners together may hold.
    max_total: usize,
    /// Interpreters sessions have been opened on so far.
    interpreters: u64,
}

impl Sessions {
    /// None yet, with `exec`'s caps and idle time (`hibernate_idle`: an
    /// idle session hibernates, after `exec.idle_hibernate_secs`).
    pub fn new(exec: &ExecConfig, hibernate_idle: bool) -> Sessions {
        Sessions {
            open: HashMap::new(),
            lost_to_memory: HashSet::new(),
            idle: Duration::from_secs(if hibernate_idle {
                exec.idle_hibernate_secs
            } else {
                exec.session_idle_secs
            }),
            max_per_owner: exec.max_sessions,
            max_total: exec.max_sessions_total,
            interpreters: 0,
        }
    }

    /// `owner`'s sessions (`op: sessions`), oldest first; what each
    /// child's `/workspace` holds, and what it uses now, come from
    /// `figures`.
    pub fn list(
        &self,
        owner: Principal,
        figures: impl Fn(usize) -> (u64, Option<SessionUsage>),
    ) -> Vec<SessionInfo> {
        let mut mine: Vec<(&SessionKey, &Session)> =
            self.open.iter().filter(|((o, _), _)| *o == owner).collect();
        mine.sort_by_key(|((_, name), session)| (session.created_at, name.clone()));
        mine.into_iter()
            .map(|((_, name), session)| {
                let (workspace_bytes, usage) = figures(session.child);
                SessionInfo {
                    session: name.clone(),
                    created_at: rfc3339(session.created_at),
                    last_used_at: rfc3339(session.last_used_at),
                    runs: session.runs,
                    workspace_bytes,
                    state: match (session.paused, session.busy) {
                        (true, _) => SessionState::Paused,
                        (false, true) => SessionState::Running,
                        (false, false) => SessionState::Ready,
                    },
                    disk_bytes: None,
                    disk_used_bytes: None,
                    labels: session.meta.labels.clone(),
                    ends_at: session.meta.ends.map(Ends::text),
                    then: session.meta.ends.map(|ends| ends.then),
                    limits: (session.orders_as.as_ref()).map(|(_, limits, _)| limits.stated()),
                    usage,
                }
            })
            .collect()
    }

    /// Whether session `key` is open.
    pub fn contains(&self, key: &SessionKey) -> bool {
        self.open.contains_key(key)
    }

    /// Whether `request` asks of its connection what the run that opened
    /// session `key` asked (or the run about to open it: `opening`): a
    /// session's runs all ask the same.
    pub fn same_grant(
        &self,
        key: &SessionKey,
        opening: impl FnOnce() -> Option<RunAsk>,
        request: &ExecRequest,
    ) -> Result<(), ErrorReply> {
        let opened = self
            .open
            .get(key)
            .map(|open| open.grant.clone())
            .or_else(opening);
        if opened.is_some_and(|grant| grant != RunAsk::of(request)) {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "EXEC field `permissions`: session {:?} was opened by a run that asked \
                     for other permissions (or network, or volumes); its runs must all ask \
                     the same (close it to open one with others)",
                    key.1
                ),
            ));
        }
        Ok(())
    }

    /// Whether `owner` may open one more session: sessions open, and those
    /// waiting runs will open (`to_open`), count against its cap and the
    /// kernel's.
    pub fn may_open<'a>(
        &'a self,
        owner: Principal,
        to_open: impl Iterator<Item = &'a SessionKey>,
    ) -> Result<(), ErrorReply> {
        let mut keys: HashSet<&SessionKey> = self.open.keys().collect();
        keys.extend(to_open);
        // A delegate's count with its operator's: one uid's together.
        let held = keys
            .iter()
            .filter(|(o, _)| o.quota_owner() == owner.quota_owner())
            .count();
        if held >= self.max_per_owner {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you hold {held} sessions, the most exec.max_sessions allows; close \
                     one ({{\"op\":\"close\"}}) first"
                ),
            ));
        }
        if keys.len() >= self.max_total {
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

    /// The reply to a run for session `key` if the memory controller ended
    /// it while it waited. Told once: the run after opens a new session.
    pub fn take_lost(&mut self, key: &SessionKey) -> Option<ExecReply> {
        if !self.lost_to_memory.remove(key) {
            return None;
        }
        Some(ExecReply {
            oom_killed: true,
            error: Some(format!(
                "session {:?} ended while it waited: its interpreter was killed for memory \
                 (the run's limit, or its agent's, which its runs and sessions share); \
                 this run did not start, and the next one starts a fresh interpreter (with \
                 the session's files, where sessions have disks of their own)",
                key.1
            )),
            code: Some(ErrorCode::NotFound),
            session: Some(key.1.clone()),
            ..ExecReply::default()
        })
    }

    /// Session `key`'s idle interpreter was killed for memory: its owner is
    /// told when it names the session again.
    pub fn note_lost(&mut self, key: &SessionKey) {
        if self.lost_to_memory.len() < MAX_LOST_SESSIONS {
            log::debug!(
                "exec session {:?}: its idle interpreter was killed for memory",
                key.1
            );
            self.lost_to_memory.insert(key.clone());
        }
    }

    /// `owner` has ended: nothing of its is to be told.
    pub fn forget_lost_of(&mut self, owner: Principal) {
        self.lost_to_memory.retain(|(o, _)| *o != owner);
    }

    /// The names of `owner`'s sessions.
    pub fn names_of(&self, owner: Principal) -> Vec<String> {
        self.open
            .keys()
            .filter(|(o, _)| *o == owner)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// The session that keeps `child`, if one does.
    pub fn of_child(&self, child: usize) -> Option<SessionKey> {
        self.open
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone())
    }

    /// Opens session `key`, numbering its interpreter: a steward forked
    /// by an earlier one (its end not yet read) is told apart by it.
    pub fn insert(&mut self, key: SessionKey, mut session: Session) {
        self.interpreters += 1;
        session.interpreter = self.interpreters;
        self.open.insert(key, session);
    }

    /// The number of session `key`'s interpreter, while it is open.
    pub fn interpreter_of(&self, key: &SessionKey) -> Option<u64> {
        self.open.get(key).map(|session| session.interpreter)
    }

    /// Ends session `key`'s interpreter: what it was, if it was open (a
    /// restore carries it to a fresh child; a hibernation's queue waits
    /// for one).
    pub fn end(&mut self, key: &SessionKey) -> Option<Session> {
        self.open.remove(key)
    }

    /// Closes session `key` (`op: close`): what waited for it is answered;
    /// its child, to be killed, if it was open.
    pub fn close(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) -> Option<usize> {
        let session = self.end(key)?;
        let refusal = ErrorReply::new(
            ErrorCode::NotFound,
            format!("session {:?} was closed before this run could start", key.1),
        );
        refuse_each(session.queue, &refusal, replies);
        Some(session.child)
    }

    /// A restore carrying session `key` will not run: the session's
    /// interpreter ends with it, and what waited for it is answered that
    /// the session `ended`.
    pub fn drop_carried(
        &mut self,
        key: &SessionKey,
        carried: Carried,
        ended: &str,
        replies: &mut Vec<Reply>,
    ) {
        let ended = ErrorReply::new(ErrorCode::NotFound, format!("session {:?} {ended}", key.1));
        refuse_each(carried.queue, &ended, replies);
    }

    /// The reply to a finished order of session `key`'s: a run's is its
    /// own (the first on a fresh interpreter says so); a restore's says
    /// what it could not load; a snapshot that failed says why (one taken
    /// is answered once the kernel has read its files).
    pub fn answer(&mut self, key: &SessionKey, mut finished: Finished) -> Answer {
        let failure = match (&finished.reply.exit_code, &finished.reply.error) {
            (Some(0), None) => None,
            (_, Some(error)) => Some(error.clone()),
            (_, None) => Some("the session's interpreter ended before it was done".to_owned()),
        };
        match (&finished.order, failure) {
            (Order::Run, _) => {
                if let Some(session) = self.open.get_mut(key) {
                    finished.reply.fresh_interpreter = std::mem::take(&mut session.fresh);
                }
                finished.reply.into()
            }
            (_, Some(error)) => ErrorReply::new(ErrorCode::Internal, error).into(),
            (Order::Open, None) => {
                let session = self.open.get_mut(key);
                let ends = session.as_ref().and_then(|s| s.meta.ends);
                Answer::json(&SessionOpenedReply {
                    success: true,
                    session: key.1.clone(),
                    state: SessionState::Ready,
                    fresh_interpreter: session.is_some_and(|s| std::mem::take(&mut s.fresh)),
                    ends_at: ends.map(Ends::text),
                })
            }
            // Its steward says how it went, on its own socket.
            (Order::Steward { .. }, None) => Answer::json(&ProcDoneReply { success: true }),
            (Order::Wake, None) => Answer::json(&SessionPauseReply {
                success: true,
                session: key.1.clone(),
                state: SessionState::Ready,
                not_saved: finished.left_out,
            }),
            (_, None) => Answer::json(&RestoredReply {
                success: true,
                session: key.1.clone(),
                left_out: finished.left_out,
            }),
        }
    }

    /// What the kernel's own orders to session `key` are held to (see
    /// [`Session::orders_as`]), if it is open.
    pub fn orders_as(&self, key: &SessionKey) -> Option<(RunCaller, CgroupLimits, Duration)> {
        self.open.get(key)?.orders_as.clone()
    }

    /// Session `key`'s child, if it is open.
    pub fn child_of(&self, key: &SessionKey) -> Option<usize> {
        self.open.get(key).map(|session| session.child)
    }

    /// Marks session `key` paused (`paused`) or not.
    pub fn set_paused(&mut self, key: &SessionKey, paused: bool) {
        if let Some(session) = self.open.get_mut(key) {
            session.paused = paused;
        }
    }

    /// Whether session `key` is paused.
    pub fn is_paused(&self, key: &SessionKey) -> bool {
        self.open.get(key).is_some_and(|session| session.paused)
    }

    /// Session `key` stays busy after its order while the kernel reads
    /// its files for a snapshot.
    pub fn hold(&mut self, key: &SessionKey) {
        if let Some(session) = self.open.get_mut(key) {
            session.held = true;
        }
    }

    /// The kernel is done with session `key`'s files: its next order may
    /// start.
    pub fn release(&mut self, key: &SessionKey) {
        if let Some(session) = self.open.get_mut(key) {
            session.held = false;
            session.busy = false;
        }
    }

    /// Puts `waiting` first in session `key`'s queue.
    pub fn queue_front(&mut self, key: &SessionKey, waiting: Waiting) {
        if let Some(session) = self.open.get_mut(key) {
            session.queue.push_front(waiting);
        }
    }

    /// Session `key`'s child has its disk: its orders may start. A session
    /// that was stored (`record`) goes on from where it was, on a fresh
    /// interpreter, which loads `state` first if it is given globals.
    pub fn disk_given(
        &mut self,
        key: &SessionKey,
        record: Option<&SessionRecord>,
        state: Option<OwnedFd>,
    ) {
        let Some(session) = self.open.get_mut(key) else {
            return;
        };
        session.busy = false;
        session.pending_state = state;
        if let Some(record) = record {
            session.created_at = record.created();
            session.runs = record.runs;
            session.fresh = true;
        }
    }

    /// What session `key`'s record is to say now.
    pub fn to_record(&self, key: &SessionKey) -> Option<(u64, SystemTime)> {
        self.open.get(key).map(|s| (s.runs, s.last_used_at))
    }

    /// Queues `waiting` for session `key`, if it is open.
    pub fn queue(&mut self, key: &SessionKey, waiting: Waiting) {
        if let Some(session) = self.open.get_mut(key) {
            session.queue.push_back(waiting);
        }
    }

    /// Whether requests are queued for session `key`.
    pub fn has_queued(&self, key: &SessionKey) -> bool {
        self.open.get(key).is_some_and(|s| !s.queue.is_empty())
    }

    /// Every request queued for a session.
    pub fn queued(&self) -> impl Iterator<Item = &Waiting> {
        self.open.values().flat_map(|s| s.queue.iter())
    }

    /// Takes the requests queued for sessions that `pick` picks.
    pub fn take_queued(&mut self, mut pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        let mut taken = Vec::new();
        for session in self.open.values_mut() {
            let (gone, kept): (VecDeque<Waiting>, VecDeque<Waiting>) =
                std::mem::take(&mut session.queue)
                    .into_iter()
                    .partition(&mut pick);
            session.queue = kept;
            taken.extend(gone);
        }
        taken
    }

    /// Sessions whose child is free and which have orders queued.
    pub fn waiting(&self) -> Vec<SessionKey> {
        self.open
            .iter()
            .filter(|(_, session)| !session.busy && !session.queue.is_empty())
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// The next order queued for session `key`, taken, if the session's
    /// child is free and `alive`, and the order has `room` to start.
    pub fn next(
        &mut self,
        key: &SessionKey,
        alive: impl Fn(usize) -> bool,
        room: impl Fn(&Waiting) -> bool,
    ) -> Option<Waiting> {
        let session = self.open.get_mut(key)?;
        if session.busy || session.paused || !alive(session.child) {
            return None;
        }
        if !room(session.queue.front()?) {
            return None;
        }
        let mut waiting = session.queue.pop_front()?;
        waiting.load_state = session.pending_state.take();
        Some(waiting)
    }

    /// An order of session `key` starts `now`: its child, which is busy
    /// until the order ends.
    pub fn begin(&mut self, key: &SessionKey, now: Instant) -> Option<usize> {
        let session = self.open.get_mut(key)?;
        session.busy = true;
        session.last_used = now;
        session.last_used_at = SystemTime::now();
        Some(session.child)
    }

    /// An order of session `key` has ended `now` (it `ran_code`, or was a
    /// snapshot or restore): when the session is closed if unused until
    /// then.
    pub fn order_ended(
        &mut self,
        key: &SessionKey,
        ran_code: bool,
        now: Instant,
    ) -> Option<Instant> {
        let session = self.open.get_mut(key)?;
        session.busy = session.held;
        session.runs += u64::from(ran_code);
        session.last_used = now;
        Some(now + self.idle)
    }

    /// Session `key` is in use `now` (a process of it runs): when it
    /// would next be idle.
    pub fn touch(&mut self, key: &SessionKey, now: Instant) -> Option<Instant> {
        let session = self.open.get_mut(key)?;
        session.last_used = now;
        Some(now + self.idle)
    }

    /// Whether session `key` has been unused since `last_used`.
    pub fn is_idle(&self, key: &SessionKey, last_used: Instant) -> bool {
        // A session with a lifetime lasts until its end, used or not.
        self.open
            .get(key)
            .is_some_and(|s| !s.busy && s.last_used == last_used && s.meta.ends.is_none())
    }

    /// Whether a hibernation of session `key` is queued.
    pub fn hibernates_next(&self, key: &SessionKey) -> bool {
        (self.open.get(key)).is_some_and(|s| s.queue.iter().any(|w| w.order.hibernates()))
    }

    /// Session `key`'s environment, labels and lifetime, if it is open.
    pub fn meta(&self, key: &SessionKey) -> Option<&SessionMeta> {
        self.open.get(key).map(|session| &session.meta)
    }

    /// The same, to change.
    pub fn meta_mut(&mut self, key: &SessionKey) -> Option<&mut SessionMeta> {
        self.open.get_mut(key).map(|session| &mut session.meta)
    }
}
