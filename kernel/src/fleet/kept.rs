//! What this node knows of the hibernated sessions the fleet keeps (as
//! last listed, and as this node published or claimed them since: the
//! fleet thread answers in order), and the runs that wait while the fleet
//! settles their session.

use std::collections::HashMap;

use agentos_proto::payload::ExecRequest;

use super::sessions::{Hibernated, Key};
use super::tasks::FleetOwner;
use crate::address::ReplyTo;
use crate::identity::Principal;

/// Work waiting for its session.
#[derive(Debug)]
pub struct HeldWork {
    pub what: Held,
    pub principal: Principal,
    pub reply_to: ReplyTo,
}

/// What waits: a run, or a RESUME of the session named.
#[derive(Debug)]
pub enum Held {
    Run(Box<ExecRequest>),
    Resume(String),
}

/// Where a session the fleet is settling stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its hibernation is being published.
    Publishing,
    /// This node's own copy: publication `generation` is being claimed.
    Claiming(i64),
    /// Being fetched from the fleet.
    Fetching,
    /// Fetched (publication `generation`): being brought into the store.
    Importing(i64),
    /// Brought in (keeping globals, or not): being claimed.
    ClaimingImport(i64, bool),
    /// Closed here: publication `generation` is being taken back.
    Forgetting(i64),
}

#[derive(Debug)]
struct Settling {
    step: Step,
    work: Vec<HeldWork>,
}

/// The fleet's hibernated sessions, and the sessions being settled.
#[derive(Debug, Default)]
pub struct KeptSessions {
    listed: HashMap<(FleetOwner, String), Hibernated>,
    /// This node's sessions it published, by publication: each is claimed
    /// before it wakes here, whatever the listing says.
    published: HashMap<Key, i64>,
    settling: HashMap<Key, Settling>,
}

impl KeptSessions {
    /// The fleet's listing, replacing what was known.
    pub fn listed(&mut self, sessions: Vec<Hibernated>) {
        self.listed = (sessions.into_iter())
            .map(|kept| ((kept.owner.clone(), kept.name.clone()), kept))
            .collect();
    }

    /// `owner`'s session `name`, if the fleet keeps it.
    pub fn find(&self, owner: &FleetOwner, name: &str) -> Option<&Hibernated> {
        self.listed.get(&(owner.clone(), name.to_owned()))
    }

    /// The fleet keeps `kept` now (this node published it).
    pub fn insert(&mut self, kept: Hibernated) {
        self.listed
            .insert((kept.owner.clone(), kept.name.clone()), kept);
    }

    /// This node published session `key` as `generation`.
    pub fn published(&mut self, key: &Key, generation: i64) {
        self.published.insert(key.clone(), generation);
    }

    /// The publication of this node's session `key`, if it has one that
    /// was not claimed yet.
    pub fn publication(&self, key: &Key) -> Option<i64> {
        self.published.get(key).copied()
    }

    /// This node's published sessions.
    pub fn published_keys(&self) -> Vec<Key> {
        self.published.keys().cloned().collect()
    }

    /// This node's session `key` is published no more.
    pub fn unpublished(&mut self, key: &Key) {
        self.published.remove(key);
    }

    /// The fleet keeps `owner`'s session `name` no more.
    pub fn remove(&mut self, owner: &FleetOwner, name: &str) {
        self.listed.remove(&(owner.clone(), name.to_owned()));
    }

    /// Where session `key` stands, if it is being settled.
    pub fn step(&self, key: &Key) -> Option<Step> {
        self.settling.get(key).map(|settling| settling.step)
    }

    /// Session `key` is settled as `step` says from now on.
    pub fn set_step(&mut self, key: &Key, step: Step) {
        let settling = self.settling.entry(key.clone()).or_insert(Settling {
            step,
            work: Vec::new(),
        });
        settling.step = step;
    }

    /// `work` waits for session `key`, which is being settled.
    pub fn hold(&mut self, key: &Key, work: HeldWork) {
        if let Some(settling) = self.settling.get_mut(key) {
            settling.work.push(work);
        }
    }

    /// A connection closed: the work it asked for waits no more (its
    /// session is settled all the same).
    pub fn connection_closed(&mut self, serial: u64) {
        for settling in self.settling.values_mut() {
            (settling.work).retain(|work| work.reply_to.connection() != Some(serial));
        }
    }

    /// Session `key` is settled: the work that waited for it.
    pub fn settled(&mut self, key: &Key) -> Vec<HeldWork> {
        self.settling
            .remove(key)
            .map(|settling| settling.work)
            .unwrap_or_default()
    }
}
