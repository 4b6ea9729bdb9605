//! The record of a sandbox's connection attempts through the egress
//! proxy: the newest few kept whole, and counters that never forget. An
//! owner reads its agents' records (`agentos net NAME`); LIST and an EXEC
//! reply carry the counters. A run's record counts in its agent's too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// How many attempts one sandbox's record keeps: the newest, so a flood
/// of refused attempts costs a bounded amount of memory.
pub const KEPT_ATTEMPTS: usize = 256;

/// One connection attempt, as it ended (or as it is, while open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// The proxy's number for it, unique in a boot, by which its bytes are
    /// added later.
    #[serde(skip)]
    pub id: u64,
    /// Milliseconds since the Unix epoch, when it was asked for.
    pub at_ms: u64,
    pub host: String,
    pub port: u16,
    /// The address the host resolved to, once resolved.
    pub address: Option<String>,
    pub allowed: bool,
    /// Why it was refused, or why an allowed one failed.
    pub reason: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_ms: u64,
}

/// What the counters say: the shape of LIST's and EXEC's `network`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub allowed: u64,
    pub refused: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// One sandbox's record.
#[derive(Debug, Default)]
pub struct Record {
    attempts: VecDeque<Attempt>,
    /// Attempts dropped from the front to keep [`KEPT_ATTEMPTS`].
    dropped: u64,
    totals: Totals,
    /// The record of the agent whose work this sandbox does (an EXEC
    /// run's), which holds its attempts too: what an agent's runs reach is
    /// the agent's to answer for, and outlives the runs.
    owner: Option<Arc<Mutex<Record>>>,
}

/// Every sandbox's counts since the kernel started (a record goes with
/// its sandbox; these stay, for the metrics).
static EVERY: [AtomicU64; 4] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];
const ALLOWED: usize = 0;
const REFUSED: usize = 1;
const BYTES_OUT: usize = 2;
const BYTES_IN: usize = 3;

fn count(which: usize, n: u64) {
    EVERY[which].fetch_add(n, Ordering::Relaxed);
}

/// Every sandbox's counts since the kernel started.
pub fn every_sandbox() -> Totals {
    let read = |which: usize| EVERY[which].load(Ordering::Relaxed);
    Totals {
        allowed: read(ALLOWED),
        refused: read(REFUSED),
        bytes_out: read(BYTES_OUT),
        bytes_in: read(BYTES_IN),
    }
}

impl Record {
    /// Every attempt recorded here from now on is recorded in `owner` too
    /// (a run's, in its agent's record). `owner` must not be this record,
    /// nor one that counts in this one.
    pub fn count_in(&mut self, owner: Arc<Mutex<Record>>) {
        self.owner = Some(owner);
    }

    /// Records an attempt as it was decided; its bytes and duration come
    /// later through [`Record::finished`].
    pub fn attempted(&mut self, attempt: Attempt) {
        count(if attempt.allowed { ALLOWED } else { REFUSED }, 1);
        count(BYTES_OUT, attempt.bytes_out);
        count(BYTES_IN, attempt.bytes_in);
        if let Some(owner) = &self.owner {
            lock(owner).add(attempt.clone());
        }
        self.add(attempt);
    }

    /// Allowed connection `id` has ended (or moved more bytes): its counts
    /// are added, to the attempt too if it is still kept.
    pub fn finished(&mut self, id: u64, bytes_out: u64, bytes_in: u64, duration_ms: u64) {
        count(BYTES_OUT, bytes_out);
        count(BYTES_IN, bytes_in);
        if let Some(owner) = &self.owner {
            lock(owner).add_bytes(id, bytes_out, bytes_in, duration_ms);
        }
        self.add_bytes(id, bytes_out, bytes_in, duration_ms);
    }

    /// Connection `id`, allowed when asked for, was refused on what came
    /// after (a TLS server name for another host): it counts as refused.
    pub fn refused_after(&mut self, id: u64, reason: String) {
        if let Some(owner) = &self.owner {
            lock(owner).turn_refused(id, reason.clone());
        }
        if self.turn_refused(id, reason) {
            EVERY[ALLOWED].fetch_sub(1, Ordering::Relaxed);
            count(REFUSED, 1);
        }
    }

    /// Allowed connection `id` failed or was ended by the proxy, and why
    /// (`policy changed`, an upstream that could not be reached).
    pub fn ended(&mut self, id: u64, reason: String) {
        if let Some(owner) = &self.owner {
            lock(owner).note_ending(id, reason.clone());
        }
        self.note_ending(id, reason);
    }

    /// The attempt, in this record only (the kernel-wide counts are the
    /// caller's: an owner's copy is not counted twice there).
    fn add(&mut self, attempt: Attempt) {
        if attempt.allowed {
            self.totals.allowed += 1;
        } else {
            self.totals.refused += 1;
        }
        self.totals.bytes_out += attempt.bytes_out;
        self.totals.bytes_in += attempt.bytes_in;
        if self.attempts.len() == KEPT_ATTEMPTS {
            self.attempts.pop_front();
            self.dropped += 1;
        }
        self.attempts.push_back(attempt);
    }

