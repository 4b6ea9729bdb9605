//! What this node knows of the hibernated sessions the fleet keeps: as
//! last listed (which may be a moment old: a listing and this node's own
//! moves are answered by different threads), and which of its own
//! sessions it published (its records keep those through a restart); and
//! the work that waits while the fleet settles its session.

use std::collections::HashMap;

use agentos_proto::payload::ExecRequest;
use agentos_proto::{ErrorCode, ErrorReply};

use super::sessions::{Hibernated, Key};
use super::tasks::FleetOwner;
use crate::address::ReplyTo;
use crate::identity::Principal;

/// What a session's record says while its publication's answer is not
/// heard: generations start at 1.
pub const PUBLISHING: i64 = 0;

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
    /// Brought in: being made here, on a disk of its own.
    Restoring(i64),
    /// Made here: being claimed.
    ClaimingImport(i64),
    /// Closed here: publication `generation` is being taken back.
    Forgetting(i64),
    /// Published here, and no longer listed: whose it is now is asked.
    Checking(i64),
}

#[derive(Debug)]
struct Settling {
    step: Step,
    work: Vec<HeldWork>,
    /// Its environment and labels, fetched, until it is made here.
    meta: Vec<u8>,
}

/// The fleet's hibernated sessions, and the sessions being settled.
#[derive(Debug, Default)]
pub struct KeptSessions {
    listed: HashMap<(FleetOwner, String), Hibernated>,
    /// A listing has come since the node started.
    has_listed: bool,
    /// This node's sessions it published, by publication: each is claimed
    /// before it wakes here, whatever the listing says.
    published: HashMap<Key, i64>,
    /// This node's copies closed as another node claimed them, each with
    /// that node (if known): the next work on one is told where it went.
    gone: HashMap<Key, Option<String>>,
    settling: HashMap<Key, Settling>,
}

