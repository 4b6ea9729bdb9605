//! Waits under way: a `wait` on a task that has not finished is answered
//! when the task ends, or with the task as it is when its deadline
//! passes, whichever comes first. A wait answered meanwhile is gone, and
//! its timer does nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;

use crate::address::ReplyTo;

/// Waits by task id.
#[derive(Debug)]
pub struct Waiters {
    /// Each waiter's number and address, by task id.
    waiting: HashMap<String, Vec<(u64, ReplyTo)>>,
    /// When each wait times out.
    timers: Timers<(String, u64)>,
    next: u64,
}

impl Default for Waiters {
    fn default() -> Self {
        Waiters {
            waiting: HashMap::new(),
            timers: Timers::default(),
            next: 1,
        }
    }
}

impl Waiters {
    /// `reply_to` waits for task `id`, until `deadline`.
    pub fn add(&mut self, id: &str, reply_to: ReplyTo, deadline: Instant) {
        let number = self.next;
        self.next += 1;
        self.waiting
            .entry(id.to_owned())
            .or_default()
            .push((number, reply_to));
        self.timers.schedule(deadline, (id.to_owned(), number));
    }

    /// Whether anyone waits for task `id`.
    pub fn waits_for(&self, id: &str) -> bool {
        self.waiting.contains_key(id)
    }

    /// Everyone waiting for task `id`, no longer waiting.
    pub fn take(&mut self, id: &str) -> Vec<ReplyTo> {
        let waiting = self.waiting.remove(id).unwrap_or_default();
        waiting.into_iter().map(|(_, reply_to)| reply_to).collect()
    }

    /// The waits whose deadlines have passed by `now`, no longer waiting:
    /// each task's id and the waiter's address.
    pub fn timed_out(&mut self, now: Instant) -> Vec<(String, ReplyTo)> {
        let mut due = Vec::new();
        while let Some((id, number)) = self.timers.pop_due(now) {
            let Some(waiting) = self.waiting.get_mut(&id) else {
                continue;
            };
            let Some(at) = waiting.iter().position(|(n, _)| *n == number) else {
                continue;
            };
            let (_, reply_to) = waiting.swap_remove(at);
            if waiting.is_empty() {
                self.waiting.remove(&id);
            }
            due.push((id, reply_to));
        }
        due
    }

    /// The waits of a connection that closed are dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiting.retain(|_, waiting| {
            waiting.retain(|(_, reply_to)| reply_to.connection() != Some(serial));
            !waiting.is_empty()
        });
    }

    /// How long until the next wait times out.
    pub fn time_to_next(&self, now: Instant) -> Option<Duration> {
        self.timers.time_to_next(now)
    }
}
