//! How EXEC is shared between owners. Every owner — an agent with its whole
//! tree of children, an operator's uid, or a delegate of one (which holds
//! runs within its uid's cap) — has a queue of its own, and
//! the queues are served round robin: one request from each owner that has
//! room, in turn. An owner holds at most `per_owner` runs at once, and
//! agents together at most `for_agents`, so a flood from one agent (or from
//! many) always leaves room for an operator. A run that a run asked for
//! (the run that asked waiting for it in a place of its own) may go past
//! its owner's cap — never past the agents' — if it is the only one of that
//! run's going: otherwise an owner at its cap would wait on itself.
//!
//! Nothing here knows of children, sockets or time: it orders requests and
//! counts what each owner holds; the rest of EXEC decides when a run can
//! start.

use std::collections::{HashMap, VecDeque};

use agentos_proto::payload::DelegateName;

/// Whose share of EXEC a run counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Share {
    /// An agent and every agent and run it started: one share however many
    /// children it makes.
    Tree(u32),
    /// An operator's uid (every connection of it, and its tasks).
    Operator(u32),
    /// A delegate an operator named: each its own line, served in turn
    /// with the others; what it holds counts as its operator's.
    Delegate(u32, DelegateName),
}

impl Share {
    /// Whose the runs this share holds count as: a delegate's as its
    /// operator's, so no delegate (nor all of one uid's) holds more than
    /// that uid may.
    pub fn held_as(self) -> Share {
        match self {
            Share::Delegate(uid, _) => Share::Operator(uid),
            Share::Tree(_) | Share::Operator(_) => self,
        }
    }
}

/// How many runs may be held at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// By one owner.
    pub per_owner: usize,
    /// By all agents together: the rest is kept for operators.
    pub for_agents: usize,
}

impl Caps {
    /// The caps for `slots` runs prepared at once, and the configured
    /// per-owner cap (`None`: half the slots). At least one run each way.
    pub fn for_slots(slots: usize, per_owner: Option<usize>) -> Caps {
        Caps {
            per_owner: per_owner.unwrap_or(slots / 2).max(1),
            for_agents: slots.saturating_sub(1).max(1),
        }
    }
}

/// Per-owner FIFO queues served round robin, and the runs each owner holds.
#[derive(Debug)]
pub struct Queues<T> {
    queues: HashMap<Share, VecDeque<T>>,
    /// Owners with something queued, in the order they are next served.
    turns: VecDeque<Share>,
    held: HashMap<Share, usize>,
    held_by_agents: usize,
    caps: Caps,
}

impl<T> Queues<T> {
    /// Empty queues with these caps.
    pub fn new(caps: Caps) -> Queues<T> {
        Queues {
            queues: HashMap::new(),
            turns: VecDeque::new(),
            held: HashMap::new(),
            held_by_agents: 0,
            caps,
        }
    }

