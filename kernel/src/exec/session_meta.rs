//! What `open` gives a session beyond what a run does: the environment
//! of the processes started in it, the labels it is listed with, and its
//! lifetime — when the kernel closes or hibernates it. Kept with the live
//! session, and in its disk's record when it has one, so it outlives the
//! session's interpreter and the kernel.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentos_proto::payload::{LifetimeEnd, SessionSetup};
use serde::{Deserialize, Serialize};

use crate::clock::rfc3339;

/// A session's environment, labels and lifetime.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// The environment of processes started in it (never listed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// What it is listed with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// When its lifetime ends, and what then becomes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends: Option<Ends>,
}

/// The end of a session's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ends {
    /// When, in milliseconds since the epoch (the wall clock: it outlives
    /// the kernel).
    pub at_ms: u64,
    /// What becomes of the session then.
    pub then: LifetimeEnd,
}

impl Ends {
    /// `ms` from `now`.
    pub fn after(now: SystemTime, ms: u64, then: LifetimeEnd) -> Ends {
        Ends {
            at_ms: epoch_ms(now).saturating_add(ms),
            then,
        }
    }

    /// When, on the wall clock.
    pub fn at(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.at_ms)
    }

    /// When, as replies say it (RFC 3339).
    pub fn text(self) -> String {
        rfc3339(self.at())
    }
}

/// `at` in milliseconds since the epoch.
pub fn epoch_ms(at: SystemTime) -> u64 {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl SessionMeta {
    /// What `setup` gives a session opened `now`, over what it had
    /// (`kept`: a stored session's): labels it does not give are kept;
    /// the environment and the lifetime are its own.
    pub fn opened(setup: SessionSetup, kept: Option<&SessionMeta>, now: SystemTime) -> SessionMeta {
        let labels = setup
            .labels
            .or_else(|| kept.map(|meta| meta.labels.clone()))
            .unwrap_or_default();
        SessionMeta {
            env: setup.env,
            labels,
            ends: setup
                .lifetime
                .map(|lifetime| Ends::after(now, lifetime.ms, lifetime.then)),
        }
    }
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::Lifetime;

    use super::*;

    #[test]
    fn an_open_keeps_a_stored_sessions_labels_unless_it_gives_its_own() {
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let kept = SessionMeta {
            labels: BTreeMap::from([("k".into(), "old".into())]),
            env: BTreeMap::from([("A".into(), "old".into())]),
            ends: None,
        };
        let setup = SessionSetup {
            lifetime: Some(Lifetime {
                ms: 2500,
                then: LifetimeEnd::Hibernate,
            }),
            ..SessionSetup::default()
        };
        let opened = SessionMeta::opened(setup.clone(), Some(&kept), now);
        assert_eq!(opened.labels, kept.labels);
        assert!(opened.env.is_empty(), "the environment is the open's own");
        let ends = opened.ends.unwrap();
        assert_eq!((ends.at_ms, ends.then), (1_002_500, LifetimeEnd::Hibernate));
        assert_eq!(ends.at(), now + Duration::from_millis(2500));
        let relabelled = SessionSetup {
            labels: Some(BTreeMap::new()),
            ..setup
        };
        assert!(SessionMeta::opened(relabelled, Some(&kept), now)
            .labels
            .is_empty());
    }
}
