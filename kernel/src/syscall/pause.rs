//! PAUSE (0x14) and RESUME (0x15): an agent's processes frozen where they
//! stand by the cgroup freezer — no CPU, no signal handled — and let go
//! on. Whom a caller may pause is KILL's rule: an operator any agent, an
//! agent its descendants, an EXEC run the agents it spawned.
//!
//! PAUSE answers once every process has stopped, on a worker that waits
//! for the freezer; if that takes longer than [`FREEZE_WAIT`], the agent is
//! thawed and the answer is `timeout`. A KILL of a paused agent thaws it
//! after the signal, so it stops as any agent does. Nothing else stops
//! with it: its EXEC runs' and its tasks' time limits keep counting, and
//! what it asked of the kernel (a THINK) is answered into its socket, to
//! be read once it runs again.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    AgentState, AuditCategory, PauseReply, PauseRequest, SessionPauseReply, SessionState,
};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};

use super::audit::note;
use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::cgroup::Freezer;
use crate::exec::SessionOp;
use crate::kernel::fleet_sessions;
use crate::kernel::{agent_sandboxes, Kernel, Permission};
use crate::sandbox::runtime::Sandboxes;

/// How long PAUSE waits for every process to stop.
pub const FREEZE_WAIT: Duration = Duration::from_secs(5);
/// How often it looks.
const FREEZE_POLL: Duration = Duration::from_millis(5);

/// PAUSE and RESUME.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let pause = request.opcode == Opcode::PAUSE;
    let (what, verb) = if pause {
        ("PAUSE", "pause")
    } else {
        ("RESUME", "resume")
    };
    let asked = match PauseRequest::parse(what, request.payload) {
        Ok(asked) => asked,
        Err(err) => return Outcome::Reply(err.into()),
    };
    if let Some(session) = &asked.session {
        return session_freeze(kernel, request, session, pause, asked.hibernate);
    }
    if asked.hibernate {
        return Outcome::Reply(
            ErrorReply::new(
                ErrorCode::BadRequest,
                "PAUSE field `hibernate`: only a session hibernates (its globals are pickled and \
                 its interpreter ends); an agent's memory cannot be kept this way — PAUSE it \
                 without `hibernate` to freeze it where it stands",
            )
            .into(),
        );
    }
    let found = (|| {
        let viewer = actor(kernel, request)?.viewer();
        let (id, name, sandbox) = kernel.agents.to_freeze(viewer, &asked.target()?, verb)?;
        let sandbox = sandbox.ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::Busy,
                format!("agent {id} ({name}) is between restarts; {verb} it once it runs"),
            )
        })?;
        let freezer = agent_sandboxes(&mut kernel.sandboxes)
            .freezer(sandbox)
            .ok_or_else(|| no_freezer(id, &name))?;
        Ok::<_, ErrorReply>((id, name, freezer))
    })();
    let (id, name, freezer) = match found {
        Ok(found) => found,
        Err(err) => return Outcome::Reply(err.into()),
    };
    if let Err(err) = freezer.set(pause) {
        return Outcome::Reply(
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot {verb} agent {id} ({name}): {err}"),
            )
            .into(),
        );
    }
    let event_type = if pause {
        "AGENT_PAUSED"
    } else {
        "AGENT_RESUMED"
    };
    let lifecycle = AuditCategory::AgentLifecycle;
    note(
        kernel,
        request,
        lifecycle,
        event_type,
        Some(id),
        &Frozen { id },
    );
    super::events::agent_frozen(kernel, id, &name, pause, request.caller.identity.id());
    let reply = move |name, state| {
        Answer::json(&PauseReply {
            success: true,
            id,
            name,
            state,
        })
    };
    if !pause {
        log::info!("agent {id} ({name}): resumed");
        return Outcome::Reply(reply(name, AgentState::Running));
    }
    Outcome::Deferred(Box::new(move || {
        let answer = if wait_until_frozen(&freezer) {
            log::info!("agent {id} ({name}): paused");
            reply(name, AgentState::Paused)
        } else {
            // Half frozen helps no one: let it go on.
            let _ = freezer.set(false);
            ErrorReply::new(
                ErrorCode::Timeout,
                format!(
                    "agent {id} ({name}) did not stand still within {} s; it runs on",
                    FREEZE_WAIT.as_secs()
                ),
            )
            .into()
        };
        answer.into_json()
    }))
}

