//! LIST (0x12): every known agent, as a JSON array.

use agentos_proto::payload::{AgentInfo, ListRequest};
use agentos_proto::ErrorReply;

use super::Kernel;

pub fn parse(payload: &[u8]) -> Result<ListRequest, ErrorReply> {
    ListRequest::parse(payload)
}

/// The kernel has no agents until SPAWN exists, so the list is empty.
pub fn handle(_kernel: &Kernel, _request: ListRequest) -> Vec<AgentInfo> {
    Vec::new()
}