    fn add_bytes(&mut self, id: u64, bytes_out: u64, bytes_in: u64, duration_ms: u64) {
        self.totals.bytes_out += bytes_out;
        self.totals.bytes_in += bytes_in;
        if let Some(attempt) = self.kept(id) {
            attempt.bytes_out += bytes_out;
            attempt.bytes_in += bytes_in;
            attempt.duration_ms = duration_ms;
        }
    }

    fn note_ending(&mut self, id: u64, reason: String) {
        if let Some(attempt) = self.kept(id) {
            attempt.reason = Some(reason);
        }
    }

    /// Whether kept attempt `id` moved from allowed to refused.
    fn turn_refused(&mut self, id: u64, reason: String) -> bool {
        let Some(attempt) = self.kept(id).filter(|a| a.allowed) else {
            return false;
        };
        attempt.allowed = false;
        attempt.reason = Some(reason);
        self.totals.allowed -= 1;
        self.totals.refused += 1;
        true
    }

    fn kept(&mut self, id: u64) -> Option<&mut Attempt> {
        // The newest are looked for most: search from the back.
        self.attempts.iter_mut().rev().find(|a| a.id == id)
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The kept attempts, oldest first, and how many older ones are gone.
    pub fn attempts(&self) -> (impl Iterator<Item = &Attempt>, u64) {
        (self.attempts.iter(), self.dropped)
    }
}

/// A record's lock; a thread that panicked holding it left counts that
/// are still worth having.
pub fn lock(record: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    record.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(at_ms: u64, allowed: bool) -> Attempt {
        Attempt {
            id: at_ms,
            at_ms,
            host: "a.example".into(),
            port: 443,
            address: Some("93.184.216.34".into()),
            allowed,
            reason: (!allowed).then(|| "not in the policy's allow list".into()),
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn a_flood_keeps_the_newest_attempts_and_counts_them_all() {
        let mut record = Record::default();
        for at in 0..10_000 {
            record.attempted(attempt(at, at % 2 == 0));
        }
        let (kept, dropped) = record.attempts();
        let kept: Vec<_> = kept.collect();
        assert_eq!(kept.len(), KEPT_ATTEMPTS);
        assert_eq!(dropped, 10_000 - KEPT_ATTEMPTS as u64);
        assert_eq!(kept[0].at_ms, 10_000 - KEPT_ATTEMPTS as u64);
        assert_eq!(record.totals().allowed, 5_000);
        assert_eq!(record.totals().refused, 5_000);
    }

    #[test]
    fn bytes_are_counted_on_the_attempt_and_in_the_totals() {
        let mut record = Record::default();
        record.attempted(attempt(1, true));
        record.finished(1, 100, 2_000, 35);
        record.finished(1, 1, 2, 40);
        // A connection whose attempt was dropped still counts.
        record.finished(0, 5, 5, 1);
        let (mut kept, _) = record.attempts();
        let first = kept.next().unwrap();
        assert_eq!(
            (first.bytes_out, first.bytes_in, first.duration_ms),
            (101, 2_002, 40)
        );
        assert_eq!(
            record.totals(),
            Totals {
                allowed: 1,
                refused: 0,
                bytes_out: 106,
                bytes_in: 2_007
            }
        );
    }

    #[test]
    fn a_connection_refused_after_it_was_allowed_moves_between_the_counters() {
        let mut record = Record::default();
        record.attempted(attempt(7, true));
        record.refused_after(7, "TLS server name a does not match b".into());
        record.refused_after(7, "twice".into());
        assert_eq!((record.totals().allowed, record.totals().refused), (0, 1));
        let (mut kept, _) = record.attempts();
        let first = kept.next().unwrap();
        assert!(!first.allowed);
        assert_eq!(
            first.reason.as_deref(),
            Some("TLS server name a does not match b")
        );
    }

    #[test]
    fn a_runs_attempts_count_in_its_agents_record_too() {
        let agent = Arc::new(Mutex::new(Record::default()));
        agent.lock().unwrap().attempted(attempt(1, true));
        let mut run = Record::default();
        run.count_in(Arc::clone(&agent));
        run.attempted(attempt(2, true));
        run.attempted(attempt(3, false));
        run.finished(2, 10, 20, 5);
        run.attempted(attempt(4, true));
        run.refused_after(4, "TLS server name a does not match b".into());
        run.ended(2, "policy changed".into());
        assert_eq!(
            run.totals(),
            Totals {
                allowed: 1,
                refused: 2,
                bytes_out: 10,
                bytes_in: 20
            }
        );
        let agent = agent.lock().unwrap();
        assert_eq!(
            agent.totals(),
            Totals {
                allowed: 2,
                refused: 2,
                bytes_out: 10,
                bytes_in: 20
            },
            "the agent's own attempt and its run's, together"
        );
        let (kept, _) = agent.attempts();
        let kept: Vec<_> = kept.collect();
        assert_eq!(kept.iter().map(|a| a.id).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(kept[1].bytes_in, 20);
        assert_eq!(kept[1].reason.as_deref(), Some("policy changed"));
        assert!(!kept[3].allowed);
    }
}
