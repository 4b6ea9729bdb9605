//! The lifecycle state of an agent, as LIST, LOGS and SPAWN's records
//! report it.

use serde::{Deserialize, Serialize};

/// An agent's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Being set up; the workload has not been exec'd yet.
    Starting,
    /// The workload is running.
    Running,
    /// PAUSE froze it: its processes stand still until RESUME.
    Paused,
    /// It ended by itself.
    Exited,
    /// KILL stopped it.
    Killed,
    /// The memory cgroup killed it.
    OomKilled,
    /// It could not start, or exhausted its restarts.
    Failed,
    /// Waiting out the backoff before a restart.
    Restarting,
}

impl AgentState {
    /// The states of an agent that is alive: starting, running, paused,
    /// or waiting to restart.
    pub const LIVE: [AgentState; 4] = [
        AgentState::Starting,
        AgentState::Running,
        AgentState::Paused,
        AgentState::Restarting,
    ];

    /// Whether this is one of [`AgentState::LIVE`].
    pub fn is_live(self) -> bool {
        AgentState::LIVE.contains(&self)
    }

    /// The protocol word, e.g. `"oom_killed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Starting => "starting",
            AgentState::Running => "running",
            AgentState::Paused => "paused",
            AgentState::Exited => "exited",
            AgentState::Killed => "killed",
            AgentState::OomKilled => "oom_killed",
            AgentState::Failed => "failed",
            AgentState::Restarting => "restarting",
        }
    }
}
