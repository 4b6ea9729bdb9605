//! LIST (0x12): the agents the caller may see, as a JSON array.

use std::time::Instant;

use agentos_proto::payload::{AgentInfo, ListRequest};
use agentos_proto::ErrorReply;

use super::{Caller, Kernel};

pub fn parse(payload: &[u8]) -> Result<ListRequest, ErrorReply> {
    ListRequest::parse(payload)
}

/// Live agents and those that ended recently (for an agent: itself and its
/// descendants), with figures from their cgroups read now.
pub fn handle(kernel: &mut Kernel, caller: &Caller, _request: ListRequest) -> Vec<AgentInfo> {
    let mut agents = kernel.agents().list(caller.identity, Instant::now());
    for agent in &mut agents {
        agent.llm = kernel.llm_ref().stats(agent.id);
    }
    agents
}
