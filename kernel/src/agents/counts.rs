//! What the metrics count of agents since the kernel started.

use crate::cgroup::CgroupStats;

/// Events the metrics count, since the kernel started.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentCounts {
    /// Restarts the restart policy made.
    pub restarts: u64,
    /// Processes the memory controller killed, in agents' sandboxes.
    pub oom_kills: u64,
    /// CPU figures of the incarnations that have ended.
    pub ended_cpu: CpuTotals,
}

/// CPU figures summed over every agent since the kernel started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTotals {
    /// CPU time used, in microseconds.
    pub usage_usec: u64,
    /// Periods in which a CPU quota stopped an agent.
    pub nr_throttled: u64,
    /// Time CPU quotas kept agents stopped, in microseconds.
    pub throttled_usec: u64,
}

impl CpuTotals {
    pub(crate) fn add(&mut self, stats: &CgroupStats) {
        self.usage_usec += stats.cpu_usage_usec;
        self.nr_throttled += stats.nr_throttled;
        self.throttled_usec += stats.throttled_usec;
    }
}
