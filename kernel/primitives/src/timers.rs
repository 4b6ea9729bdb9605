//! Deadlines for an event loop: a min-heap of instants. A loop that must
//! never block (the kernel's reactor, the egress proxy's loop) sleeps in
//! `poll` until the earliest one and handles what is due when it wakes;
//! nothing sleeps on such a thread but `poll`.
//!
//! Timers are not cancelled; whoever handles a fired timer checks whether
//! it still matters (a connection may be gone, a buffer already drained).
//! A connection's timer can carry what tells its own apart from a later
//! one's in the same slot (its slab key and a connection id, say).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use agentos_primitives::timers::Timers;
//!
//! let now = Instant::now();
//! let mut timers = Timers::default();
//! timers.schedule(now + Duration::from_secs(5), "head timeout");
//! assert_eq!(timers.time_to_next(now), Some(Duration::from_secs(5)));
//! assert_eq!(timers.pop_due(now), None);
//! assert_eq!(timers.pop_due(now + Duration::from_secs(5)), Some("head timeout"));
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry<T> {
    at: Instant,
    /// Insertion order, so equal deadlines fire first-in first-out and `T`
    /// needs no ordering of its own.
    order: u64,
    what: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// A set of pending deadlines carrying a `T` each.
#[derive(Debug)]
pub struct Timers<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    next_order: u64,
}

impl<T> Default for Timers<T> {
    fn default() -> Self {
        Timers {
            heap: BinaryHeap::new(),
            next_order: 0,
        }
    }
}

impl<T> Timers<T> {
    /// Adds a deadline.
    pub fn schedule(&mut self, at: Instant, what: T) {
        let order = self.next_order;
        self.next_order += 1;
        self.heap.push(Reverse(Entry { at, order, what }));
    }

    /// The earliest deadline, if any.
    pub fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(entry)| entry.at)
    }

    /// How long until the earliest deadline (zero if already due).
    pub fn time_to_next(&self, now: Instant) -> Option<Duration> {
        self.heap
            .peek()
            .map(|Reverse(entry)| entry.at.saturating_duration_since(now))
    }

    /// Removes and returns the next deadline that is due, if any.
    pub fn pop_due(&mut self, now: Instant) -> Option<T> {
        if self.heap.peek()?.0.at > now {
            return None;
        }
        self.heap.pop().map(|Reverse(entry)| entry.what)
    }

    /// Deadlines pending, due or not.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_timers_pop_in_deadline_then_insertion_order() {
        let start = Instant::now();
        let mut timers = Timers::default();
        timers.schedule(start + Duration::from_millis(20), "late");
        timers.schedule(start + Duration::from_millis(10), "first");
        timers.schedule(start + Duration::from_millis(10), "second");
        assert_eq!(timers.time_to_next(start), Some(Duration::from_millis(10)));
        assert_eq!(timers.pop_due(start), None);
        let later = start + Duration::from_millis(15);
        assert_eq!(timers.pop_due(later), Some("first"));
        assert_eq!(timers.pop_due(later), Some("second"));
        assert_eq!(timers.pop_due(later), None);
        assert_eq!(
            timers.pop_due(start + Duration::from_millis(30)),
            Some("late")
        );
        assert_eq!(timers.time_to_next(start), None);
    }

    #[test]
    fn a_slot_reused_by_a_later_connection_tells_its_stale_timer_apart() {
        // As an event loop keys its connections: (connection id, slab key).
        let start = Instant::now();
        let mut timers: Timers<(u64, usize)> = Timers::default();
        timers.schedule(start + Duration::from_millis(10), (1, 0));
        timers.schedule(start + Duration::from_millis(30), (2, 0));
        timers.schedule(start + Duration::from_millis(20), (3, 1));
        assert_eq!(timers.len(), 3);
        assert_eq!(timers.next_at(), Some(start + Duration::from_millis(10)));
        let live = [(0usize, 2u64), (1, 3)];
        let now = start + Duration::from_millis(25);
        let mut fired = Vec::new();
        while let Some((id, key)) = timers.pop_due(now) {
            if live.contains(&(key, id)) {
                fired.push((id, key));
            }
        }
        assert_eq!(fired, vec![(3, 1)]);
        assert_eq!(timers.next_at(), Some(start + Duration::from_millis(30)));
        assert_eq!(
            timers.pop_due(start + Duration::from_millis(30)),
            Some((2, 0))
        );
        assert!(timers.is_empty());
        assert_eq!(timers.next_at(), None);
    }
}
