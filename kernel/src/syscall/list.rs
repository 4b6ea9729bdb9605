//! LIST (0x12): the agents the caller may see, as a JSON array.

use std::time::Instant;

use agentos_proto::payload::{AgentInfo, ListRequest};

use super::kernel::agent_sandboxes;
use super::{reply, Kernel, Outcome, Request};
use crate::identity::Identity;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(
        ListRequest::parse(request.payload)
            .map(|_| agents_seen_by(kernel, request.caller.identity)),
    )
}

/// Live agents and those that ended recently (for an agent: itself and its
/// descendants), with figures from their cgroups read now. Also the
/// built-in tool `kernel.list_agents`.
pub fn agents_seen_by(kernel: &mut Kernel, identity: Identity) -> Vec<AgentInfo> {
    let mut agents = kernel.agents.list(
        &agent_sandboxes(&mut kernel.sandboxes),
        identity,
        Instant::now(),
    );
    for agent in &mut agents {
        agent.llm = kernel.llm.stats(agent.id);
        agent.exec.runs = kernel.exec.runs_by(agent.id);
    }
    agents
}