    /// The caps in force.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Requests queued, from everyone.
    pub fn len(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Queues `item` last in `share`'s line.
    pub fn push_back(&mut self, share: Share, item: T) {
        self.line(share).push_back(item);
    }

    /// Queues `item` first in `share`'s line (work that was already under
    /// way, such as a restore whose old sandbox has gone).
    pub fn push_front(&mut self, share: Share, item: T) {
        self.line(share).push_front(item);
    }

    fn line(&mut self, share: Share) -> &mut VecDeque<T> {
        if !self.queues.contains_key(&share) {
            self.turns.push_back(share);
        }
        self.queues.entry(share).or_default()
    }

    /// Whether `share` may hold one more run now (`lent`: a run's own run,
    /// which only the agents' cap holds back).
    pub fn has_room(&self, share: Share, lent: bool) -> bool {
        let own = self.held_by(share);
        (lent || own < self.caps.per_owner)
            && (!matches!(share, Share::Tree(_)) || self.held_by_agents < self.caps.for_agents)
    }

    /// Runs `share` holds now (a delegate's: its operator's and every
    /// delegate's of that uid).
    pub fn held_by(&self, share: Share) -> usize {
        self.held.get(&share.held_as()).copied().unwrap_or(0)
    }

    /// Takes the next request to start: the first in the round of owners
    /// with room whose request at the head of its line `ready` accepts
    /// (one that cannot start yet keeps its place and holds up only its
    /// own line); `lent` says which may go past their owner's cap. That
    /// owner goes to the back of the round.
    pub fn next(
        &mut self,
        mut ready: impl FnMut(&T) -> bool,
        lent: impl Fn(&T) -> bool,
    ) -> Option<(Share, T)> {
        let turn = self.turns.iter().position(|share| {
            self.queues
                .get(share)
                .and_then(VecDeque::front)
                .is_some_and(|head| self.has_room(*share, lent(head)) && ready(head))
        })?;
        let share = self.turns.remove(turn)?;
        let line = self.queues.get_mut(&share)?;
        let item = line.pop_front()?;
        if line.is_empty() {
            self.queues.remove(&share);
        } else {
            self.turns.push_back(share);
        }
        Some((share, item))
    }

    /// A run of `share` has started.
    pub fn started(&mut self, share: Share) {
        *self.held.entry(share.held_as()).or_default() += 1;
        if matches!(share, Share::Tree(_)) {
            self.held_by_agents += 1;
        }
    }

    /// A run of `share` has ended.
    pub fn ended(&mut self, share: Share) {
        if let Some(own) = self.held.get_mut(&share.held_as()) {
            *own -= 1;
            if *own == 0 {
                self.held.remove(&share.held_as());
            }
            if matches!(share, Share::Tree(_)) {
                self.held_by_agents = self.held_by_agents.saturating_sub(1);
            }
        }
    }

    /// Takes every queued request `take` picks, in each owner's order.
    pub fn take_where(&mut self, mut take: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        for line in self.queues.values_mut() {
            let (gone, kept): (VecDeque<T>, VecDeque<T>) =
                std::mem::take(line).into_iter().partition(&mut take);
            *line = kept;
            taken.extend(gone);
        }
        self.queues.retain(|_, line| !line.is_empty());
        let queues = &self.queues;
        self.turns.retain(|share| queues.contains_key(share));
        taken
    }

    /// Every queued request.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.queues.values().flatten()
    }

    /// Every queued request, to change it in place.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.queues.values_mut().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Share = Share::Tree(1);
    const B: Share = Share::Tree(2);
    const ROOT: Share = Share::Operator(0);

    fn queues(per_owner: usize, for_agents: usize) -> Queues<u32> {
        Queues::new(Caps {
            per_owner,
            for_agents,
        })
    }

    /// Starts what may start (each request `n` is ready), as a pool would.
    fn start_all(q: &mut Queues<u32>) -> Vec<(Share, u32)> {
        let mut order = Vec::new();
        while let Some((share, n)) = q.next(|_| true, |_| false) {
            q.started(share);
            order.push((share, n));
        }
        order
    }

    #[test]
    fn owners_are_served_in_turn_not_in_arrival_order() {
        let mut q = queues(10, 10);
        for n in 0..3 {
            q.push_back(A, n);
        }
        q.push_back(B, 10);
        q.push_back(ROOT, 20);
        let order: Vec<u32> = start_all(&mut q).into_iter().map(|(_, n)| n).collect();
        assert_eq!(order, [0, 10, 20, 1, 2]);
    }

    #[test]
    fn an_owner_at_its_cap_waits_and_others_go_past() {
        let mut q = queues(2, 3);
        for n in 0..12 {
            q.push_back(A, n);
        }
        assert_eq!(start_all(&mut q), [(A, 0), (A, 1)]);
        q.push_back(ROOT, 99);
        assert_eq!(start_all(&mut q), [(ROOT, 99)]);
        q.ended(A);
        assert_eq!(start_all(&mut q), [(A, 2)]);
        assert_eq!(q.len(), 9);
    }

