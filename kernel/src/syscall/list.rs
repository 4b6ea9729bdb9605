//! LIST (0x12): the agents the caller may see, as a JSON array.

use std::time::Instant;

use agentos_proto::payload::{AgentInfo, ListRequest};

use super::request::{actor, reply, Outcome, Request};
use crate::agents::Viewer;
use crate::kernel::agent_sandboxes;
use crate::kernel::Kernel;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(ListRequest::parse(request.payload).and_then(|_| {
        let viewer = actor(kernel, request)?.viewer();
        Ok(agents_seen_by(kernel, viewer))
    }))
}

/// Live agents and those that ended recently (for an agent: itself and its
/// descendants; for an EXEC run: the agents it spawned and theirs), with
/// figures from their cgroups read now. Also the built-in tool
/// `kernel.list_agents`.
pub fn agents_seen_by(kernel: &mut Kernel, viewer: Viewer) -> Vec<AgentInfo> {
    let mut agents = kernel.agents.list(
        &agent_sandboxes(&mut kernel.sandboxes),
        viewer,
        Instant::now(),
    );
    for agent in &mut agents {
        agent.llm = kernel.llm.stats(agent.id);
        agent.exec.runs = kernel.exec.runs_by(agent.id);
    }
    agents
}
