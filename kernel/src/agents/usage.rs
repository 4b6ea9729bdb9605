//! What agents' cgroups say, sampled for the metrics: every boot agent at
//! each snapshot, the others a few at a time in turn, so a snapshot costs
//! the reactor a bounded number of cgroup reads however many agents run.

use std::ops::Bound;

use super::counts::CpuTotals;
use super::{Agents, Incarnation};
use crate::cgroup::CgroupStats;
use crate::sandbox::runtime::Sandboxes;

/// Agents other than boot agents whose cgroups one snapshot reads.
const SAMPLED_PER_SNAPSHOT: usize = 32;

impl Agents {
    /// Reads the cgroups of the boot agents and of the next few others.
    pub fn sample_usage(&mut self, sandboxes: &impl Sandboxes<Incarnation>) {
        let mut others = 0;
        let after = (Bound::Excluded(self.sample_cursor), Bound::Unbounded);
        let before = (Bound::Unbounded, Bound::Included(self.sample_cursor));
        let ids: Vec<u32> = self
            .table
            .range(after)
            .chain(self.table.range(before))
            .filter(|(_, agent)| agent.sandbox.is_some())
            .filter(|(_, agent)| {
                agent.boot || {
                    others += 1;
                    others <= SAMPLED_PER_SNAPSHOT
                }
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(agent) = self.table.get_mut(&id) else {
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
    /// running ones as last sampled.
    pub fn cpu_totals(&self) -> CpuTotals {
        let mut totals = self.counts.ended_cpu;
        for agent in self.table.values().filter(|a| a.sandbox.is_some()) {
            totals.add(&agent.sampled);
        }
        totals
    }

    /// Boot agents by name with their current (or last) incarnation's
    /// figures: the only agents the metrics name, so the number of series
    /// stays what the configuration says.
    pub fn boot_usage(&self) -> impl Iterator<Item = (&str, CgroupStats)> + '_ {
        self.table.values().filter(|a| a.boot).map(|agent| {
            let stats = if agent.sandbox.is_some() {
                agent.sampled
            } else {
                agent.last_run
            };
            (agent.name.as_str(), stats)
        })
    }
}
