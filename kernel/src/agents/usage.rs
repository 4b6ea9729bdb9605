//! What the metrics count of agents since the kernel started, and what
//! agents' cgroups say, sampled for them: every boot agent at each
//! snapshot, the others a few at a time in turn, so a snapshot costs the
//! reactor a bounded number of cgroup reads however many agents run.

use super::record::Incarnation;
use super::table::Table;
use crate::cgroup::CgroupStats;
use crate::sandbox::runtime::Sandboxes;

/// Agents other than boot agents whose cgroups one snapshot reads.
const SAMPLED_PER_SNAPSHOT: usize = 32;

/// Events the metrics count since the kernel started, and where the
/// sampling of agents' cgroups has got to.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentCounts {
    /// Restarts the restart policy made.
    pub restarts: u64,
    /// Processes the memory controller killed, in agents' sandboxes.
    pub oom_kills: u64,
    /// CPU figures of the incarnations that have ended.
    pub ended_cpu: CpuTotals,
    /// The last agent other than a boot agent whose cgroup was sampled.
    sample_cursor: u32,
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

impl AgentCounts {
    /// Reads the cgroups of the boot agents of `table` and of the next
    /// few others.
    pub fn sample(&mut self, table: &mut Table, sandboxes: &impl Sandboxes<Incarnation>) {
        let mut others = 0;
        let ids: Vec<u32> = table
            .around_after(self.sample_cursor)
            .filter(|agent| agent.sandbox.is_some())
            .filter(|agent| {
                agent.boot || {
                    others += 1;
                    others <= SAMPLED_PER_SNAPSHOT
                }
            })
            .map(|agent| agent.id)
            .collect();
        for id in ids {
            let Some(agent) = table.get_mut(id) else {
                continue;
            };
            if let Some(stats) = agent.sandbox.and_then(|key| sandboxes.usage(key)) {
                agent.sampled = stats;
            }
            if !agent.boot {
                self.sample_cursor = id;
            }
        }
    }

    /// CPU used and throttled by every agent: ended incarnations in full,
    /// the running ones of `table` as last sampled.
    pub fn cpu_totals(&self, table: &Table) -> CpuTotals {
        let mut totals = self.ended_cpu;
        for agent in table.values().filter(|a| a.sandbox.is_some()) {
            totals.add(&agent.sampled);
        }
        totals
    }
}

/// The boot agents of `table` by name with their current (or last)
/// incarnation's figures: the only agents the metrics name, so the number
/// of series stays what the configuration says.
pub fn boot_usage(table: &Table) -> impl Iterator<Item = (&str, CgroupStats)> + '_ {
    table.values().filter(|a| a.boot).map(|agent| {
        let stats = if agent.sandbox.is_some() {
            agent.sampled
        } else {
            agent.last_run
        };
        (agent.name.as_str(), stats)
    })
}
