//! What notifications have said since the fleet thread last looked:
//! flags, not a queue, so a flood of them (any role may send one) costs a
//! few atomic stores and at most one wake-up waiting for the fleet thread.

use std::sync::atomic::{AtomicBool, Ordering};

use super::sessions::SESSIONS_NOTE;

/// Kinds of notification not yet looked at.
#[derive(Debug, Default)]
pub struct Notes {
    /// A task was queued (or a task's end was recorded: room was made).
    queued: AtomicBool,
    /// A task was cancelled.
    cancelled: AtomicBool,
    /// A task ended.
    done: AtomicBool,
    /// The hibernated sessions changed.
    sessions: AtomicBool,
    /// A wake-up is waiting for the fleet thread.
    pending: AtomicBool,
}

/// What the fleet thread is to look at.
#[derive(Clone, Copy, Debug, Default)]
pub struct Looks {
    pub queued: bool,
    pub cancelled: bool,
    pub done: bool,
    pub sessions: bool,
}

impl Notes {
    /// Notes a notification's payload (`queued`, `done:ID`, `cancel:ID`,
    /// `sessions`, or anything: a wake-up). True when the fleet thread is to be woken:
    /// no wake-up waits for it already.
    pub fn note(&self, payload: &str) -> bool {
        let kind = match payload.split_once(':') {
            Some(("done", _)) => &self.done,
            Some(("cancel", _)) => &self.cancelled,
            _ if payload == SESSIONS_NOTE => &self.sessions,
            _ => &self.queued,
        };
        kind.store(true, Ordering::Release);
        !self.pending.swap(true, Ordering::AcqRel)
    }

    /// The wake-up could not be sent: the next note sends one.
    pub fn unwake(&self) {
        self.pending.store(false, Ordering::Release);
    }

    /// Takes what was noted.
    pub fn take(&self) -> Looks {
        self.pending.store(false, Ordering::Release);
        Looks {
            queued: self.queued.swap(false, Ordering::AcqRel),
            cancelled: self.cancelled.swap(false, Ordering::AcqRel),
            done: self.done.swap(false, Ordering::AcqRel),
            sessions: self.sessions.swap(false, Ordering::AcqRel),
        }
    }
}
