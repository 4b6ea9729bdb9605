//! One agent: what was asked for, what is running, how it ended.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use super::inheritance::Grant;
use super::isolation::shape_of;
use super::program::Program;
use super::restart::Restarts;
use crate::address::ReplyTo;
use crate::cgroup::CgroupStats;
use crate::clock::rfc3339;
use crate::permissions::Budget;
use crate::sandbox::attach::VolumePlace;
use crate::sandbox::plan::Shape;
use crate::sandbox::runtime::{DoorKey, SandboxKey, Sandboxes};
use agentos_egress::gateway::net_totals;
use agentos_egress::record::Record as NetRecord;
use agentos_egress::{Egress, Endpoint};
use agentos_proto::payload::{
    AgentInfo, AgentState, CpuStats, ExecStats, Isolation, Limits, LlmStats, MemoryStats,
    Permissions, PidStats, SpawnRequest,
};

/// One incarnation of an agent (it has one more each time it restarts):
/// what owns a sandbox. An incarnation's events carry its number, so events
/// of an earlier one are recognised as stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// The agent.
    pub agent: u32,
    /// Which of its incarnations.
    pub number: u32,
}

/// Why an agent is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A KILL request.
    Kill,
    /// A KILL request with `restart`: the agent starts again once stopped.
    Restart,
    /// The kernel is shutting down.
    Shutdown,
}

/// What a restart did first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restarted {
    /// A live incarnation is being stopped; the next starts once it ends.
    AfterStop,
    /// The agent had ended; it is starting now.
    FromEnded,
}

/// A SPAWN waiting for the agent's first incarnation to start.
#[derive(Clone, Debug)]
pub struct SpawnWaiter {
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// Whether an agent asked: its reply has no host pid in it.
    pub by_agent: bool,
    /// What the reply warns of (see `interpreter`).
    pub warnings: Vec<String>,
}

/// How the current or last incarnation's workload fared, from the status
/// pipe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadReport {
    /// The workload was exec'd.
    pub ready: bool,
    /// Setup failed: the code and message of the `error` line.
    pub start_error: Option<(agentos_proto::ErrorCode, String)>,
    /// The workload's exit code.
    pub exit_code: Option<i32>,
    /// The signal that ended the workload.
    pub signal: Option<i32>,
}

/// An agent the kernel knows.
#[derive(Debug)]
pub struct Agent {
    /// The id SPAWN returned.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// The agent that spawned it, if an agent did (for a child an agent's
    /// EXEC run spawned: that agent).
    pub parent: Option<u32>,
    /// The EXEC run that spawned it (or spawned the agent that spawned it),
    /// if one did: it is the run's to see, kill and read, and ends when the
    /// run does.
    pub started_by: Option<u64>,
    /// The eldest ancestor it had when spawned (itself, if none): its
    /// family, whose members share EXEC and LOGS as one.
    pub root: u32,
    /// The uid of the operator whose tree it is in (who spawned it, or
    /// its eldest ancestor): the tree shares that uid's state store.
    pub owner_uid: u32,
    /// What SPAWN asked for (kept for restarts).
    pub request: SpawnRequest,
    /// What it may reach (its request's `network`, as the kernel reads it).
    pub egress: Egress,
    /// Its endpoint on the egress proxy, while an incarnation with a
    /// policy runs.
    pub endpoint: Option<Endpoint>,
    /// The record of its latest endpoint (kept when that closes).
    pub net_record: Option<Arc<Mutex<NetRecord>>>,
    /// What runs.
    pub program: Program,
    /// The disks mounted in its sandbox, each incarnation's: its
    /// template's environment, its volumes.
    pub volumes: Vec<VolumePlace>,
    /// Limits in force.
    pub limits: Limits,
    /// What it may ask of the kernel.
    pub permissions: Permissions,
    /// The token budgets it draws on: its own, then its ancestors'.
    pub budgets: Vec<Budget>,
    /// Isolation in force.
    pub isolation: Isolation,
    /// Lifecycle state.
    pub state: AgentState,
    /// Incarnations so far; an incarnation's events carry its number, so
    /// stale ones are
    /// recognised.
    pub incarnation: u32,
    /// The sandbox of the current incarnation.
    pub sandbox: Option<SandboxKey>,
    /// The current incarnation's init pid on the host.
    pub pid: Option<i32>,
    /// What the status pipe said about the current or last incarnation.
    pub workload: WorkloadReport,
    /// Whether the memory controller killed one of its processes (this
    /// incarnation).
    pub oom_killed: bool,
    /// Restart bookkeeping.
    pub restarts: Restarts,
    /// When the current incarnation began.
    pub started_at: SystemTime,
    /// The same, for durations.
    pub started: Instant,
    /// When the agent ended for good.
    pub ended: Option<Instant>,
    /// Why it is being stopped, once asked.
    pub stop: Option<StopReason>,
    /// A SPAWN waiting for the first incarnation to start.
    pub spawn_reply: Option<SpawnWaiter>,
    /// Its own socket, while it lives.
    pub door: Option<DoorKey>,
    /// Its log file.
    pub log: PathBuf,
    /// The last ended incarnation's figures, read just before its cgroup
    /// went, so
    /// LIST still shows what an ended agent used.
    pub last_run: CgroupStats,
    /// The running incarnation's figures when the metrics last read them.
    pub sampled: CgroupStats,
    /// Started from `[[agents.boot]]`.
    pub boot: bool,
}

