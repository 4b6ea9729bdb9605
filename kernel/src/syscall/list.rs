//! LIST (0x12): the agents the caller may see, as a JSON array.

use std::time::Instant;

use agentos_proto::payload::ListRequest;

use super::kernel::agent_sandboxes;
use super::{reply, Kernel, Outcome, Request};

/// Live agents and those that ended recently (for an agent: itself and its
/// descendants), with figures from their cgroups read now.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(ListRequest::parse(request.payload).map(|_| {
        let mut agents = kernel.agents.list(
            &agent_sandboxes(&mut kernel.sandboxes),
            request.caller.identity,
            Instant::now(),
        );
        for agent in &mut agents {
            agent.llm = kernel.llm.stats(agent.id);
        }
        agents
    }))
}
