//! NET: an agent's connection record, and its network policy replaced at
//! runtime — by an operator, or by an ancestor (or the run that started
//! it) within what that caller has itself. A policy that narrows narrows
//! the agent's descendants too, and the proxy closes every open
//! connection the new policies refuse.

use agentos_egress::gateway::{net_attempts, net_totals};
use agentos_egress::policy::Policy;
use agentos_egress::Egress;
use agentos_proto::payload::{AgentRef, NetReply, Network};
use agentos_proto::{ErrorCode, ErrorReply};

use super::record::Agent;
use super::table::{Table, Viewer};

/// NET `set`: replaces the policy of the agent of `table` that `target`
/// names with `network`, which must lie within `bound` (what the caller
/// has) and within the agent's parent's. An agent cannot change its own.
/// Returns the reply, and each agent whose policy changed (it and its
/// descendants) with its new policy, for the work they started.
pub fn set(
    table: &mut Table,
    caller: Viewer,
    bound: &Egress,
    target: &AgentRef,
    network: &Network,
) -> Result<(NetReply, Vec<(u32, Policy)>), ErrorReply> {
    let agent = table
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
    if let Some(parent) = agent.parent.and_then(|p| table.get(p)) {
        granted = granted.within(&parent.egress, "its parent")?;
    }
    let Egress::Policy(policy) = granted else {
        unreachable!("a policy stays a policy within another");
    };
    let mut changed = vec![(id, policy.clone())];
    replace_policy(table, id, policy.clone());
    // Its descendants, each cut down to what its own parent now has.
    let mut descendants = table.live_ids(|a| table.is_descendant(a.id, id));
    descendants.sort_unstable();
    for child in descendants {
        let narrowed = table.get(child).and_then(|a| {
            let own = a.egress.policy()?.clone();
            let parent = table.get(a.parent?)?.egress.policy()?;
            Some(own.narrowed_to(parent))
        });
        if let Some(narrowed) = narrowed {
            changed.push((child, narrowed.clone()));
            replace_policy(table, child, narrowed);
        }
    }
    let agent = table.get(id).ok_or_else(|| not_found(target))?;
    log::info!(
        "agent {id} ({}): network policy replaced: {}",
        agent.name,
        policy
    );
    Ok((show(agent), changed))
}

/// Agent `id` (with a policy) gets `policy`: kept for its restarts,
/// and given to the proxy for the running incarnation.
fn replace_policy(table: &mut Table, id: u32, policy: Policy) {
    let Some(agent) = table.get_mut(id) else {
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

/// NET `show`: `agent`'s policy and record.
pub fn show(agent: &Agent) -> NetReply {
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
