//! KILL (0x11): stop an agent's process tree.

use agentos_proto::payload::{KillReply, KillRequest};
use agentos_proto::ErrorCode;

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::{agent_sandboxes, Kernel};

/// The KILL reply: `killed: true` once the agent is being stopped; for no
/// such live agent, `killed: false` with the error and code `not_found`.
/// Whom a caller may kill is the agents table's rule: an operator anyone,
/// an agent only its descendants, an EXEC run only the agents it spawned
/// (and theirs).
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let killed = KillRequest::parse(request.payload).and_then(|kill| {
        let viewer = actor(kernel, request)?.viewer();
        kernel.agents.kill(
            &mut agent_sandboxes(&mut kernel.sandboxes),
            &mut kernel.outbox.replies,
            viewer,
            &kill,
        )
    });
    Outcome::Reply(match killed {
        Ok(id) => Answer::json(&KillReply::killed(id)),
        Err(err) if err.code == ErrorCode::NotFound => Answer::json(&KillReply::not_found(err)),
        Err(err) => err.into(),
    })
}
