//! KILL (0x11): stop an agent's process tree; with `remove`, forget an
//! ended agent's record; with `restart`, start it again.

use agentos_proto::payload::{
    AuditCategory, KillAction, KillReply, KillRequest, RemoveReply, RestartReply,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::audit::note;
use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::agents::Restarted;
use crate::kernel::{agent_sandboxes, Kernel};

/// The KILL reply: `killed: true` once the agent is being stopped; for no
/// such live agent, `killed: false` with the error and code `not_found`.
/// `remove` answers `removed: true`, `restart` answers `restarted: true`
/// (and `killed`: whether a live incarnation is being stopped first).
/// Whom a caller may kill, remove or restart is the agents table's rule:
/// an operator anyone, an agent only its descendants, an EXEC run only the
/// agents it spawned (and theirs).
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let mut killed = None;
    let answer = KillRequest::parse(request.payload).and_then(|kill| {
        let viewer = actor(kernel, request)?.viewer();
        let agents = &mut kernel.agents;
        let mut sandboxes = agent_sandboxes(&mut kernel.sandboxes);
        let replies = &mut kernel.outbox.replies;
        Ok::<_, ErrorReply>(match kill.action() {
            KillAction::Stop => match agents.kill(&mut sandboxes, replies, viewer, &kill) {
                Ok(id) => {
                    killed = Some(id);
                    Answer::json(&KillReply::killed(id))
                }
                Err(err) if err.code == ErrorCode::NotFound => {
                    Answer::json(&KillReply::not_found(err))
                }
                Err(err) => err.into(),
            },
            KillAction::Remove => {
                Answer::json(&RemoveReply::removed(agents.remove(viewer, &kill)?))
            }
            KillAction::Restart => {
                let (id, how) = agents.restart(&mut sandboxes, replies, viewer, &kill)?;
                Answer::json(&RestartReply {
                    success: true,
                    restarted: true,
                    killed: how == Restarted::AfterStop,
                    id,
                })
            }
        })
    });
    if let Some(id) = killed {
        let lifecycle = AuditCategory::AgentLifecycle;
        note(
            kernel,
            request,
            lifecycle,
            "AGENT_KILLED",
            Some(id),
            &Killed { id },
        );
    }
    Outcome::Reply(answer.unwrap_or_else(Answer::from))
}

/// What the audit log says of a KILL.
#[derive(serde::Serialize)]
struct Killed {
    id: u32,
}
