//! What EXEC counts for the kernel's metrics: runs by how they ended, and
//! how long they took.

use std::collections::BTreeMap;
use std::time::Duration;

use agentos_proto::payload::ExecReply;

use crate::telemetry::metrics::{Histogram, Snapshot, LATENCY_BUCKETS};

/// EXEC's counters, kept on the reactor.
#[derive(Clone, Debug)]
pub struct ExecCounts {
    ended: BTreeMap<&'static str, u64>,
    duration: Histogram,
    refill: Histogram,
    waited: Histogram,
}

/// Buckets of the wait for a run sandbox, in seconds: a ready one is taken
/// in microseconds, so the first buckets are finer than latency's.
const WAIT_BUCKETS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256,
    0.512, 1.024,
];

impl Default for ExecCounts {
    fn default() -> Self {
        ExecCounts {
            ended: BTreeMap::new(),
            duration: Histogram::new(&LATENCY_BUCKETS),
            refill: Histogram::new(&LATENCY_BUCKETS),
            waited: Histogram::new(&WAIT_BUCKETS),
        }
    }
}

impl ExecCounts {
    /// A run has ended with `reply`.
    pub fn ended(&mut self, reply: &ExecReply) {
        let outcome = if reply.timed_out {
            "timeout"
        } else if reply.oom_killed {
            "oom"
        } else if reply.code.is_some() {
            "error"
        } else if reply.success {
            "ok"
        } else {
            "failed"
        };
        *self.ended.entry(outcome).or_default() += 1;
        self.duration.observe(reply.duration_ms as f64 / 1000.0);
    }

    /// A run child arrived `took` after it was asked for.
    pub fn refilled(&mut self, took: Duration) {
        self.refill.observe(took.as_secs_f64());
    }

    /// A run started `waited` after it arrived (waiting for a sandbox, or
    /// for its owner's share).
    pub fn started(&mut self, waited: Duration) {
        self.waited.observe(waited.as_secs_f64());
    }

    /// Adds EXEC's series to `snapshot`.
    pub fn add_to(&self, snapshot: &mut Snapshot) {
        for (outcome, count) in &self.ended {
            snapshot.counter(
                "agentos_exec_runs",
                "EXEC runs ended, by outcome (ok, failed: a non-zero exit, timeout, oom, error: \
                 could not run).",
                &[("outcome", outcome)],
                *count,
            );
        }
        snapshot.seconds(
            "agentos_exec_run_duration",
            "Wall-clock time of EXEC runs.",
            &[],
            &self.duration,
        );
        snapshot.seconds(
            "agentos_exec_refill",
            "Time from asking an EXEC host for a fresh run sandbox to having it ready.",
            &[],
            &self.refill,
        );
        snapshot.seconds(
            "agentos_exec_wait",
            "Time from an EXEC run's arrival to its start in a run sandbox (none ready, or \
             its owner's share in use).",
            &[],
            &self.waited,
        );
    }
}
