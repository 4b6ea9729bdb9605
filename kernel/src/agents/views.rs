//! What a caller is shown of the agents it sees: LIST's entries, with pids
//! as it sees them, and where an agent's log is for LOGS.

use std::path::PathBuf;
use std::time::Instant;

use agentos_proto::payload::{AgentInfo, AgentState};

use super::record::{Agent, Incarnation};
use super::table::{Table, Viewer};
use crate::sandbox::runtime::Sandboxes;

/// Where an agent's log is, and whether more may come.
#[derive(Clone, Debug)]
pub struct AgentLog {
    /// The agent's id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its log file.
    pub path: PathBuf,
    /// Its state now.
    pub state: AgentState,
    /// Whether it may still write.
    pub live: bool,
}

/// What the audit log says of an agent: who it is, where it sits, and
/// how its current or last incarnation stands.
#[derive(Clone, Debug)]
pub struct AgentFacts {
    /// Its name.
    pub name: String,
    /// The uid of the operator whose tree it is in.
    pub owner_uid: u32,
    /// Its ancestors as far as the table knows them, eldest first, and
    /// itself last.
    pub line: Vec<u32>,
    /// Its state now.
    pub state: AgentState,
    /// Its incarnation's number.
    pub incarnation: u32,
    /// The workload's exit code, once it has ended.
    pub exit_code: Option<i32>,
    /// The signal that ended the workload.
    pub signal: Option<i32>,
}

/// LIST: every agent of `table`, live or recently ended, for an operator;
/// for an agent, itself and its descendants, with pids as it sees them:
/// its own top process is PID 1 of its namespace, and its children's
/// processes it cannot see at all.
pub fn list(
    table: &Table,
    sandboxes: &impl Sandboxes<Incarnation>,
    caller: Viewer,
    now: Instant,
) -> Vec<AgentInfo> {
    let info = |a: &Agent| a.info(now, a.sandbox.and_then(|key| sandboxes.usage(key)));
    let own_pid_namespace = match caller {
        Viewer::Operator => return table.values().map(info).collect(),
        Viewer::Agent(asker) => table
            .get(asker)
            .is_some_and(|a| a.shape(sandboxes).sandboxed)
            .then_some(Some(asker)),
        // A run sees no process outside its own namespace.
        Viewer::Run(_) => Some(None),
        Viewer::Nobody => return Vec::new(),
    };
    table
        .values()
        .filter(|a| table.sees(caller, a.id))
        .map(|a| {
            let mut entry = info(a);
            if let Some(asker) = own_pid_namespace {
                entry.pid = (Some(a.id) == asker && entry.pid.is_some()).then_some(1);
            }
            entry
        })
        .collect()
}

/// Where `agent`'s log is.
pub fn log_of(agent: &Agent) -> AgentLog {
    AgentLog {
        id: agent.id,
        name: agent.name.clone(),
        path: agent.log.clone(),
        state: agent.state,
        live: agent.is_live(),
    }
}