impl Agent {
    /// Alive: starting, running, or waiting to restart.
    pub fn is_live(&self) -> bool {
        self.state.is_live()
    }

    /// Its current (or last) incarnation.
    pub fn incarnation(&self) -> Incarnation {
        Incarnation {
            agent: self.id,
            number: self.incarnation,
        }
    }

    /// The sandbox shape its incarnations get.
    pub fn shape<O>(&self, sandboxes: &impl Sandboxes<O>) -> Shape {
        shape_of(sandboxes, self.request.sandboxed, &self.egress)
    }

    /// What it was given: the bounds of what it may give a child.
    pub fn grant(&self) -> Grant {
        Grant {
            network: self.egress.clone(),
            limits: self.limits,
            permissions: self.permissions.clone(),
        }
    }

    /// The LIST entry, with `usage` read from the running sandbox's cgroup
    /// now (`None`: the last incarnation's figures stand).
    pub fn info(&self, now: Instant, usage: Option<CgroupStats>) -> AgentInfo {
        let stats = usage.unwrap_or(self.last_run);
        let until = self.ended.unwrap_or(now);
        // The freezer, not the table, knows whether it is paused.
        let state = match self.state {
            AgentState::Running if stats.frozen => AgentState::Paused,
            state => state,
        };
        AgentInfo {
            id: self.id,
            name: self.name.clone(),
            pid: self.pid.map(|p| p as u32),
            state,
            status: state,
            running: state == AgentState::Running,
            exit_code: self.workload.exit_code,
            signal: self.workload.signal,
            oom_killed: self.oom_killed,
            restarts: self.restarts.total,
            started_at: rfc3339(self.started_at),
            uptime_ms: until.saturating_duration_since(self.started).as_millis() as u64,
            limits: self.limits,
            memory: MemoryStats {
                current: stats.memory_current,
                peak: stats.memory_peak,
            },
            cpu: CpuStats {
                usage_usec: stats.cpu_usage_usec,
                nr_throttled: stats.nr_throttled,
                throttled_usec: stats.throttled_usec,
            },
            pids: PidStats {
                current: stats.pids_current,
                max: self.limits.max_pids,
            },
            llm: LlmStats::default(),
            exec: ExecStats::default(),
            boot: self.boot,
            isolation: self.isolation.clone(),
            // The spec, never its environment: values there may be secrets.
            command: self.program.argv.clone(),
            cwd: self.request.cwd.clone(),
            sandboxed: self.request.sandboxed,
            network: self.egress.to_wire(),
            connections: self.net_record.as_deref().map(net_totals),
            permissions: self.permissions.clone(),
            restart_policy: self.request.restart_policy,
            max_restarts: self.request.max_restarts,
            restart_window: self.request.restart_window,
        }
    }
}
