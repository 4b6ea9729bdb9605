//! EXIT (0xFF): say goodbye, then close.

use super::request::{Outcome, Request};
use crate::kernel::Kernel;

/// The EXIT reply payload.
pub const GOODBYE: &[u8] = b"goodbye";

/// Answers `goodbye`; the reactor closes the connection after delivering it.
pub fn handle(_kernel: &mut Kernel, _request: &Request<'_>) -> Outcome {
    Outcome::ReplyAndClose(GOODBYE.to_vec())
}
