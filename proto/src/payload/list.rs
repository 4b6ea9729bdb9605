//! LIST (0x12): every known agent, live or recently ended.

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::network::{NetTotals, Network};
use super::parse::parse_empty_or_object;
use super::spawn::{Isolation, Limits, Permissions, RestartPolicy};
use crate::error::ErrorReply;

/// A LIST request: an empty payload (or `{}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ListRequest {}

impl ListRequest {
    /// Parses a LIST payload: empty, or `{}`.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("LIST", payload)
    }
}

/// Memory figures read from the agent's cgroup, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MemoryStats {
    /// Usage now.
    pub current: u64,
    /// Highest usage seen.
    pub peak: u64,
}

/// CPU figures read from the agent's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CpuStats {
    /// CPU time used, in microseconds.
    pub usage_usec: u64,
    /// Periods in which the quota stopped it.
    pub nr_throttled: u64,
    /// Time spent stopped by the quota, in microseconds.
    pub throttled_usec: u64,
}

/// Process figures read from the agent's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PidStats {
    /// Processes and threads now.
    pub current: u64,
    /// The limit.
    pub max: Option<u64>,
}

/// The agent's use of THINK.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LlmStats {
    /// THINK calls answered.
    pub calls: u64,
    /// Tokens charged.
    pub tokens: u64,
    /// Time its THINKs spent waiting in the kernel's queue, in total.
    #[serde(default)]
    pub queue_ms: u64,
}

/// The agent's use of EXEC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecStats {
    /// Runs accepted, its tasks' included.
    pub runs: u64,
}

/// One entry of the LIST reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentInfo {
    /// The id SPAWN returned.
    pub id: u32,
    /// The agent's name.
    pub name: String,
    /// Host pid of its top process, while it has one.
    pub pid: Option<u32>,
    /// Lifecycle state.
    pub state: AgentState,
    /// Repeats `state`.
    pub status: AgentState,
    /// `state == running`.
    pub running: bool,
    /// Exit status, once it exited.
    pub exit_code: Option<i32>,
    /// Terminating signal, if one ended it.
    pub signal: Option<i32>,
    /// Whether the memory cgroup killed it.
    pub oom_killed: bool,
    /// Restarts so far.
    pub restarts: u32,
    /// RFC 3339 UTC time of the current run's start.
    pub started_at: String,
    /// Milliseconds since `started_at` (to the end, once ended).
    pub uptime_ms: u64,
    /// Limits in force.
    pub limits: Limits,
    /// Memory figures.
    pub memory: MemoryStats,
    /// CPU figures.
    pub cpu: CpuStats,
    /// Process figures.
    #[serde(default)]
    pub pids: PidStats,
    /// LLM use.
    pub llm: LlmStats,
    /// EXEC use.
    #[serde(default)]
    pub exec: ExecStats,
    /// Started from the kernel's `[[agents.boot]]` config.
    #[serde(default)]
    pub boot: bool,
    /// Isolation in force.
    pub isolation: Isolation,
    /// The argv it runs; for a script, `[python, script, args...]`.
    #[serde(default)]
    pub command: Vec<String>,
    /// The working directory SPAWN asked for.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Whether SPAWN asked for namespaces and a cgroup (`isolation` says
    /// what is in force).
    #[serde(default)]
    pub sandboxed: bool,
    /// The network in force, as SPAWN's `network` (a policy as the kernel
    /// holds it: a parent's denials added).
    #[serde(default)]
    pub network: Network,
    /// Its connections through the egress proxy, when it has a policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<NetTotals>,
    /// What it may ask of the kernel.
    #[serde(default)]
    pub permissions: Permissions,
    /// When it is restarted.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Restarts allowed within `restart_window`.
    #[serde(default)]
    pub max_restarts: u32,
    /// The restart-counting window, in seconds.
    #[serde(default)]
    pub restart_window: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_empty_object_payloads_are_accepted_and_fields_refused() {
        assert!(ListRequest::parse(b"").is_ok());
        assert!(ListRequest::parse(b"{}").is_ok());
        let err = ListRequest::parse(br#"{"filter":"x"}"#).unwrap_err();
        assert!(err.error.contains("`filter`"), "{}", err.error);
        assert!(ListRequest::parse(b"[1]").is_err());
    }

    #[test]
    fn states_use_protocol_words() {
        let all = [
            AgentState::Starting,
            AgentState::Running,
            AgentState::Paused,
            AgentState::Exited,
            AgentState::Killed,
            AgentState::OomKilled,
            AgentState::Failed,
            AgentState::Restarting,
        ];
        for state in all {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
    }
}
