//! The processes the kernel holds, by number, and by session: which a
//! request names (its pid or tag), how many run, and which are old
//! enough to forget.

use std::collections::HashMap;
use std::ops::{Index, IndexMut};
use std::time::{Duration, Instant};

use agentos_proto::payload::{ProcRef, ProcStart, ProcessInfo};
use agentos_proto::{ErrorCode, ErrorReply};
use slab::Slab;

use super::process::Process;
use crate::exec::waiting::SessionKey;

/// Live processes one session may have.
pub const MAX_LIVE_PER_SESSION: usize = 64;
/// Ended processes a session keeps for `processes` and `output`.
pub const MAX_ENDED_PER_SESSION: usize = 16;
/// Live processes one owner may have (a uid with its delegates), all its
/// sessions together.
pub const MAX_LIVE_PER_OWNER: usize = 256;
/// Live processes in the kernel, all sessions together.
pub const MAX_LIVE_TOTAL: usize = 1024;
/// Ended processes the kernel keeps, all sessions together (the oldest
/// go first).
pub const MAX_ENDED_TOTAL: usize = 256;
/// Processes on a PTY one owner may have running (a uid with its
/// delegates), all its sessions together: PTYs are the host's.
pub const MAX_PTYS_PER_OWNER: usize = 16;
/// Processes on a PTY running in the kernel.
pub const MAX_PTYS_TOTAL: usize = 256;
/// A session whose steward is gone keeps its ended processes this long.
pub const KEPT_AFTER: Duration = Duration::from_secs(300);

/// One session's processes.
#[derive(Debug, Default)]
struct SessionProcs {
    /// Its steward, by number, while it has one.
    steward: Option<usize>,
    /// Its processes, oldest first.
    processes: Vec<usize>,
    /// When its steward went.
    steward_gone: Option<Instant>,
    /// Since when it is paused, if it is.
    paused_since: Option<Instant>,
}

/// Every process, by number and by session.
#[derive(Debug, Default)]
pub struct Table {
    processes: Slab<Process>,
    sessions: HashMap<SessionKey, SessionProcs>,
}

impl Index<usize> for Table {
    type Output = Process;

    fn index(&self, process: usize) -> &Process {
        &self.processes[process]
    }
}

impl IndexMut<usize> for Table {
    fn index_mut(&mut self, process: usize) -> &mut Process {
        &mut self.processes[process]
    }
}

impl Table {
    /// Process `number`, if it is held.
    pub fn get(&self, number: usize) -> Option<&Process> {
        self.processes.get(number)
    }

    /// Process `number`, if it is held, to change.
    pub fn get_mut(&mut self, number: usize) -> Option<&mut Process> {
        self.processes.get_mut(number)
    }

    /// Session `key`'s process of `pid` whose end its steward has not yet
    /// reported (a pid the session reused names one at a time).
    pub fn unreported(&self, key: &SessionKey, pid: u32) -> Option<usize> {
        (self.of(key).into_iter())
            .find(|&p| self.processes[p].pid == pid && self.processes[p].end.is_none())
    }

    /// The processes of session `key`, oldest first.
    pub fn of(&self, key: &SessionKey) -> Vec<usize> {
        (self.sessions.get(key)).map_or_else(Vec::new, |s| s.processes.clone())
    }

    /// Session `key`'s steward, if it has one.
    pub fn steward_of(&self, key: &SessionKey) -> Option<usize> {
        self.sessions.get(key).and_then(|s| s.steward)
    }

    /// Session `key`'s steward is now `steward` (none: it went `now`).
    pub fn set_steward(&mut self, key: &SessionKey, steward: Option<usize>, now: Instant) {
        let session = self.sessions.entry(key.clone()).or_default();
        session.steward = steward;
        session.steward_gone = steward.is_none().then_some(now);
    }

    /// Session `key` is paused (`frozen`) or resumed `now`. On resuming,
    /// its processes' deadlines move on by the time it stood still: the
    /// processes whose deadline moved, and to when.
    pub fn frozen(
        &mut self,
        key: &SessionKey,
        frozen: bool,
        now: Instant,
    ) -> Vec<(usize, Instant)> {
        // A session with no processes has nothing to stand still.
        let Some(session) = self.sessions.get_mut(key) else {
            return Vec::new();
        };
        let since = match frozen {
            true => {
                session.paused_since.get_or_insert(now);
                return Vec::new();
            }
            false => session.paused_since.take(),
        };
        let stood = since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        let mut moved = Vec::new();
        for &process in &session.processes {
            if let Some(deadline) = &mut self.processes[process].deadline {
                *deadline += stood;
                moved.push((process, *deadline));
            }
        }
        moved
    }

    /// Whether session `key` is paused.
    pub fn is_paused(&self, key: &SessionKey) -> bool {
        self.sessions
            .get(key)
            .is_some_and(|s| s.paused_since.is_some())
    }

    /// `processes`: session `key`'s live processes, then those ended
    /// lately.
    pub fn infos(&self, key: &SessionKey) -> Vec<ProcessInfo> {
        let records = self.of(key).into_iter().map(|p| &self.processes[p]);
        let (live, ended): (Vec<&Process>, Vec<&Process>) = records.partition(|p| !p.ended());
        live.into_iter().chain(ended).map(Process::info).collect()
    }

