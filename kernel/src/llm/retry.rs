//! How long to wait before trying a provider again: the provider's own
//! hint when it gave one, else exponential backoff with jitter, so callers
//! that failed together do not come back together.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first backoff delay; each further attempt doubles it.
const BASE: Duration = Duration::from_millis(500);
/// The longest backoff delay.
const CAP: Duration = Duration::from_secs(20);
/// Added on top of a provider's hint, at most, so a crowd told "retry in
/// 2 s" does not return in the same millisecond.
const HINT_JITTER: Duration = Duration::from_millis(250);

/// Backoff delays for one request's attempts.
#[derive(Debug)]
pub struct Backoff {
    /// xorshift state: jitter needs spread, not secrecy.
    state: u64,
}

impl Backoff {
    /// A backoff with its own jitter sequence.
    pub fn new() -> Backoff {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // A stack address differs between threads started at the same time.
        let stack = std::ptr::addr_of!(nanos) as u64;
        Backoff {
            state: (nanos ^ stack.rotate_left(32)) | 1,
        }
    }

    /// The delay before retry number `retry` (0 for the first retry).
    pub fn delay(&mut self, retry: u32, hint: Option<Duration>) -> Duration {
        if let Some(hint) = hint {
            return hint + HINT_JITTER.mul_f64(self.fraction());
        }
        let full = BASE.saturating_mul(1 << retry.min(16)).min(CAP);
        // Equal jitter: at least half the delay, never more than all of it.
        full / 2 + (full / 2).mul_f64(self.fraction())
    }

    /// A number in [0, 1).
    fn fraction(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let mut backoff = Backoff::new();
        for retry in 0..12 {
            let full = BASE.saturating_mul(1 << retry).min(CAP);
            for _ in 0..50 {
                let delay = backoff.delay(retry, None);
                assert!(
                    delay >= full / 2 && delay <= full,
                    "retry {retry}: {delay:?}"
                );
            }
        }
    }

    #[test]
    fn a_hint_is_honoured_with_a_little_spread() {
        let mut backoff = Backoff::new();
        let delays: Vec<Duration> = (0..50)
            .map(|_| backoff.delay(3, Some(Duration::from_secs(2))))
            .collect();
        assert!(delays
            .iter()
            .all(|d| *d >= Duration::from_secs(2) && *d < Duration::from_secs(2) + HINT_JITTER));
        assert!(delays.iter().any(|d| *d != delays[0]), "no jitter at all");
    }
}
