//! Restart policy: whether an agent that ended runs again, and after how
//! long. Backoff starts at 1 s and doubles per restart still inside the
//! window, capped at 60 s; once `max_restarts` restarts fall inside
//! `restart_window`, the agent is `failed` for good.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use agentos_proto::payload::RestartPolicy;

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How an incarnation ended, as far as the policy cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Exit status 0.
    Success,
    /// Non-zero exit, a signal, an OOM kill, or a failed start.
    Failure,
    /// KILL or kernel shutdown: never restarted.
    Stopped,
}

/// What happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run again after this delay.
    RestartAfter(Duration),
    /// Done: the policy does not restart this ending.
    Rest,
    /// Done: restarts are used up.
    GiveUp,
}

/// An agent's restart bookkeeping.
#[derive(Clone, Debug)]
pub struct Restarts {
    policy: RestartPolicy,
    max: u32,
    window: Duration,
    /// When each restart happened, oldest first, within the window.
    recent: VecDeque<Instant>,
    /// Restarts over the agent's whole life.
    pub total: u32,
}

impl Restarts {
    /// Bookkeeping for a policy.
    pub fn new(policy: RestartPolicy, max: u32, window: Duration) -> Restarts {
        Restarts {
            policy,
            max,
            window,
            recent: VecDeque::new(),
            total: 0,
        }
    }

    /// Decides what follows an ending at `now`, and records the restart if
    /// there is one.
    pub fn decide(&mut self, end: Ending, now: Instant) -> Decision {
        let wanted = match (self.policy, end) {
            (_, Ending::Stopped) | (RestartPolicy::Never, _) => false,
            (RestartPolicy::OnFailure, Ending::Success) => false,
            (RestartPolicy::OnFailure, Ending::Failure) | (RestartPolicy::Always, _) => true,
        };
        if !wanted {
            return Decision::Rest;
        }
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max as usize {
            return Decision::GiveUp;
        }
        let doublings = self.recent.len().min(16) as u32;
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF);
        self.recent.push_back(now);
        self.total += 1;
        Decision::RestartAfter(backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn never_means_never_and_stops_are_final() {
        let now = Instant::now();
        let mut never = Restarts::new(RestartPolicy::Never, 5, secs(300));
        assert_eq!(never.decide(Ending::Failure, now), Decision::Rest);
        let mut always = Restarts::new(RestartPolicy::Always, 5, secs(300));
        assert_eq!(always.decide(Ending::Stopped, now), Decision::Rest);
    }

    #[test]
    fn on_failure_restarts_failures_only() {
        let now = Instant::now();
        let mut restarts = Restarts::new(RestartPolicy::OnFailure, 5, secs(300));
        assert_eq!(restarts.decide(Ending::Success, now), Decision::Rest);
        assert_eq!(
            restarts.decide(Ending::Failure, now),
            Decision::RestartAfter(secs(1))
        );
    }

    #[test]
    fn backoff_doubles_caps_and_gives_up_within_the_window() {
        let start = Instant::now();
        let mut restarts = Restarts::new(RestartPolicy::Always, 8, secs(3600));
        let delays: Vec<Decision> = (0..9)
            .map(|i| restarts.decide(Ending::Success, start + secs(i)))
            .collect();
        assert_eq!(
            delays,
            vec![
                Decision::RestartAfter(secs(1)),
                Decision::RestartAfter(secs(2)),
                Decision::RestartAfter(secs(4)),
                Decision::RestartAfter(secs(8)),
                Decision::RestartAfter(secs(16)),
                Decision::RestartAfter(secs(32)),
                Decision::RestartAfter(secs(60)),
                Decision::RestartAfter(secs(60)),
                Decision::GiveUp,
            ]
        );
        assert_eq!(restarts.total, 8);
    }

    #[test]
    fn restarts_outside_the_window_are_forgiven() {
        let start = Instant::now();
        let mut restarts = Restarts::new(RestartPolicy::Always, 2, secs(10));
        assert!(matches!(
            restarts.decide(Ending::Failure, start),
            Decision::RestartAfter(_)
        ));
        assert!(matches!(
            restarts.decide(Ending::Failure, start + secs(1)),
            Decision::RestartAfter(_)
        ));
        assert_eq!(
            restarts.decide(Ending::Failure, start + secs(2)),
            Decision::GiveUp
        );
        assert_eq!(
            restarts.decide(Ending::Failure, start + secs(20)),
            Decision::RestartAfter(secs(1))
        );
    }
}