    /// `Ok` if `start` may start in session `key`: within the caps on
    /// live processes and PTYs, its tag (if it has one) not in use.
    /// `starting`: the processes whose start waits for a steward's answer,
    /// counted as live.
    pub fn may_start(
        &self,
        key: &SessionKey,
        start: &ProcStart,
        starting: &[&Process],
    ) -> Result<(), ErrorReply> {
        let live: Vec<&Process> = (self.processes.iter().map(|(_, p)| p))
            .filter(|p| !p.ended())
            .chain(starting.iter().copied())
            .collect();
        let owner = key.0.quota_owner();
        let of_owner = |p: &&&Process| p.key.0.quota_owner() == owner;
        let here: Vec<&&Process> = live.iter().filter(|p| p.key == *key).collect();
        let owners = live.iter().filter(of_owner).count();
        if here.len() >= MAX_LIVE_PER_SESSION
            || owners >= MAX_LIVE_PER_OWNER
            || live.len() >= MAX_LIVE_TOTAL
        {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session {:?} has {} processes running and you {owners} (at most \
                     {MAX_LIVE_PER_SESSION} and {MAX_LIVE_PER_OWNER}; {MAX_LIVE_TOTAL} in the \
                     kernel): end one first",
                    key.1,
                    here.len()
                ),
            ));
        }
        if start.pty.is_some() {
            let on_pty: Vec<&&Process> = live.iter().filter(|p| p.pty).collect();
            let owners = on_pty
                .iter()
                .filter(|p| p.key.0.quota_owner() == owner)
                .count();
            if owners >= MAX_PTYS_PER_OWNER || on_pty.len() >= MAX_PTYS_TOTAL {
                return Err(ErrorReply::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "you have {owners} processes on a PTY running (at most \
                         {MAX_PTYS_PER_OWNER}; {MAX_PTYS_TOTAL} in the kernel): end one first"
                    ),
                ));
            }
        }
        match &start.tag {
            Some(tag) if here.iter().any(|p| p.tag.as_ref() == Some(tag)) => Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!(
                    "a process of session {:?} is running with tag {tag:?}",
                    key.1
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The process `which` of session `key` names: by pid, its live
    /// process of that pid, else the latest ended one; by tag likewise.
    pub fn find(&self, key: &SessionKey, which: &ProcRef) -> Result<usize, ErrorReply> {
        let matches = |p: &Process| match which {
            ProcRef::Pid(pid) => p.pid == *pid,
            ProcRef::Tag(tag) => p.tag.as_ref() == Some(tag),
        };
        let named: Vec<usize> = (self.of(key).into_iter())
            .filter(|&p| matches(&self.processes[p]))
            .collect();
        let live = named.iter().copied().find(|&p| !self.processes[p].ended());
        live.or(named.last().copied()).ok_or_else(|| {
            let what = match which {
                ProcRef::Pid(pid) => format!("pid {pid}"),
                ProcRef::Tag(tag) => format!("tag {tag:?}"),
            };
            ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {:?} has no process of {what}", key.1),
            )
        })
    }

    /// Holds `process` (started); its number.
    pub fn insert(&mut self, process: Process) -> usize {
        let key = process.key.clone();
        let number = self.processes.insert(process);
        self.sessions.entry(key).or_default().processes.push(number);
        number
    }

    /// Forgets `process`.
    pub fn remove(&mut self, process: usize) -> Option<Process> {
        let record = self.processes.try_remove(process)?;
        if let Some(session) = self.sessions.get_mut(&record.key) {
            session.processes.retain(|&p| p != process);
        }
        Some(record)
    }

    /// The oldest ended processes beyond the caps, to forget: session
    /// `key`'s beyond [`MAX_ENDED_PER_SESSION`], and the kernel's beyond
    /// [`MAX_ENDED_TOTAL`].
    pub fn ended_beyond_caps(&self, key: &SessionKey) -> Vec<usize> {
        let ended: Vec<usize> = (self.of(key).into_iter())
            .filter(|&p| self.processes[p].ended())
            .collect();
        let over = ended.len().saturating_sub(MAX_ENDED_PER_SESSION);
        let mut beyond = ended[..over].to_vec();
        let mut all: Vec<(usize, Option<std::time::SystemTime>)> = (self.processes.iter())
            .filter(|(p, record)| record.ended() && !beyond.contains(p))
            .map(|(p, record)| (p, record.ended_at))
            .collect();
        let over = all.len().saturating_sub(MAX_ENDED_TOTAL);
        all.sort_by_key(|(_, at)| *at);
        beyond.extend(all[..over].iter().map(|(p, _)| *p));
        beyond
    }

    /// Whether a session without a steward still has records (to be
    /// forgotten once its processes have all ended).
    pub fn any_to_go(&self) -> bool {
        self.sessions
            .values()
            .any(|s| s.steward.is_none() && !s.processes.is_empty())
    }

    /// The processes of the sessions whose steward went [`KEPT_AFTER`]
    /// before `now` and which have all ended, to forget (with those
    /// sessions).
    pub fn due_to_go(&mut self, now: Instant) -> Vec<usize> {
        let processes = &self.processes;
        let due: Vec<SessionKey> = (self.sessions.iter())
            .filter(|(_, s)| s.steward.is_none())
            .filter(|(_, s)| s.steward_gone.is_some_and(|at| now >= at + KEPT_AFTER))
            .filter(|(_, s)| s.processes.iter().all(|&p| processes[p].ended()))
            .map(|(key, _)| key.clone())
            .collect();
        (due.iter())
            .filter_map(|key| self.sessions.remove(key))
            .flat_map(|s| s.processes)
            .collect()
    }
}
