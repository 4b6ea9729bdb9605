//! `wait`s for fleet tasks, answered by the fleet thread when a task ends
//! (looked up when a node says one did, and each tick) or when the wait's
//! time is up.

use std::time::{Duration, Instant};

use super::tasks::FleetReach;
use crate::address::ReplyTo;

/// One `wait`.
#[derive(Debug)]
pub struct Wait {
    pub task_id: String,
    pub reach: FleetReach,
    pub reply_to: ReplyTo,
    pub deadline: Instant,
}

/// Every `wait` not yet answered.
#[derive(Debug, Default)]
pub struct Waits {
    waits: Vec<Wait>,
}

/// At most this many waits are held; more are refused (`busy`).
pub const MAX_WAITS: usize = 4096;

impl Waits {
    /// Holds `wait`; gives it back when there are too many already.
    pub fn add(&mut self, wait: Wait) -> Result<(), Wait> {
        if self.waits.len() >= MAX_WAITS {
            return Err(wait);
        }
        self.waits.push(wait);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.waits.is_empty()
    }

    /// The tasks waited for.
    pub fn asked(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.waits.iter().map(|wait| wait.task_id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Takes the waits for `task_id` within which `within` says it is.
    pub fn take(&mut self, task_id: &str, within: impl Fn(&FleetReach) -> bool) -> Vec<Wait> {
        let (taken, kept) = std::mem::take(&mut self.waits)
            .into_iter()
            .partition(|wait| wait.task_id == task_id && within(&wait.reach));
        self.waits = kept;
        taken
    }

    /// Takes the waits whose time is up.
    pub fn timed_out(&mut self, now: Instant) -> Vec<Wait> {
        let (taken, kept) = std::mem::take(&mut self.waits)
            .into_iter()
            .partition(|wait| wait.deadline <= now);
        self.waits = kept;
        taken
    }

    /// Until the next wait's time is up.
    pub fn time_to_next(&self, now: Instant) -> Option<Duration> {
        self.waits
            .iter()
            .map(|wait| wait.deadline.saturating_duration_since(now))
            .min()
    }
}
