//! The proxy's log lines, within a budget per endpoint: a flood of
//! connections is summed up once a second instead of logged line by line.
//! The counting is `agentos_primitives::log_throttle`'s; what is said
//! about the lines left out is here.

use std::time::{Duration, Instant};

use agentos_primitives::log_throttle::LogThrottle;

/// Lines one endpoint may log in a second.
const LINES_PER_SECOND: u32 = 20;

/// One endpoint's budget.
#[derive(Debug)]
pub struct LogBudget {
    throttle: LogThrottle,
}

impl Default for LogBudget {
    fn default() -> LogBudget {
        LogBudget {
            throttle: LogThrottle::new(LINES_PER_SECOND, Duration::from_secs(1)),
        }
    }
}

impl LogBudget {
    /// Whether one more line about `label` may go out at `now`; counted as
    /// left out if not. Lines left out in a second that is over are summed
    /// up first, if the loop's tick has not done it yet.
    pub fn allow(&mut self, label: &str, now: Instant) -> bool {
        match self.throttle.allow(now) {
            None => false,
            Some(left_out) => {
                sum_up(label, left_out);
                true
            }
        }
    }

    /// Sums up the lines about `label` left out, once the second they were
    /// left out in is over: how many, if any.
    pub fn tick(&mut self, label: &str, now: Instant) -> Option<u64> {
        let left_out = self.throttle.summary(now)?;
        sum_up(label, left_out);
        Some(left_out)
    }
}

fn sum_up(label: &str, left_out: u64) {
    if left_out > 0 {
        log::warn!(
            "network: {label}: {left_out} more connection log lines in the last second were left out"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_few_lines_and_counts_the_rest() {
        let mut budget = LogBudget::default();
        let start = Instant::now();
        let allowed = (0..1000)
            .filter(|_| budget.allow("agent flood", start))
            .count();
        assert_eq!(allowed, LINES_PER_SECOND as usize);
        assert_eq!(budget.tick("agent flood", start), None);
        let second_later = start + Duration::from_secs(1);
        assert_eq!(
            budget.tick("agent flood", second_later),
            Some(1000 - u64::from(LINES_PER_SECOND))
        );
        assert!(budget.allow("agent flood", second_later));
    }
}
