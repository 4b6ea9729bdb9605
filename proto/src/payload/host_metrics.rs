//! The Clove SDK's metrics calls: SYSTEM_METRICS (0xC0), the host's CPU,
//! memory, disk and network; AGENT_METRICS (0xC1) and ALL_AGENT_METRICS
//! (0xC2), an agent's process and cgroup; CGROUP_METRICS (0xC3), one
//! agent's cgroup. Every figure is a number (a limit that is not set is
//! 0, never the word `max`), so a client can do arithmetic with any of
//! them.

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::parse::{bad_request, parse_empty_or_object, validate_name};
use crate::error::ErrorReply;

/// A SYSTEM_METRICS or ALL_AGENT_METRICS request: empty, or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct MetricsOfAllRequest {}

impl MetricsOfAllRequest {
    /// Parses a SYSTEM_METRICS or ALL_AGENT_METRICS (`what`) payload.
    pub fn parse(what: &str, payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object(what, payload)
    }
}

/// An AGENT_METRICS request: `{"agent_id": N}`, or empty for the caller
/// itself (an agent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentMetricsRequest {
    /// The agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<u32>,
}

impl AgentMetricsRequest {
    /// Parses an AGENT_METRICS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("AGENT_METRICS", payload)
    }
}

/// A CGROUP_METRICS request: `{"cgroup_path": "..."}` names an agent (its
/// name, or its id in digits) whose cgroup to read — never a filesystem
/// path; empty, the caller itself (an agent).
///
/// ```
/// use agentos_proto::payload::CgroupMetricsRequest;
/// let named = CgroupMetricsRequest::parse(br#"{"cgroup_path":"worker-1"}"#).unwrap();
/// assert_eq!(named.cgroup_path.as_deref(), Some("worker-1"));
/// assert!(CgroupMetricsRequest::parse(br#"{"cgroup_path":"../../memory"}"#).is_err());
/// assert!(CgroupMetricsRequest::parse(br#"{"cgroup_path":"agentos/w"}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CgroupMetricsRequest {
    /// The agent whose cgroup to read, by name or id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<String>,
}

impl CgroupMetricsRequest {
    /// Parses a CGROUP_METRICS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: CgroupMetricsRequest = parse_empty_or_object("CGROUP_METRICS", payload)?;
        if let Some(named) = &request.cgroup_path {
            validate_name("cgroup_path", named).map_err(|_| {
                bad_request(format!(
                    "CGROUP_METRICS field `cgroup_path`: {named:?} is not an agent's name or \
                     id; it names an agent you can see, never a path"
                ))
            })?;
        }
        Ok(request)
    }
}

/// SYSTEM_METRICS' reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SystemMetricsReply {
    /// Always true.
    pub success: bool,
    /// The host's figures.
    pub metrics: SystemMetrics,
}

/// The host's figures, as `/proc` gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SystemMetrics {
    /// When they were read, in milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// Processors.
    pub cpu: HostCpu,
    /// Memory.
    pub memory: HostMemory,
    /// Block devices, all together, since boot.
    pub disk: HostDisk,
    /// Network interfaces but loopback, all together, since boot.
    pub network: HostNetwork,
}

/// The host's processors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HostCpu {
    /// Busy share of all processors since the kernel's previous reading
    /// (the first: since boot), 0–100.
    pub percent: f64,
    /// Processors online.
    pub count: u64,
    /// Load averages over 1, 5 and 15 minutes.
    pub load_avg: [f64; 3],
}

/// The host's memory, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HostMemory {
    /// All of it.
    pub total: u64,
    /// What may still be given out without swapping.
    pub available: u64,
    /// `total - available`.
    pub used: u64,
    /// `used` as a share of `total`, 0–100.
    pub percent: f64,
}

/// The host's block devices, in bytes since boot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HostDisk {
    /// Read.
    pub read_bytes: u64,
    /// Written.
    pub write_bytes: u64,
}

/// The host's network interfaces but loopback, in bytes since boot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HostNetwork {
    /// Sent.
    pub bytes_sent: u64,
    /// Received.
    pub bytes_recv: u64,
}

/// AGENT_METRICS' reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentMetricsReply {
    /// Always true.
    pub success: bool,
    /// The agent's figures.
    pub metrics: AgentMetrics,
}

/// ALL_AGENT_METRICS' reply: every agent the caller may see (LIST's rule).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AllAgentMetricsReply {
    /// Always true.
    pub success: bool,
    /// Each agent's figures.
    pub agents: Vec<AgentMetrics>,
    /// How many.
    pub count: u64,
}

/// One agent's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AgentMetrics {
    /// When they were read, in milliseconds since the Unix epoch.
    pub timestamp: u64,
    /// Its id.
    pub agent_id: u32,
    /// Its name.
    pub name: String,
    /// Its top process as the caller sees it (LIST's `pid`; 0 when it has
    /// none, or the caller cannot see it).
    pub pid: u32,
    /// Its state, as LIST says it.
    pub status: AgentState,
    /// Time since it started, in milliseconds.
    pub uptime_ms: u64,
    /// Whether it runs in a sandbox.
    pub sandboxed: bool,
    /// Its top process.
    pub process: ProcessMetrics,
    /// Its cgroup, when it has one.
    pub cgroup: Option<CgroupMetrics>,
    /// What it asked of the kernel.
    pub kernel_stats: KernelStats,
}

/// An agent's top process, from `/proc` (zeros once it is gone).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessMetrics {
    /// Its CPU time.
    pub cpu: ProcessCpu,
    /// Its memory.
    pub memory: ProcessMemory,
    /// Its threads.
    pub threads: u64,
}

/// A process's CPU time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessCpu {
    /// Its CPU time as a share of its life so far, 0–100 per processor.
    pub percent: f64,
    /// In user mode, in milliseconds.
    pub time_user_ms: u64,
    /// In the kernel, in milliseconds.
    pub time_system_ms: u64,
}

/// A process's memory, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessMemory {
    /// Resident.
    pub rss: u64,
    /// Virtual.
    pub vms: u64,
}

/// What an agent asked of the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KernelStats {
    /// THINKs answered.
    pub llm_calls: u64,
    /// Tokens charged.
    pub llm_tokens_used: u64,
    /// EXEC runs accepted.
    pub exec_runs: u64,
}

/// CGROUP_METRICS' reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CgroupMetricsReply {
    /// Always true.
    pub success: bool,
    /// The cgroup's figures.
    pub metrics: CgroupMetrics,
}

/// An agent's cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CgroupMetrics {
    /// The agent it belongs to, by name (what `cgroup_path` names).
    pub cgroup_path: String,
    /// Always true: a cgroup that cannot be read is an error reply.
    pub valid: bool,
    /// CPU.
    pub cpu: CgroupCpu,
    /// Memory.
    pub memory: CgroupMemory,
    /// Processes.
    pub pids: CgroupPids,
}

/// A cgroup's CPU, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CgroupCpu {
    /// Used.
    pub usage_usec: u64,
    /// Held back by the quota.
    pub throttled_usec: u64,
    /// Periods in which the quota held it back.
    pub nr_throttled: u64,
    /// The quota per period (0: none).
    pub quota_usec: u64,
    /// The period.
    pub period_usec: u64,
}

/// A cgroup's memory, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CgroupMemory {
    /// In use.
    pub current: u64,
    /// The most used.
    pub peak: u64,
    /// The limit (0: none).
    pub max: u64,
    /// Processes killed for want of memory.
    pub oom_kills: u64,
}

/// A cgroup's processes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CgroupPids {
    /// Now.
    pub current: u64,
    /// The limit (0: none).
    pub max: u64,
}
