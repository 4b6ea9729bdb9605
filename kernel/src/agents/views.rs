//! Who sees which agents: an operator every agent, an agent itself and its
//! descendants, an EXEC run the agents it started and theirs — for LIST,
//! LOGS and KILL alike.

use std::time::Instant;

use agentos_proto::payload::{AgentInfo, AgentRef, AgentState};

use super::record::Agent;
use super::{AgentLog, Agents, Incarnation, Viewer};
use crate::sandbox::runtime::Sandboxes;

impl Agents {
    /// LIST: every agent, live or recently ended, for an operator; for an
    /// agent, itself and its descendants, with pids as it sees them: its
    /// own top process is PID 1 of its namespace, and its children's
    /// processes it cannot see at all.
    pub fn list(
        &self,
        sandboxes: &impl Sandboxes<Incarnation>,
        caller: Viewer,
        now: Instant,
    ) -> Vec<AgentInfo> {
        let info = |a: &Agent| a.info(now, a.sandbox.and_then(|key| sandboxes.usage(key)));
        let own_pid_namespace = match caller {
            Viewer::Operator => return self.table.values().map(info).collect(),
            Viewer::Agent(asker) => self
                .table
                .get(&asker)
                .is_some_and(|a| a.shape(sandboxes).sandboxed)
                .then_some(Some(asker)),
            // A run sees no process outside its own namespace.
            Viewer::Run(_) => Some(None),
        };
        self.table
            .values()
            .filter(|a| self.sees(caller, a.id))
            .map(|a| {
                let mut entry = info(a);
                if let Some(asker) = own_pid_namespace {
                    entry.pid = (Some(a.id) == asker && entry.pid.is_some()).then_some(1);
                }
                entry
            })
            .collect()
    }

    /// The log of the agent `target` names, if `caller` may see that agent
    /// (as in LIST): by name, the live agent, else the latest one.
    pub fn log_of(&self, caller: Viewer, target: &AgentRef) -> Option<AgentLog> {
        let agent = self.seen_by(caller, target)?;
        Some(AgentLog {
            id: agent.id,
            name: agent.name.clone(),
            path: agent.log.clone(),
            state: agent.state,
            live: agent.is_live(),
        })
    }

    /// The state of every agent in the table (live, and ended ones not
    /// yet forgotten).
    pub fn states(&self) -> impl Iterator<Item = AgentState> + '_ {
        self.table.values().map(|agent| agent.state)
    }

    pub(super) fn is_descendant(&self, id: u32, ancestor: u32) -> bool {
        self.ancestors(id).any(|a| a == ancestor)
    }

    /// `id`'s parent, its parent's parent, and so on, as far as the table
    /// knows them.
    fn ancestors(&self, id: u32) -> impl Iterator<Item = u32> + '_ {
        // Ids only grow, so a parent chain cannot loop; the bound is belt and braces.
        std::iter::successors(self.table.get(&id).and_then(|a| a.parent), |parent| {
            self.table.get(parent).and_then(|a| a.parent)
        })
        .take(self.table.len())
    }

    /// Whether `caller` may see agent `id`: an operator every agent, an
    /// agent itself and its descendants, an EXEC run the agents it started
    /// and their descendants.
    pub(super) fn sees(&self, caller: Viewer, id: u32) -> bool {
        match caller {
            Viewer::Operator => true,
            Viewer::Agent(asker) => id == asker || self.is_descendant(id, asker),
            Viewer::Run(number) => self
                .table
                .get(&id)
                .is_some_and(|a| a.started_by == Some(number)),
        }
    }
}
