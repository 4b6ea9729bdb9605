//! Sessions' lifetimes: set or cleared by `open` and `lifetime`, kept by
//! the live session and its disk's record alike, and ended by the kernel
//! — the session closed or hibernated — when they run out. [`Lifetimes`]
//! keeps one deadline per session however often its owner sets it anew,
//! so a lifetime set a million times costs what it costs once.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentos_proto::payload::{Lifetime, LifetimeEnd};
use agentos_proto::ErrorReply;

use super::disks::{no_session, SessionDisks};
use super::session_meta::{epoch_ms, Ends, SessionMeta};
use super::sessions::Sessions;
use super::waiting::SessionKey;

/// Sets session `key`'s lifetime, from `now`, or clears it (`None`), as
/// the live session (among `sessions`) and its record (among `disks`)
/// keep it: when it ends now. `not_found` if the owner has no such
/// session.
pub fn set_lifetime(
    key: &SessionKey,
    lifetime: Option<Lifetime>,
    now: SystemTime,
    sessions: &mut Sessions,
    disks: &mut SessionDisks,
) -> Result<Option<Ends>, ErrorReply> {
    let ends = lifetime.map(|lifetime| Ends::after(now, lifetime.ms, lifetime.then));
    let live = sessions.meta_mut(key).map(|meta| meta.ends = ends);
    let recorded = disks.change_record(key, |record| record.meta.ends = ends);
    match live.or(recorded) {
        Some(()) => Ok(ends),
        None => Err(no_session(key)),
    }
}

/// Session `key`'s lifetime may have ended by `now_ms`: if it has, what
/// then becomes of the session, its lifetime cleared; `None` if it was
/// set anew (or cleared, or the session closed) meanwhile.
pub fn lifetime_ended(
    key: &SessionKey,
    now_ms: u64,
    sessions: &mut Sessions,
    disks: &mut SessionDisks,
) -> Option<LifetimeEnd> {
    let take = |meta: &mut SessionMeta| {
        let ends = meta.ends.filter(|ends| ends.at_ms <= now_ms)?;
        meta.ends = None;
        Some(ends.then)
    };
    let live = sessions.meta_mut(key).and_then(take);
    let recorded = disks.change_record(key, |record| take(&mut record.meta));
    let recorded = recorded.flatten();
    live.or(recorded)
}

/// The sessions whose lifetimes end, by when (milliseconds since the
/// epoch): one entry per session.
#[derive(Debug, Default)]
pub struct Lifetimes {
    by_end: BTreeSet<(u64, SessionKey)>,
    of: HashMap<SessionKey, u64>,
}

impl Lifetimes {
    /// Session `key`'s lifetime ends at `at_ms`, or (`None`) it has none.
    pub fn set(&mut self, key: &SessionKey, at_ms: Option<u64>) {
        if let Some(was) = self.of.remove(key) {
            self.by_end.remove(&(was, key.clone()));
        }
        if let Some(at_ms) = at_ms {
            self.of.insert(key.clone(), at_ms);
            self.by_end.insert((at_ms, key.clone()));
        }
    }

    /// How long from `now` until the first ends (zero if it has passed).
    pub fn time_to_next(&self, now: SystemTime) -> Option<Duration> {
        let (at_ms, _) = self.by_end.first()?;
        let at = UNIX_EPOCH + Duration::from_millis(*at_ms);
        Some(at.duration_since(now).unwrap_or_default())
    }

    /// A session whose lifetime has ended by `now`, with when it ended,
    /// taken out.
    pub fn pop_due(&mut self, now: SystemTime) -> Option<(SessionKey, u64)> {
        let (at_ms, _) = self.by_end.first()?;
        if *at_ms > epoch_ms(now) {
            return None;
        }
        let (at_ms, key) = self.by_end.pop_first()?;
        self.of.remove(&key);
        Some((key, at_ms))
    }

    /// Sessions with a lifetime.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.of.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Principal;

    fn key(name: &str) -> SessionKey {
        (Principal::Operator { uid: 0 }, name.to_owned())
    }

    #[test]
    fn a_lifetime_set_anew_keeps_one_deadline_and_the_latest_wins() {
        let mut lifetimes = Lifetimes::default();
        for at_ms in (1_000..101_000).rev() {
            lifetimes.set(&key("s1"), Some(at_ms));
        }
        lifetimes.set(&key("s2"), Some(5_000));
        assert_eq!(lifetimes.len(), 2);
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(
            lifetimes.time_to_next(at(400)),
            Some(Duration::from_millis(600))
        );
        assert_eq!(lifetimes.pop_due(at(999)), None);
        assert_eq!(lifetimes.pop_due(at(6_000)), Some((key("s1"), 1_000)));
        assert_eq!(lifetimes.pop_due(at(6_000)), Some((key("s2"), 5_000)));
        assert_eq!(lifetimes.pop_due(at(6_000)), None);
        lifetimes.set(&key("s3"), Some(7_000));
        lifetimes.set(&key("s3"), None);
        assert_eq!((lifetimes.len(), lifetimes.time_to_next(at(0))), (0, None));
    }
}
