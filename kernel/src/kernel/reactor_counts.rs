//! What only the reactor knows for the metrics: its turns, the
//! connections, the worker queue.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::telemetry::metrics::{Histogram, Snapshot, TURN_BUCKETS};

/// What the reactor counts for the metrics: it owns the connections and
/// the turns, and writes these as plain data each turn.
#[derive(Clone, Debug)]
pub struct ReactorCounts {
    turns: Histogram,
    /// Connections open now, of which agents' (runs' and operators' are
    /// the rest).
    pub connections: usize,
    pub agent_connections: usize,
    /// Connections refused at the door, by error code.
    refused: BTreeMap<&'static str, u64>,
    /// Jobs waiting for a worker thread.
    pub worker_jobs_queued: usize,
}

impl Default for ReactorCounts {
    fn default() -> Self {
        ReactorCounts {
            turns: Histogram::new(&TURN_BUCKETS),
            connections: 0,
            agent_connections: 0,
            refused: BTreeMap::new(),
            worker_jobs_queued: 0,
        }
    }
}

impl ReactorCounts {
    /// A turn of the reactor, from waking to sleeping again: how long an
    /// event that came in during it may have waited.
    pub fn turn(&mut self, took: Duration) {
        self.turns.observe(took.as_secs_f64());
    }

    /// A connection refused with `code`.
    pub fn refused(&mut self, code: &'static str) {
        *self.refused.entry(code).or_default() += 1;
    }

    pub(super) fn add_to(&self, snapshot: &mut Snapshot) {
        snapshot.seconds(
            "agentos_reactor_turn_duration",
            "Time each turn of the reactor took, from waking to sleeping again: how long a \
             request may wait behind others.",
            &[],
            &self.turns,
        );
        let operators = self.connections.saturating_sub(self.agent_connections);
        for (peer, count) in [("agent", self.agent_connections), ("other", operators)] {
            snapshot.gauge(
                "agentos_connections",
                "Connections open to the kernel: agents', and the rest (operators and EXEC \
                 runs).",
                &[("peer", peer)],
                count as i64,
            );
        }
        for (code, count) in &self.refused {
            snapshot.counter(
                "agentos_connections_refused",
                "Connections the kernel refused at the door, by error code (busy: no room; \
                 permission_denied: not an operator).",
                &[("code", code)],
                *count,
            );
        }
        snapshot.gauge(
            "agentos_worker_jobs_queued",
            "Requests waiting for one of the kernel's worker threads.",
            &[],
            self.worker_jobs_queued as i64,
        );
    }
}
