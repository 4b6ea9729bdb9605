//! The kernel's metrics: a [`Snapshot`] of every subsystem gathered on the
//! reactor once a second and published for the `[metrics] listen` thread
//! and METRICS to render (docs/observability.md lists them).

use std::collections::BTreeMap;
use std::time::Instant;

use super::Kernel;
use crate::telemetry::metrics::Snapshot;

impl Kernel {
    /// Publishes a snapshot if one is due.
    pub(super) fn publish_metrics_if_due(&mut self, now: Instant) {
        if self.metrics.due(now) {
            self.agents
                .sample_usage(&super::agent_sandboxes(&mut self.sandboxes));
            let snapshot = self.metrics_snapshot();
            self.metrics.published.publish(snapshot);
        }
    }

    /// CPU over every agent, and what each boot agent uses (the only
    /// agents named: their number is the configuration's).
    fn add_agent_usage(&self, snapshot: &mut Snapshot) {
        const MICROS: f64 = 1e6;
        let cpu = self.agents.cpu_totals();
        snapshot.seconds_counter(
            "agentos_agents_cpu",
            "CPU time agents used (running ones as last sampled: boot agents each second, \
             others in turn).",
            &[],
            cpu.usage_usec as f64 / MICROS,
        );
        snapshot.seconds_counter(
            "agentos_agents_cpu_throttled",
            "Time CPU quotas kept agents stopped (cgroup throttling).",
            &[],
            cpu.throttled_usec as f64 / MICROS,
        );
        snapshot.counter(
            "agentos_agents_cpu_throttled_periods",
            "Scheduling periods in which a CPU quota stopped an agent.",
            &[],
            cpu.nr_throttled,
        );
        for (name, usage) in self.agents.boot_usage() {
            let agent = [("agent", name)];
            snapshot.seconds_counter(
                "agentos_agent_cpu",
                "CPU time a boot agent's current (or last) incarnation used.",
                &agent,
                usage.cpu_usage_usec as f64 / MICROS,
            );
            snapshot.seconds_counter(
                "agentos_agent_cpu_throttled",
                "Time its CPU quota kept a boot agent's incarnation stopped.",
                &agent,
                usage.throttled_usec as f64 / MICROS,
            );
            snapshot.gauge(
                "agentos_agent_memory_bytes",
                "Memory a boot agent's sandbox uses now.",
                &agent,
                usage.memory_current as i64,
            );
        }
    }

    /// What every subsystem counts now.
    pub fn metrics_snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        let mut agents: BTreeMap<&str, i64> = BTreeMap::new();
        for state in self.agents.states() {
            *agents.entry(state.as_str()).or_default() += 1;
        }
        for (state, count) in agents {
            snapshot.gauge(
                "agentos_agents",
                "Agents the kernel knows, by state (ended ones until they are forgotten).",
                &[("state", state)],
                count,
            );
        }
        self.add_agent_usage(&mut snapshot);
        self.llm.add_metrics(&mut snapshot);
        let counts = self.agents.counts;
        snapshot.counter(
            "agentos_agent_restarts",
            "Agent restarts the restart policies made.",
            &[],
            counts.restarts,
        );
        snapshot.counter(
            "agentos_agent_oom_kills",
            "Processes the memory limit killed in agents' sandboxes.",
            &[],
            counts.oom_kills,
        );
        snapshot.gauge(
            "agentos_think_queued",
            "THINK requests waiting in the fair queue.",
            &[],
            self.llm.queued() as i64,
        );
        self.exec.add_metrics(&mut snapshot);
        snapshot.gauge(
            "agentos_exec_ready_runs",
            "EXEC run sandboxes prepared and waiting for code.",
            &[],
            self.exec.ready_runs() as i64,
        );
        let mut tasks: BTreeMap<&str, i64> = BTreeMap::new();
        for state in self.tasks.states() {
            *tasks.entry(state.as_str()).or_default() += 1;
        }
        for (state, count) in tasks {
            snapshot.gauge(
                "agentos_tasks",
                "Tasks kept, by state.",
                &[("state", state)],
                count,
            );
        }
        self.tools.add_metrics(&mut snapshot);
        self.reactor_counts.add_to(&mut snapshot);
        if let Some(exporter) = self.tracer.exporter() {
            use std::sync::atomic::Ordering::Relaxed;
            let counts = &exporter.counts;
            for (outcome, count) in [
                ("exported", counts.exported.load(Relaxed)),
                ("dropped", counts.dropped.load(Relaxed)),
                ("failed", counts.failed.load(Relaxed)),
            ] {
                snapshot.counter(
                    "agentos_trace_spans",
                    "Finished spans: exported, dropped (the queue was full: the collector too \
                     slow) or failed (the collector down or refusing).",
                    &[("outcome", outcome)],
                    count,
                );
            }
        }
        let network = crate::network::record::every_sandbox();
        for (verdict, count) in [("allowed", network.allowed), ("refused", network.refused)] {
            snapshot.counter(
                "agentos_network_connections",
                "Connection attempts through the egress proxy, allowed or refused.",
                &[("verdict", verdict)],
                count,
            );
        }
        for (direction, bytes) in [("out", network.bytes_out), ("in", network.bytes_in)] {
            snapshot.counter(
                "agentos_network_bytes",
                "Bytes through the egress proxy, out of sandboxes and into them.",
                &[("direction", direction)],
                bytes,
            );
        }
        for server in self.tools.info() {
            snapshot.gauge(
                "agentos_tool_server_up",
                "Whether each configured MCP server is ready (1) or not (0).",
                &[("server", &server.name), ("state", &server.state)],
                i64::from(server.state == "ready"),
            );
        }
        snapshot
    }
}
