//! HELLO (0xFE): protocol version, kernel version, identity and features.

use agentos_proto::payload::{Features, HelloReply, HelloRequest, ProtocolLimits};
use agentos_proto::{ErrorReply, MAX_REPLY_BYTES, PROTOCOL_VERSION};

use super::{Caller, Kernel};

pub fn parse(payload: &[u8]) -> Result<HelloRequest, ErrorReply> {
    HelloRequest::parse(payload)
}

/// Reports what really works on this host now: subsystems not yet present in
/// this kernel are `false`.
pub fn handle(kernel: &mut Kernel, caller: &Caller, _request: HelloRequest) -> HelloReply {
    let cgroup = kernel.agents().cgroup_version();
    let llm = kernel.llm_ref().info();
    let config = kernel.config();
    HelloReply {
        success: true,
        protocol_version: PROTOCOL_VERSION,
        kernel_version: env!("CARGO_PKG_VERSION").to_owned(),
        agent_id: caller.identity.id(),
        features: Features {
            think: kernel.llm_ref().is_available(),
            exec: false,
            spawn: true,
            task: false,
            cgroup,
        },
        limits: Some(ProtocolLimits {
            max_request_bytes: config.max_request_bytes,
            max_reply_bytes: MAX_REPLY_BYTES,
            max_in_flight: config.max_in_flight,
        }),
        llm: Some(llm),
    }
}
