//! The Clove SDK's metrics calls. SYSTEM_METRICS (0xC0): the host's CPU,
//! memory, disk and network, for operators only (they are the whole
//! host's). AGENT_METRICS (0xC1), ALL_AGENT_METRICS (0xC2) and
//! CGROUP_METRICS (0xC3): agents' process and cgroup figures, for the
//! agents the caller may see (LIST's rule), and an agent named by its name
//! or id — `cgroup_path` never names a path. `/proc` is read on a worker.

use agentos_proto::payload::{
    AgentInfo, AgentMetrics, AgentMetricsReply, AgentMetricsRequest, AllAgentMetricsReply,
    CgroupCpu, CgroupMemory, CgroupMetrics, CgroupMetricsReply, CgroupMetricsRequest, CgroupPids,
    KernelStats, MetricsOfAllRequest, SystemMetricsReply,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::list::agents_seen_by;
use super::request::{actor, reply, Outcome, Request};
use crate::address::Answer;
use crate::agents::Viewer;
use crate::kernel::{Actor, Kernel};
use crate::telemetry::host;

/// SYSTEM_METRICS.
pub fn system(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let allowed = MetricsOfAllRequest::parse("SYSTEM_METRICS", request.payload).and_then(|_| {
        match actor(kernel, request)? {
            Actor::Operator { .. } => Ok(()),
            _ => Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "SYSTEM_METRICS is for operators: the figures are the whole host's \
                 (AGENT_METRICS gives an agent its own)",
            )),
        }
    });
    if let Err(refusal) = allowed {
        return Outcome::Reply(refusal.into());
    }
    let sampler = kernel.services.cpu_sampler.clone();
    Outcome::Deferred(Box::new(move || {
        Answer::json(&SystemMetricsReply {
            success: true,
            metrics: host::system(&sampler),
        })
        .into_json()
    }))
}

/// AGENT_METRICS: one agent, the caller itself by default.
pub fn agent(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let found = AgentMetricsRequest::parse(request.payload).and_then(|asked| {
        let id = asked
            .agent_id
            .or(request.caller.identity.agent())
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::BadRequest,
                    "AGENT_METRICS needs `agent_id`: only an agent has figures of its own",
                )
            })?;
        let viewer = actor(kernel, request)?.viewer();
        seen_with_host_pids(kernel, viewer)
            .into_iter()
            .find(|(info, _)| info.id == id)
            .ok_or_else(|| no_agent(&id.to_string()))
    });
    match found {
        Ok((info, pid)) => Outcome::Deferred(Box::new(move || {
            Answer::json(&AgentMetricsReply {
                success: true,
                metrics: agent_metrics(&info, pid),
            })
            .into_json()
        })),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// ALL_AGENT_METRICS: every agent the caller may see.
pub fn all_agents(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let found = MetricsOfAllRequest::parse("ALL_AGENT_METRICS", request.payload).and_then(|_| {
        Ok(seen_with_host_pids(
            kernel,
            actor(kernel, request)?.viewer(),
        ))
    });
    match found {
        Ok(seen) => Outcome::Deferred(Box::new(move || {
            let agents: Vec<AgentMetrics> = seen
                .iter()
                .map(|(info, pid)| agent_metrics(info, *pid))
                .collect();
            Answer::json(&AllAgentMetricsReply {
                success: true,
                count: agents.len() as u64,
                agents,
            })
            .into_json()
        })),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// CGROUP_METRICS: an agent's cgroup, by its name or id (the live one of
/// that name, else the latest); the caller's own by default.
pub fn cgroup(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(
        CgroupMetricsRequest::parse(request.payload).and_then(|asked| {
            let own = request.caller.identity.agent().map(|id| id.to_string());
            let named = asked.cgroup_path.or(own).ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::BadRequest,
                    "CGROUP_METRICS needs `cgroup_path`, an agent's name or id: an operator has \
                 no cgroup of its own",
                )
            })?;
            let viewer = actor(kernel, request)?.viewer();
            let info = agents_seen_by(kernel, viewer)
                .into_iter()
                .filter(|a| a.name == named || a.id.to_string() == named)
                .max_by_key(|a| (a.state.is_live(), a.id))
                .ok_or_else(|| no_agent(&named))?;
            let metrics = cgroup_metrics(&info).ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::Unavailable,
                    format!(
                        "agent {} ({}) has no cgroup: it is not sandboxed, or the kernel has no \
                     cgroups on this host",
                        info.id, info.name
                    ),
                )
            })?;
            Ok(CgroupMetricsReply {
                success: true,
                metrics,
            })
        }),
    )
}

/// The agents `viewer` may see, each with its top process's host pid (to
/// read its `/proc`), whatever pid the viewer is shown.
fn seen_with_host_pids(kernel: &mut Kernel, viewer: Viewer) -> Vec<(AgentInfo, Option<u32>)> {
    agents_seen_by(kernel, viewer)
        .into_iter()
        .map(|info| {
            let pid = kernel.agents.host_pid(info.id);
            (info, pid)
        })
        .collect()
}

fn agent_metrics(info: &AgentInfo, host_pid: Option<u32>) -> AgentMetrics {
    AgentMetrics {
        timestamp: host::now_ms(),
        agent_id: info.id,
        name: info.name.clone(),
        pid: info.pid.unwrap_or(0),
        status: info.state,
        uptime_ms: info.uptime_ms,
        sandboxed: info.isolation.sandboxed,
        process: host_pid.map(host::process).unwrap_or_default(),
        cgroup: cgroup_metrics(info),
        kernel_stats: KernelStats {
            llm_calls: info.llm.calls,
            llm_tokens_used: info.llm.tokens,
            exec_runs: info.exec.runs,
        },
    }
}

/// An agent's cgroup figures as LIST read them, if it has a cgroup.
fn cgroup_metrics(info: &AgentInfo) -> Option<CgroupMetrics> {
    info.isolation.cgroup?;
    Some(CgroupMetrics {
        cgroup_path: info.name.clone(),
        valid: true,
        cpu: CgroupCpu {
            usage_usec: info.cpu.usage_usec,
            throttled_usec: info.cpu.throttled_usec,
            nr_throttled: info.cpu.nr_throttled,
            quota_usec: info.limits.cpu_quota.unwrap_or(0),
            period_usec: info.limits.cpu_period.unwrap_or(0),
        },
        memory: CgroupMemory {
            current: info.memory.current,
            peak: info.memory.peak,
            max: info.limits.memory.unwrap_or(0),
            oom_kills: u64::from(info.oom_killed),
        },
        pids: CgroupPids {
            current: info.pids.current,
            max: info.limits.max_pids.unwrap_or(0),
        },
    })
}

fn no_agent(named: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::NotFound,
        format!("no agent {named} among those this caller may see"),
    )
}
