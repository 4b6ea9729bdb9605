//! The agents table: every agent the kernel knows, live or recently ended,
//! by id, with the family each belongs to — and so who sees which: an
//! operator every agent, an agent itself and its descendants, an EXEC run
//! the agents it started and theirs, a delegate none, for LIST, LOGS, NET
//! and KILL alike.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::ops::Bound;

use agentos_proto::payload::AgentRef;

use super::record::{Agent, Incarnation};
use crate::events::Audience;

/// Whose view of the agents table a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// An operator: every agent.
    Operator,
    /// An agent: itself and its descendants.
    Agent(u32),
    /// An EXEC run: the agents it started, and their descendants.
    Run(u64),
    /// A delegate principal: no agent.
    Nobody,
}

/// The agents, by id.
#[derive(Debug)]
pub struct Table {
    agents: BTreeMap<u32, Agent>,
    /// The id the next agent gets: ids only grow.
    next_id: u32,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            agents: BTreeMap::new(),
            next_id: 1,
        }
    }
}

impl Table {
    /// The id the next agent admitted gets.
    pub fn next_id(&self) -> u32 {
        self.next_id
    }

    /// Keeps `agent`, under its id, which is the next one's no more.
    pub fn insert(&mut self, agent: Agent) -> &mut Agent {
        self.next_id = self.next_id.max(agent.id.saturating_add(1));
        match self.agents.entry(agent.id) {
            Entry::Vacant(entry) => entry.insert(agent),
            Entry::Occupied(mut entry) => {
                entry.insert(agent);
                entry.into_mut()
            }
        }
    }

    /// Forgets agent `id`.
    pub fn remove(&mut self, id: u32) -> Option<Agent> {
        self.agents.remove(&id)
    }

    /// Agent `id`.
    pub fn get(&self, id: u32) -> Option<&Agent> {
        self.agents.get(&id)
    }

    /// Agent `id`, to change.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut Agent> {
        self.agents.get_mut(&id)
    }

    /// The agent, if `incarnation` is its current incarnation.
    pub fn current(&mut self, incarnation: Incarnation) -> Option<&mut Agent> {
        self.agents
            .get_mut(&incarnation.agent)
            .filter(|a| a.incarnation == incarnation.number)
    }

    /// Every agent, by id.
    pub fn values(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    /// Every agent, from the one after id `after` on, around to it.
    pub fn around_after(&self, after: u32) -> impl Iterator<Item = &Agent> {
        let later = (Bound::Excluded(after), Bound::Unbounded);
        let earlier = (Bound::Unbounded, Bound::Included(after));
        self.agents
            .range(later)
            .chain(self.agents.range(earlier))
            .map(|(_, agent)| agent)
    }

    /// The ids of the live agents `which` picks, in order.
    pub fn live_ids(&self, which: impl Fn(&Agent) -> bool) -> Vec<u32> {
        self.agents
            .values()
            .filter(|a| a.is_live() && which(a))
            .map(|a| a.id)
            .collect()
    }

    /// The live agent named `name`, if any.
    pub fn live_named(&self, name: &str) -> Option<&Agent> {
        self.agents.values().find(|a| a.is_live() && a.name == name)
    }

    /// The live agent `target` names, if any.
    pub fn live_target(&self, target: &AgentRef) -> Option<&Agent> {
        self.agents.values().find(|a| {
            a.is_live()
                && match target {
                    AgentRef::Id(id) => a.id == *id,
                    AgentRef::Name(name) => &a.name == name,
                }
        })
    }

    /// The agent at the top of `id`'s family: the eldest ancestor it had
    /// when it was spawned (itself, if none).
    pub fn root_of(&self, id: u32) -> u32 {
        self.agents.get(&id).map_or(id, |agent| agent.root)
    }

    /// Whether `ancestor` is `id`'s parent, its parent's parent, or so on.
    pub fn is_descendant(&self, id: u32, ancestor: u32) -> bool {
        self.ancestors(id).any(|a| a == ancestor)
    }

    /// `id`'s parent, its parent's parent, and so on, as far as the table
    /// knows them.
    pub(super) fn ancestors(&self, id: u32) -> impl Iterator<Item = u32> + '_ {
        // Ids only grow, so a parent chain cannot loop; the bound is belt and braces.
        std::iter::successors(self.agents.get(&id).and_then(|a| a.parent), |parent| {
            self.agents.get(parent).and_then(|a| a.parent)
        })
        .take(self.agents.len())
    }

    /// Whether `caller` may see agent `id`: an operator every agent, an
    /// agent itself and its descendants, an EXEC run the agents it started
    /// and their descendants.
    pub fn sees(&self, caller: Viewer, id: u32) -> bool {
        match caller {
            Viewer::Operator => true,
            Viewer::Agent(asker) => id == asker || self.is_descendant(id, asker),
            Viewer::Run(number) => self
                .agents
                .get(&id)
                .is_some_and(|a| a.started_by == Some(number)),
            Viewer::Nobody => false,
        }
    }

    /// Who may see what happens to agent `id`, by [`Table::sees`]'s rule
    /// (and an operator only its own uid's tree).
    pub fn audience(&self, id: u32) -> Option<Audience> {
        let agent = self.agents.get(&id)?;
        Some(Audience {
            uid: Some(agent.owner_uid),
            agents: std::iter::once(id).chain(self.ancestors(id)).collect(),
            run: agent.started_by,
        })
    }

    /// KILL's rule: an operator may stop any agent, an agent its
    /// descendants, an EXEC run the agents it started and theirs.
    pub fn may_stop(&self, caller: Viewer, id: u32) -> bool {
        match caller {
            Viewer::Operator => true,
            Viewer::Agent(caller_id) => self.is_descendant(id, caller_id),
            Viewer::Run(_) | Viewer::Nobody => self.sees(caller, id),
        }
    }

    /// The agent `target` names, if `caller` may see it (as in LIST): by
    /// name, the live one, else the latest.
    pub fn seen_by(&self, caller: Viewer, target: &AgentRef) -> Option<&Agent> {
        let visible = |a: &&Agent| self.sees(caller, a.id);
        match target {
            AgentRef::Id(id) => self.agents.get(id).filter(visible),
            AgentRef::Name(name) => self
                .agents
                .values()
                .filter(|a| &a.name == name)
                .filter(visible)
                .max_by_key(|a| (a.is_live(), a.id)),
        }
    }
}
