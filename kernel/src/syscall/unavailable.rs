//! Opcodes of the protocol whose subsystems this kernel does not provide
//! yet. Their requests are still validated, so a client learns about a
//! malformed payload (`bad_request`) before it learns the subsystem is
//! missing (`unavailable`).

use agentos_proto::payload::{TaskRequest, ToolCall};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};

use super::{Kernel, Outcome, Request};

/// The error reply for a request to a missing subsystem.
pub fn handle(_kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let opcode = request.opcode;
    let valid = match opcode {
        Opcode::TASK => TaskRequest::parse(request.payload).map(drop),
        Opcode::TOOL => ToolCall::parse(request.payload).map(drop),
        _ => Ok(()),
    };
    let err = match valid {
        Err(err) => err,
        Ok(()) => ErrorReply::new(
            ErrorCode::Unavailable,
            format!(
                "{opcode} is not available in agentosd {}; HELLO's `features` list what \
                 this kernel provides",
                env!("CARGO_PKG_VERSION")
            ),
        ),
    };
    Outcome::Reply(err.to_json())
}
