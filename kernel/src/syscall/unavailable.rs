//! Opcodes of the protocol whose subsystems this kernel does not provide
//! yet. Their requests are still validated, so a client learns about a
//! malformed payload (`bad_request`) before it learns the subsystem is
//! missing (`unavailable`).

use agentos_proto::payload::{ExecRequest, TaskRequest};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};

/// The error reply for a request to a missing subsystem.
pub fn handle(opcode: Opcode, payload: &[u8]) -> ErrorReply {
    let valid = match opcode {
        Opcode::EXEC => ExecRequest::parse(payload).map(drop),
        Opcode::TASK => TaskRequest::parse(payload).map(drop),
        _ => Ok(()),
    };
    match valid {
        Err(err) => err,
        Ok(()) => ErrorReply::new(
            ErrorCode::Unavailable,
            format!(
                "{opcode} is not available in agentosd {}; HELLO's `features` list what \
                 this kernel provides",
                env!("CARGO_PKG_VERSION")
            ),
        ),
    }
}
