//! What each MCP server's calls come to, for the kernel's metrics.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::telemetry::metrics::{Histogram, Snapshot, LATENCY_BUCKETS};
use crate::tools::mcp::client::CallOutcome;

/// One server's calls: by outcome, and how long they took.
#[derive(Clone, Debug)]
pub struct ServerCounts {
    ended: BTreeMap<&'static str, u64>,
    duration: Histogram,
}

impl Default for ServerCounts {
    fn default() -> Self {
        ServerCounts {
            ended: BTreeMap::new(),
            duration: Histogram::new(&LATENCY_BUCKETS),
        }
    }
}

impl ServerCounts {
    /// A call ended with `outcome` after `took`.
    pub fn ended(&mut self, outcome: &CallOutcome, took: Duration) {
        let word = match outcome {
            CallOutcome::Done { .. } => "ok",
            CallOutcome::ToolError { .. } => "tool_error",
            CallOutcome::Rejected(_) => "rejected",
            CallOutcome::TimedOut(_) => "timeout",
            CallOutcome::Failed(_) => "failed",
        };
        *self.ended.entry(word).or_default() += 1;
        self.duration.observe(took.as_secs_f64());
    }

    /// Adds server `name`'s series to `snapshot`.
    pub fn add_to(&self, name: &str, snapshot: &mut Snapshot) {
        for (outcome, count) in &self.ended {
            snapshot.counter(
                "agentos_tool_calls",
                "Calls to MCP servers' tools, by server and outcome (ok, tool_error, rejected, \
                 timeout, failed).",
                &[("server", name), ("outcome", outcome)],
                *count,
            );
        }
        snapshot.seconds(
            "agentos_tool_call_duration",
            "Time calls to MCP servers' tools took, by server.",
            &[("server", name)],
            &self.duration,
        );
    }
}
