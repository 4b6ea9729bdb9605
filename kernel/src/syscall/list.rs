//! LIST (0x12): every known agent, as a JSON array.

use std::time::Instant;

use agentos_proto::payload::{AgentInfo, ListRequest};
use agentos_proto::ErrorReply;

use super::Kernel;

pub fn parse(payload: &[u8]) -> Result<ListRequest, ErrorReply> {
    ListRequest::parse(payload)
}

/// Live agents and those that ended recently, with figures from their
/// cgroups read now.
pub fn handle(kernel: &mut Kernel, _request: ListRequest) -> Vec<AgentInfo> {
    let mut agents = kernel.agents().list(Instant::now());
    for agent in &mut agents {
        agent.llm = kernel.llm_ref().stats(agent.id);
    }
    agents
}
