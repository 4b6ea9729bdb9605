//! A run's own cgroup as the reactor holds it, and the spare ones kept
//! inside an agent's cgroup for its runs (so what they use adds up against
//! the agent's limits). The thread that makes, recycles and removes them
//! is `cgroups`; what the reactor keeps of them, `exec_cgroups`.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::cgroup::{AgentCgroup, CgroupLimits};

/// Spare cgroups kept inside one agent's for its next runs.
pub const AGENT_SPARES: usize = 2;

/// A run's cgroup and what the kernel needs of it.
#[derive(Debug)]
pub struct RunCgroup {
    /// The cgroup.
    pub cgroup: AgentCgroup,
    /// The files (opened for writing) a process writes `0` into to join
    /// it, one per hierarchy.
    pub join_files: Vec<OwnedFd>,
    /// The limits in force in it.
    pub limits: CgroupLimits,
    /// OOM kills it had seen when it was handed out (it may have served
    /// runs before).
    pub oom_kills: u64,
    /// Whether limits of its own can be written into it: not inside an
    /// agent's cgroup on cgroup v2, where a cgroup beside the agent's own
    /// processes gets no controllers and its runs share the agent's limits.
    pub own_limits: bool,
    /// The agent whose cgroup it is inside, if it is.
    pub inside: Option<ChargedTo>,
}

/// An agent whose runs live inside its own cgroup, so their memory and
/// processes count against its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargedTo {
    /// The agent.
    pub agent: u32,
    /// Its cgroup now (relative to each hierarchy's root; a restart gives
    /// it another).
    pub cgroup: PathBuf,
}

/// Cgroups made inside one agent's, for its runs.
#[derive(Debug)]
pub struct AgentRunCgroups {
    /// The agent's cgroup they are made in.
    pub cgroup: PathBuf,
    /// Ready for its next runs.
    pub spare: Vec<RunCgroup>,
    /// Asked of the cgroup thread and not yet come.
    pub asked: usize,
}
