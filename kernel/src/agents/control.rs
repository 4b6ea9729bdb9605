//! KILL's `remove` and `restart`: forgetting an ended agent's record, and
//! starting an agent again with the same spec and id. Who may do either is
//! KILL's rule (an operator anyone, an agent its descendants, an EXEC run
//! what it started); a target beyond the caller is answered as one that
//! does not exist, so neither reveals agents the caller cannot list.

use std::time::{Duration, Instant};

use agentos_proto::payload::{AgentRef, KillRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::record::Restarted;
use super::record::{Agent, StopReason};
use super::{Agents, Incarnation, Viewer};
use crate::address::Reply;
use crate::sandbox::runtime::Sandboxes;

impl Agents {
    /// KILL `remove`: forgets the record of an ended agent. Returns its id.
    pub fn remove(&mut self, caller: Viewer, request: &KillRequest) -> Result<u32, ErrorReply> {
        let id = self.controlled(caller, &request.target()?)?;
        let agent = &self.table[&id];
        if agent.is_live() {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "agent {id} ({}) is still running ({}); stop it first, then remove it",
                    agent.name,
                    agent.state.as_str()
                ),
            ));
        }
        log::info!("agent {id} ({}): record removed", agent.name);
        self.table.remove(&id);
        Ok(id)
    }

    /// KILL `restart`: stops the live incarnation (as KILL does) and starts
    /// the next once it has ended; an ended agent whose record is kept
    /// starts again now. Either way the same id, the same spec, and one
    /// more restart counted.
    pub fn restart(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        caller: Viewer,
        request: &KillRequest,
    ) -> Result<(u32, Restarted), ErrorReply> {
        let id = self.controlled(caller, &request.target()?)?;
        let now = Instant::now();
        if self.table[&id].is_live() {
            log::info!("agent {id}: KILL restart (grace {} ms)", request.grace_ms());
            let grace = Duration::from_millis(request.grace_ms());
            self.stop(sandboxes, replies, id, StopReason::Restart, grace, now);
            return Ok((id, Restarted::AfterStop));
        }
        self.refuse_if_shutting_down()?;
        self.check_room_for(&self.table[&id].name)?;
        let door = Self::open_door(sandboxes, id)?;
        log::info!("agent {id}: KILL restart of an ended agent");
        if let Some(agent) = self.table.get_mut(&id) {
            agent.door = Some(door);
        }
        self.start_again(sandboxes, id, now);
        Ok((id, Restarted::FromEnded))
    }

    /// Starts the next incarnation of an agent that was stopped, or had
    /// ended, for a restart.
    pub(super) fn start_again(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        id: u32,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.stop = None;
        agent.ended = None;
        agent.restarts.total += 1;
        self.start_incarnation(sandboxes, id, now);
    }

    /// The agent `target` names among those `caller` may stop: by name, the
    /// live one, else the latest that ended. One beyond the caller's
    /// authority is `not_found`, in the words used for one that does not
    /// exist.
    fn controlled(&self, caller: Viewer, target: &AgentRef) -> Result<u32, ErrorReply> {
        let named = |a: &&Agent| match target {
            AgentRef::Id(id) => a.id == *id,
            AgentRef::Name(name) => &a.name == name,
        };
        if let Viewer::Agent(asker) = caller {
            if self.table.get(&asker).as_ref().is_some_and(named) {
                return Err(ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    "an agent may not remove or restart itself",
                ));
            }
        }
        self.table
            .values()
            .filter(named)
            .filter(|a| self.may_stop(caller, a.id))
            .max_by_key(|a| (a.is_live(), a.id))
            .map(|a| a.id)
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    match target {
                        AgentRef::Id(id) => format!("no agent with id {id}"),
                        AgentRef::Name(name) => format!("no agent named {name:?}"),
                    },
                )
            })
    }

    /// KILL's rule: an operator may stop any agent, an agent its
    /// descendants, an EXEC run the agents it started and theirs.
    pub(super) fn may_stop(&self, caller: Viewer, id: u32) -> bool {
        match caller {
            Viewer::Operator => true,
            Viewer::Agent(caller_id) => self.is_descendant(id, caller_id),
            Viewer::Run(_) => self.sees(caller, id),
        }
    }
}
