//! NET: an agent's connection record, and its network policy replaced at
//! runtime — by an operator, or by an ancestor (or the run that started
//! it) within what that caller has itself. A policy that narrows narrows
//! the agent's descendants too, and the proxy closes every open
//! connection the new policies refuse.

use std::sync::{Arc, Mutex};

use agentos_proto::payload::{AgentRef, NetReply, Network};
use agentos_proto::{ErrorCode, ErrorReply};

use super::record::Agent;
use super::{Agents, Viewer};
use crate::network::gateway::{net_attempts, net_totals};
use crate::network::policy::Policy;
use crate::network::record::Record as NetRecord;
use crate::network::Egress;

impl Agents {
    /// The agent `target` names, if `caller` may see it (as in LIST): by
    /// name, the live one, else the latest.
    pub(super) fn seen_by(&self, caller: Viewer, target: &AgentRef) -> Option<&Agent> {
        let visible = |a: &&Agent| self.sees(caller, a.id);
        match target {
            AgentRef::Id(id) => self.table.get(id).filter(visible),
            AgentRef::Name(name) => self
                .table
                .values()
                .filter(|a| &a.name == name)
                .filter(visible)
                .max_by_key(|a| (a.is_live(), a.id)),
        }
    }

    /// The connection record of agent `id`'s latest endpoint, if it has
    /// had one: NET `show` reads it, and its runs' connections count in it.
    pub fn net_record(&self, id: u32) -> Option<Arc<Mutex<NetRecord>>> {
        self.table.get(&id)?.net_record.clone()
    }

    /// NET `show`: the agent's policy and record.
    pub fn net_show(&self, caller: Viewer, target: &AgentRef) -> Result<NetReply, ErrorReply> {
        let agent = self
            .seen_by(caller, target)
            .ok_or_else(|| not_found(target))?;
        Ok(net_reply(agent))
    }

    /// NET `set`: replaces the policy of the agent `target` names with
    /// `network`, which must lie within `bound` (what the caller has) and
    /// within the agent's parent's. An agent cannot change its own.
    /// Returns the reply, and each agent whose policy changed (it and its
    /// descendants) with its new policy, for the work they started.
    pub fn net_set(
        &mut self,
        caller: Viewer,
        bound: &Egress,
        target: &AgentRef,
        network: &Network,
    ) -> Result<(NetReply, Vec<(u32, Policy)>), ErrorReply> {
        let agent = self
            .seen_by(caller, target)
            .ok_or_else(|| not_found(target))?;
        let id = agent.id;
        if caller == Viewer::Agent(id) {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "NET field `network`: an agent cannot change its own policy; its parent or an \
                 operator can",
            ));
        }
        if !agent.is_live() {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("agent {id} ({}) has ended", agent.name),
            ));
        }
        if agent.egress.policy().is_none() {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "NET: agent {} was started with `network: {}`, not a policy; only a policy \
                     can be replaced while it runs",
                    agent.name,
                    agent.egress == Egress::Host
                ),
            ));
        }
        let asked = match network {
            // Loopback only, for an agent served by the proxy: nothing
            // allowed.
            Network::Host(false) => Egress::Policy(Policy::default()),
            other => Egress::from_request("NET", other)?,
        };
        if asked == Egress::Host {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                "NET field `network`: a running agent's network namespace stays its own; give \
                 a policy",
            ));
        }
        let mut granted = asked.within(bound, "the caller")?;
        if let Some(parent) = agent.parent.and_then(|p| self.table.get(&p)) {
            granted = granted.within(&parent.egress, "its parent")?;
        }
        let Egress::Policy(policy) = granted else {
            unreachable!("a policy stays a policy within another");
        };
        let mut changed = vec![(id, policy.clone())];
        self.replace_policy(id, policy.clone());
        // Its descendants, each cut down to what its own parent now has.
        let mut descendants: Vec<u32> = self
            .table
            .values()
            .filter(|a| a.is_live() && self.is_descendant(a.id, id))
            .map(|a| a.id)
            .collect();
        descendants.sort_unstable();
        for child in descendants {
            let narrowed = self.table.get(&child).and_then(|a| {
                let own = a.egress.policy()?.clone();
                let parent = self.table.get(&a.parent?)?.egress.policy()?;
                Some(own.narrowed_to(parent))
            });
            if let Some(narrowed) = narrowed {
                changed.push((child, narrowed.clone()));
                self.replace_policy(child, narrowed);
            }
        }
        let agent = &self.table[&id];
        log::info!(
            "agent {id} ({}): network policy replaced: {}",
            agent.name,
            policy.to_json()
        );
        Ok((net_reply(agent), changed))
    }

    /// Agent `id` (with a policy) gets `policy`: kept for its restarts,
    /// and given to the proxy for the running incarnation.
    fn replace_policy(&mut self, id: u32, policy: Policy) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        if agent.egress.policy() == Some(&policy) {
            return;
        }
        if let Some(endpoint) = &agent.endpoint {
            endpoint.set_policy(policy.clone());
        }
        agent.egress = Egress::Policy(policy);
    }
}

fn net_reply(agent: &Agent) -> NetReply {
    let (attempts, dropped) = agent
        .net_record
        .as_deref()
        .map(net_attempts)
        .unwrap_or_default();
    NetReply {
        success: true,
        id: agent.id,
        name: agent.name.clone(),
        network: Some(agent.egress.to_wire()),
        totals: agent
            .net_record
            .as_deref()
            .map(net_totals)
            .unwrap_or_default(),
        attempts,
        dropped,
    }
}

/// The refusal for an agent a caller cannot see, the same as for one that
/// does not exist.
pub fn not_found(target: &AgentRef) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::NotFound,
        match target {
            AgentRef::Id(id) => format!("no agent with id {id}"),
            AgentRef::Name(name) => format!("no agent named {name:?}"),
        },
    )
}
