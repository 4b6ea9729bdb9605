//! Deadlines for the reactor thread: a min-heap of instants. The reactor
//! sleeps in `poll` until the earliest one; nothing ever sleeps on the
//! reactor thread.
//!
//! Timers are not cancelled; whoever handles a fired timer checks whether
//! it still matters (a connection may be gone, a buffer already drained).

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
}
