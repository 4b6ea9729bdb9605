//! SPAWN (0x10): start an agent. The reply is delivered later, once the
//! workload runs or has failed to start (see `agents`).

use agentos_proto::payload::SpawnRequest;
use agentos_proto::ErrorReply;

pub fn parse(payload: &[u8]) -> Result<SpawnRequest, ErrorReply> {
    SpawnRequest::parse(payload)
}
