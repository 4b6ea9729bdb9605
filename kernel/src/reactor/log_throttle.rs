//! A warning that clients can trigger at will, let through at most once a
//! second.

use std::time::{Duration, Instant};

/// Lets a repeatable warning through at most once a second, counting what
/// it held back: clients can trigger some warnings at will, and the log
/// must not become their megaphone.
#[derive(Debug, Default)]
pub struct LogThrottle {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// `Some(n)`: log now, mentioning `n` suppressed since the last one.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}