impl KeptSessions {
    /// The fleet's listing, replacing what was known.
    pub fn listed(&mut self, sessions: Vec<Hibernated>) {
        self.has_listed = true;
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

    /// The generation of `owner`'s session `name` the fleet keeps as
    /// `node`'s publication: `None` if it keeps none; unknown (`unavailable`)
    /// until a listing has come.
    pub fn generation_here(
        &self,
        owner: &FleetOwner,
        name: &str,
        node: &str,
    ) -> Result<Option<i64>, ErrorReply> {
        if !self.has_listed {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!(
                    "session {name:?} was being published to the fleet as this node stopped; \
                     it wakes once the node has read the fleet's sessions: retry in a moment"
                ),
            ));
        }
        let kept = self.find(owner, name).filter(|kept| kept.node == node);
        Ok(kept.map(|kept| kept.generation))
    }

    /// The sessions being brought here from the fleet.
    pub fn settling_keys(&self) -> Vec<Key> {
        (self.settling.iter())
            .filter(|(_, settling)| {
                matches!(
                    settling.step,
                    Step::Fetching | Step::Importing(_) | Step::Restoring(_)
                )
            })
            .map(|(key, _)| key.clone())
            .collect()
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

    /// This node's copy of session `key` went, claimed by node `by`.
    pub fn went(&mut self, key: &Key, by: Option<String>) {
        self.gone.insert(key.clone(), by);
    }

    /// Where this node's copy of session `key` went, if it did (asked
    /// once).
    pub fn take_gone(&mut self, key: &Key) -> Option<Option<String>> {
        self.gone.remove(key)
    }

    /// This node's published sessions.
    pub fn published_keys(&self) -> Vec<Key> {
        self.published.keys().cloned().collect()
    }

    /// This node's session `key` is published no more.
    pub fn unpublished(&mut self, key: &Key) {
        self.published.remove(key);
    }

    /// The fleet keeps `owner`'s session `name` no more, as publication
    /// `generation` (any, with `None`).
    pub fn remove(&mut self, owner: &FleetOwner, name: &str, generation: Option<i64>) {
        let listed = (owner.clone(), name.to_owned());
        if generation.is_none_or(|g| self.listed.get(&listed).is_some_and(|h| h.generation == g)) {
            self.listed.remove(&listed);
        }
    }

    /// The listing, as it stands.
    pub fn all_listed(&self) -> impl Iterator<Item = &Hibernated> {
        self.listed.values()
    }

    /// How much work waits for session `key`.
    pub fn held(&self, key: &Key) -> usize {
        self.settling
            .get(key)
            .map_or(0, |settling| settling.work.len())
    }

    /// Takes the work waiting to be answered at `reply_to` (a task
    /// cancelled), if any waits.
    pub fn cancel(&mut self, reply_to: ReplyTo) -> Option<HeldWork> {
        for settling in self.settling.values_mut() {
            if let Some(at) = settling.work.iter().position(|w| w.reply_to == reply_to) {
                return Some(settling.work.remove(at));
            }
        }
        None
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
            meta: Vec::new(),
        });
        settling.step = step;
    }

    /// Session `key`, being settled, was fetched with `meta`.
    pub fn carry(&mut self, key: &Key, meta: Vec<u8>) {
        if let Some(settling) = self.settling.get_mut(key) {
            settling.meta = meta;
        }
    }

    /// What session `key` was fetched with.
    pub fn carried(&self, key: &Key) -> &[u8] {
        self.settling
            .get(key)
            .map_or(&[], |settling| &settling.meta)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> FleetOwner {
        FleetOwner {
            user: "alice".into(),
            delegate: String::new(),
        }
    }

    fn kept(node: &str, generation: i64) -> Hibernated {
        Hibernated {
            owner: owner(),
            name: "s1".into(),
            node: node.into(),
            generation,
        }
    }

    fn run(reply_to: ReplyTo) -> HeldWork {
        HeldWork {
            what: Held::Resume("s1".into()),
            principal: Principal::Operator { uid: 1000 },
            reply_to,
        }
    }

    #[test]
    fn a_claim_of_one_publication_leaves_a_newer_one_listed() {
        let mut sessions = KeptSessions::default();
        sessions.listed(vec![kept("n2", 7)]);
        sessions.remove(&owner(), "s1", Some(6));
        assert_eq!(sessions.find(&owner(), "s1"), Some(&kept("n2", 7)));
        sessions.remove(&owner(), "s1", Some(7));
        assert_eq!(sessions.find(&owner(), "s1"), None);
        sessions.insert(kept("n1", 8));
        sessions.remove(&owner(), "s1", None);
        assert_eq!(sessions.find(&owner(), "s1"), None);
    }

    #[test]
    fn held_work_is_settled_once_and_a_cancelled_or_closed_ones_goes() {
        let key = (Principal::Operator { uid: 1000 }, "s1".to_owned());
        let mut sessions = KeptSessions::default();
        // Nothing is held for a session not being settled.
        sessions.hold(&key, run(ReplyTo::Task(1)));
        assert_eq!(sessions.held(&key), 0);
        sessions.set_step(&key, Step::Fetching);
        for number in 1..=3 {
            sessions.hold(&key, run(ReplyTo::Task(number)));
        }
        assert_eq!(sessions.held(&key), 3);
        assert!(sessions.cancel(ReplyTo::Task(2)).is_some());
        assert!(sessions.cancel(ReplyTo::Task(2)).is_none());
        sessions.set_step(&key, Step::Importing(4));
        assert_eq!(sessions.step(&key), Some(Step::Importing(4)));
        let settled: Vec<ReplyTo> = sessions.settled(&key).iter().map(|w| w.reply_to).collect();
        assert_eq!(settled, [ReplyTo::Task(1), ReplyTo::Task(3)]);
        assert!(sessions.settled(&key).is_empty() && sessions.step(&key).is_none());
    }

    #[test]
    fn where_a_copy_went_is_told_once() {
        let key = (Principal::Operator { uid: 1000 }, "s1".to_owned());
        let mut sessions = KeptSessions::default();
        sessions.published(&key, 3);
        assert_eq!(sessions.publication(&key), Some(3));
        sessions.unpublished(&key);
        sessions.went(&key, Some("n2".into()));
        assert_eq!(sessions.take_gone(&key), Some(Some("n2".into())));
        assert_eq!(sessions.take_gone(&key), None);
    }
}
