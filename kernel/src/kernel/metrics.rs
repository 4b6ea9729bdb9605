//! The kernel's metrics: a [`Snapshot`] of every subsystem gathered on the
//! reactor once a second and published for the `[metrics] listen` thread
//! and METRICS to render (docs/observability.md lists them).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use super::reactor_counts::ReactorCounts;
use crate::agents::Agents;
use crate::exec::Exec;
use crate::llm::Llm;
use crate::tasks::Tasks;
use crate::telemetry::metrics::Snapshot;
use crate::telemetry::tracer::Tracer;
use crate::tools::servers::Servers;

/// What every subsystem counts now, as read from each: the agents, THINK,
/// EXEC, the tasks, the MCP servers, the reactor, the trace exporter and
/// the egress proxy.
pub fn snapshot(
    agents: &Agents,
    llm: &Llm,
    exec: &Exec,
    tasks: &Tasks,
    tools: &Servers,
    reactor: &ReactorCounts,
    tracer: &Tracer,
) -> Snapshot {
    let mut snapshot = Snapshot::default();
    for (state, count) in count_by(agents.states().map(|state| state.as_str())) {
        snapshot.gauge(
            "agentos_agents",
            "Agents the kernel knows, by state (ended ones until they are forgotten).",
            &[("state", state)],
            count,
        );
    }
    add_agent_usage(&mut snapshot, agents);
    llm.add_metrics(&mut snapshot);
    let counts = agents.counts;
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
        llm.queued() as i64,
    );
    exec.pool().add_metrics(&mut snapshot);
    snapshot.gauge(
        "agentos_exec_ready_runs",
        "EXEC run sandboxes prepared and waiting for code.",
        &[],
        exec.pool().ready_count() as i64,
    );
    for (state, count) in count_by(tasks.states().map(|state| state.as_str())) {
        snapshot.gauge(
            "agentos_tasks",
            "Tasks kept, by state.",
            &[("state", state)],
            count,
        );
    }
    tools.add_metrics(&mut snapshot);
    reactor.add_to(&mut snapshot);
    add_trace_spans(&mut snapshot, tracer);
    add_network(&mut snapshot);
    for server in tools.info() {
        snapshot.gauge(
            "agentos_tool_server_up",
            "Whether each configured MCP server is ready (1) or not (0).",
            &[("server", &server.name), ("state", &server.state)],
            i64::from(server.state == "ready"),
        );
    }
    snapshot
}

/// How many of each state, in the states' order.
fn count_by<'s>(states: impl Iterator<Item = &'s str>) -> BTreeMap<&'s str, i64> {
    let mut counts = BTreeMap::new();
    for state in states {
        *counts.entry(state).or_default() += 1;
    }
    counts
}

/// CPU over every agent, and what each boot agent uses (the only agents
/// named: their number is the configuration's).
fn add_agent_usage(snapshot: &mut Snapshot, agents: &Agents) {
    const MICROS: f64 = 1e6;
    let cpu = agents.cpu_totals();
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
    for (name, usage) in agents.boot_usage() {
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

/// The trace exporter's finished spans, if `[tracing]` is on.
fn add_trace_spans(snapshot: &mut Snapshot, tracer: &Tracer) {
    let Some(exporter) = tracer.exporter() else {
        return;
    };
    let counts = &exporter.counts;
    for (outcome, count) in [
        ("exported", counts.exported.load(Relaxed)),
        ("dropped", counts.dropped.load(Relaxed)),
        ("failed", counts.failed.load(Relaxed)),
    ] {
        snapshot.counter(
            "agentos_trace_spans",
            "Finished spans: exported, dropped (the queue was full: the collector too slow) \
             or failed (the collector down or refusing).",
            &[("outcome", outcome)],
            count,
        );
    }
}

/// What went through the egress proxy, from every sandbox.
fn add_network(snapshot: &mut Snapshot) {
    let network = agentos_egress::record::every_sandbox();
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
}