    #[test]
    fn agents_together_leave_room_for_operators() {
        let mut q = queues(2, 3);
        for n in 0..4 {
            q.push_back(A, n);
            q.push_back(B, 10 + n);
        }
        let started = start_all(&mut q);
        assert_eq!(started.len(), 3, "{started:?}");
        q.push_back(ROOT, 99);
        q.push_back(Share::Operator(1000), 98);
        assert_eq!(start_all(&mut q), [(ROOT, 99), (Share::Operator(1000), 98)]);
    }

    #[test]
    fn delegates_take_turns_within_their_operators_cap() {
        let delegate = |name| Share::Delegate(1000, DelegateName::new(name).unwrap());
        let (k1, k2) = (delegate("k1"), delegate("k2"));
        let mut q = queues(3, 3);
        for n in 0..200 {
            q.push_back(k1, n);
        }
        q.push_back(k2, 500);
        // k2 goes second, not after k1's 200; and together they hold no
        // more than uid 1000 may.
        assert_eq!(start_all(&mut q), [(k1, 0), (k2, 500), (k1, 1)]);
        q.push_back(Share::Operator(1000), 900);
        assert_eq!(start_all(&mut q), []);
        assert_eq!(q.held_by(Share::Operator(1000)), 3);
        q.ended(k2);
        assert_eq!(start_all(&mut q), [(k1, 2)]);
        q.ended(k1);
        assert_eq!(start_all(&mut q), [(Share::Operator(1000), 900)]);
        // Another uid is not held back by them.
        q.push_back(Share::Operator(1001), 7);
        assert_eq!(start_all(&mut q), [(Share::Operator(1001), 7)]);
    }

    #[test]
    fn a_head_that_cannot_start_holds_up_only_its_own_line() {
        let mut q = queues(5, 5);
        q.push_back(A, 1);
        q.push_back(A, 2);
        q.push_back(B, 3);
        let first = q.next(|n| *n != 1, |_| false);
        assert_eq!(first, Some((B, 3)));
        assert_eq!(q.next(|n| *n != 1, |_| false), None);
        assert_eq!(q.next(|_| true, |_| false), Some((A, 1)));
    }

    #[test]
    fn a_lent_run_goes_past_its_owners_cap_but_not_the_agents() {
        let mut q = queues(1, 2);
        q.push_back(A, 1);
        q.push_back(A, 2);
        q.push_back(A, 3);
        let lent = |n: &u32| *n >= 2;
        assert_eq!(q.next(|_| true, lent), Some((A, 1)));
        q.started(A);
        assert_eq!(q.next(|_| true, lent), Some((A, 2)));
        q.started(A);
        assert_eq!(q.next(|_| true, lent), None, "the agents' cap holds");
        q.push_back(ROOT, 9);
        assert_eq!(q.next(|_| true, lent), Some((ROOT, 9)));
    }

    #[test]
    fn taken_requests_leave_no_empty_turn_behind() {
        let mut q = queues(5, 5);
        q.push_back(A, 1);
        q.push_back(B, 2);
        q.push_back(A, 3);
        assert_eq!(q.take_where(|n| *n != 2), [1, 3]);
        assert_eq!(q.len(), 1);
        assert_eq!(start_all(&mut q), [(B, 2)]);
        assert!(q.is_empty());
    }

    #[test]
    fn the_default_caps_are_half_the_slots_and_one_kept_for_operators() {
        assert_eq!(
            Caps::for_slots(4, None),
            Caps {
                per_owner: 2,
                for_agents: 3
            }
        );
        assert_eq!(Caps::for_slots(1, None).per_owner, 1);
        assert_eq!(Caps::for_slots(8, Some(6)).per_owner, 6);
    }
}