/// PAUSE or RESUME of one of the caller's sessions: its interpreter frozen
/// where it stands (its run's time limit standing still), or thawed;
/// answered, as an agent's PAUSE is, once every process has stopped.
fn session_freeze(
    kernel: &mut Kernel,
    request: &Request<'_>,
    session: &str,
    pause: bool,
    hibernate: bool,
) -> Outcome {
    let caller = match actor(kernel, request).and_then(|actor| {
        actor.require(Permission::Exec)?;
        Ok(kernel.run_caller(&actor))
    }) {
        Ok(caller) => caller,
        Err(err) => return Outcome::Reply(err.into()),
    };
    let key = (request.caller.principal(), session.to_owned());
    // A hibernated session is resumed by a fresh interpreter, which loads
    // its globals; hibernating saves them (a paused interpreter is let go
    // once the order is queued). Both are answered once done.
    if !pause && !hibernate {
        // One the fleet keeps is claimed (or fetched) first.
        let (fleet, exec) = (&mut kernel.fleet, &mut kernel.exec);
        let asker = (key.0, caller.share);
        match fleet_sessions::holds_resume(fleet, exec, asker, session, request.reply_to) {
            Ok(true) => return Outcome::Later,
            Ok(false) => {}
            Err(err) => return Outcome::Reply(err.into()),
        }
    }
    let replies = &mut kernel.outbox.replies;
    let hibernated = kernel.exec.disks().store.stored.is_hibernated(&key);
    let op = match (hibernate, pause) {
        (true, _) => Some(SessionOp::Hibernate),
        (false, false) if hibernated => Some(SessionOp::Wake),
        _ => None,
    };
    if let Some(op) = op {
        let reply_to = request.reply_to;
        let exec = &mut kernel.exec;
        if let Err(err) = exec.session_order(caller, session, op, reply_to, replies) {
            return Outcome::Reply(err.into());
        }
        return Outcome::Later;
    }
    let freezer = match kernel.exec.freeze_session(&key, pause, replies) {
        Ok(freezer) => freezer,
        Err(err) => return Outcome::Reply(err.into()),
    };
    let reply = move |state| {
        Answer::json(&SessionPauseReply {
            success: true,
            session: key.1,
            state,
            not_saved: Vec::new(),
        })
    };
    if !pause {
        return Outcome::Reply(reply(SessionState::Ready));
    }
    Outcome::Deferred(Box::new(move || {
        if wait_until_frozen(&freezer) {
            return reply(SessionState::Paused).into_json();
        }
        // Its processes go on meanwhile; it is paused all the same (a
        // RESUME lets it go), and its owner is told it did not stop yet.
        Answer::from(ErrorReply::new(
            ErrorCode::Timeout,
            format!(
                "the session's processes did not all stop within {} s; it stays paused (RESUME \
                 lets it go)",
                FREEZE_WAIT.as_secs()
            ),
        ))
        .into_json()
    }))
}

/// What the audit log says of a PAUSE or RESUME (recorded when the
/// freezer is asked).
#[derive(serde::Serialize)]
struct Frozen {
    id: u32,
}

/// Waits up to [`FREEZE_WAIT`] for every process under `freezer` to stop.
fn wait_until_frozen(freezer: &Freezer) -> bool {
    let deadline = Instant::now() + FREEZE_WAIT;
    loop {
        if freezer.is_frozen() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(FREEZE_POLL);
    }
}

fn no_freezer(id: u32, name: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Unavailable,
        format!(
            "agent {id} ({name}) cannot be paused here: it has no cgroup with a freezer (the \
             kernel runs without root, or the host mounts no freezer controller)"
        ),
    )
}
