//! KILL (0x11): stop an agent's process tree.

use agentos_proto::payload::{to_json, KillReply, KillRequest};
use agentos_proto::ErrorCode;

use super::{Caller, Io, Kernel};

/// The KILL reply: `killed: true` once the agent is being stopped; for no
/// such live agent, `killed: false` with the error and code `not_found`.
pub fn handle(kernel: &mut Kernel, io: &mut Io<'_>, caller: &Caller, payload: &[u8]) -> Vec<u8> {
    let result = KillRequest::parse(payload)
        .and_then(|request| kernel.agents().kill(io, caller.identity, &request));
    match result {
        Ok(id) => to_json(&KillReply {
            success: true,
            killed: true,
            id: Some(id),
        }),
        Err(err) if err.code == ErrorCode::NotFound => to_json(&serde_json::json!({
            "success": false,
            "killed": false,
            "id": null,
            "error": err.error,
            "code": err.code,
        })),
        Err(err) => err.to_json(),
    }
}
