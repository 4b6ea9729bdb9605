//! A log line that others can trigger at will, let through at most N times
//! an interval, counting what it held back.
//!
//! A client that sends garbage, a sandbox that opens a thousand
//! connections: each would be worth a line, and a flood of them would make
//! the log the sender's megaphone (and the disk its target). A throttle
//! lets the first few of an interval through and counts the rest; the
//! count goes out with the next line let through, or in a summary line of
//! its own for a loop that ticks.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use agentos_primitives::log_throttle::LogThrottle;
//!
//! let mut refusals = LogThrottle::once_per(Duration::from_secs(1));
//! let now = Instant::now();
//! assert_eq!(refusals.allow(now), Some(0));
//! assert_eq!(refusals.allow(now), None);
//! assert_eq!(refusals.allow(now), None);
//! // A second later the next one goes out, saying two were held back.
//! assert_eq!(refusals.allow(now + Duration::from_secs(1)), Some(2));
//! ```

use std::time::{Duration, Instant};

/// Lets at most `lines` lines through per `interval`, counting the rest.
///
/// An interval starts with the first line after the last one ended, so a
/// quiet throttle lets the next line through at once.
#[derive(Debug)]
pub struct LogThrottle {
    lines: u32,
    interval: Duration,
    /// When the current interval began, if one has.
    since: Option<Instant>,
    /// Lines let through in the current interval.
    used: u32,
    /// Lines held back and not yet reported.
    suppressed: u64,
}

impl LogThrottle {
    /// At most `lines` lines every `interval`.
    pub fn new(lines: u32, interval: Duration) -> LogThrottle {
        LogThrottle {
            lines,
            interval,
            since: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// At most one line every `interval`.
    pub fn once_per(interval: Duration) -> LogThrottle {
        LogThrottle::new(1, interval)
    }

    /// `Some(n)`: log the line now, mentioning the `n` held back since the
    /// last count was reported. `None`: it is held back (and counted).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self.interval_over(now) {
            self.since = Some(now);
            self.used = 0;
        }
        if self.used < self.lines {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    /// Once the current interval is over, the lines it held back (if any),
    /// for a summary line: a loop that ticks reports a flood when it ends,
    /// not only when the next line comes. The next line starts a new
    /// interval.
    pub fn summary(&mut self, now: Instant) -> Option<u64> {
        if !self.interval_over(now) {
            return None;
        }
        self.since = None;
        self.used = 0;
        let suppressed = std::mem::take(&mut self.suppressed);
        (suppressed > 0).then_some(suppressed)
    }

    fn interval_over(&self, now: Instant) -> bool {
        self.since
            .is_none_or(|since| now.saturating_duration_since(since) >= self.interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn once_a_second_lets_one_through_and_the_next_reports_the_rest() {
        let start = Instant::now();
        let mut throttle = LogThrottle::once_per(SECOND);
        assert_eq!(throttle.allow(start), Some(0));
        for ms in [1, 500, 999] {
            assert_eq!(throttle.allow(start + Duration::from_millis(ms)), None);
        }
        let next = start + SECOND;
        assert_eq!(throttle.allow(next), Some(3));
        assert_eq!(throttle.allow(next), None);
        // The interval runs from the line let through, not from the last tried.
        assert_eq!(throttle.allow(next + SECOND), Some(1));
    }

    #[test]
    fn a_flood_logs_a_few_lines_a_second_and_sums_up_the_rest() {
        let start = Instant::now();
        let mut budget = LogThrottle::new(20, SECOND);
        let allowed = (0..1000).filter(|_| budget.allow(start).is_some()).count();
        assert_eq!(allowed, 20);
        assert_eq!(budget.summary(start + Duration::from_millis(999)), None);
        assert_eq!(budget.summary(start + SECOND), Some(980));
        assert_eq!(budget.summary(start + 2 * SECOND), None);
        assert_eq!(budget.allow(start + 2 * SECOND), Some(0));
    }

    #[test]
    fn a_count_is_reported_once_whichever_asks_first() {
        let start = Instant::now();
        let mut throttle = LogThrottle::new(2, SECOND);
        for _ in 0..5 {
            throttle.allow(start);
        }
        assert_eq!(throttle.allow(start + SECOND), Some(3));
        assert_eq!(throttle.summary(start + 2 * SECOND), None);
    }

    #[test]
    fn a_quiet_throttle_has_nothing_to_sum_up() {
        let mut throttle = LogThrottle::new(3, SECOND);
        assert_eq!(throttle.summary(Instant::now()), None);
    }
}
