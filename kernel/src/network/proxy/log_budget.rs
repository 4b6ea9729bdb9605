//! The proxy's log lines, within a budget per sandbox: a flood of
//! connections is summed up once a second instead of logged line by line.

use std::time::{Duration, Instant};

/// Lines one sandbox may log in a second.
const LINES_PER_SECOND: u32 = 20;

/// One sandbox's budget.
#[derive(Debug)]
pub struct LogBudget {
    window: Instant,
    lines: u32,
    suppressed: u64,
}

impl Default for LogBudget {
    fn default() -> LogBudget {
        LogBudget {
            window: Instant::now(),
            lines: 0,
            suppressed: 0,
        }
    }
}

impl LogBudget {
    /// Whether one more line may go out now; counted as left out if not.
    pub fn allow(&mut self) -> bool {
        if self.window.elapsed() >= Duration::from_secs(1) && self.suppressed == 0 {
            self.window = Instant::now();
            self.lines = 0;
        }
        if self.lines < LINES_PER_SECOND {
            self.lines += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// How many lines were left out since the last summary, once a second
    /// has passed (and starts a new second).
    pub fn summary(&mut self) -> Option<u64> {
        if self.window.elapsed() < Duration::from_secs(1) {
            return None;
        }
        self.window = Instant::now();
        self.lines = 0;
        let suppressed = std::mem::take(&mut self.suppressed);
        (suppressed > 0).then_some(suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_few_lines_and_counts_the_rest() {
        let mut budget = LogBudget::default();
        let allowed = (0..1000).filter(|_| budget.allow()).count();
        assert_eq!(allowed, LINES_PER_SECOND as usize);
        assert_eq!(budget.summary(), None);
        budget.window -= Duration::from_secs(1);
        assert_eq!(budget.summary(), Some(1000 - u64::from(LINES_PER_SECOND)));
        assert!(budget.allow());
    }
}
