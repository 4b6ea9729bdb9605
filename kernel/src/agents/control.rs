//! Which agent a KILL reaches. Who may stop, remove or restart an agent is
//! KILL's rule (an operator anyone, an agent its descendants, an EXEC run
//! what it started); for `remove` and `restart`, a target beyond the
//! caller is answered as one that does not exist, so neither reveals
//! agents the caller cannot list.

use agentos_proto::payload::{AgentRef, KillRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::record::Agent;
use super::table::{Table, Viewer};

/// The live agent KILL's `request` names, if `caller` may stop it.
pub fn kill_target(
    table: &Table,
    caller: Viewer,
    request: &KillRequest,
) -> Result<u32, ErrorReply> {
    live_controlled(table, caller, &request.target()?, "kill")
}

/// The live agent `target` names, if `caller` may stop it — and so `verb`
/// it (kill, pause, resume).
pub fn live_controlled(
    table: &Table,
    caller: Viewer,
    target: &AgentRef,
    verb: &str,
) -> Result<u32, ErrorReply> {
    // A delegate is told of no agent at all, not even that one exists.
    let seen = |_: &&Agent| caller != Viewer::Nobody;
    let id = table
        .live_target(target)
        .filter(seen)
        .map(|a| a.id)
        .ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                match target {
                    AgentRef::Id(id) => format!("no live agent with id {id}"),
                    AgentRef::Name(name) => format!("no live agent named {name:?}"),
                },
            )
        })?;
    if !table.may_stop(caller, id) {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            match caller {
                Viewer::Run(_) => format!("an EXEC run may only {verb} agents it spawned itself"),
                _ => format!(
                    "agents may only {verb} agents they spawned (directly or through their \
                     children)"
                ),
            },
        ));
    }
    Ok(id)
}

/// The agent `target` names among those `caller` may stop, for `remove`
/// or `restart`: by name, the live one, else the latest that ended. One
/// beyond the caller's authority is `not_found`, in the words used for one
/// that does not exist.
pub fn controlled(table: &Table, caller: Viewer, target: &AgentRef) -> Result<u32, ErrorReply> {
    let named = |a: &&Agent| match target {
        AgentRef::Id(id) => a.id == *id,
        AgentRef::Name(name) => &a.name == name,
    };
    if let Viewer::Agent(asker) = caller {
        if table.get(asker).as_ref().is_some_and(named) {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "an agent may not remove or restart itself",
            ));
        }
    }
    table
        .values()
        .filter(named)
        .filter(|a| table.may_stop(caller, a.id))
        .max_by_key(|a| (a.is_live(), a.id))
        .map(|a| a.id)
        .ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                match target {
                    AgentRef::Id(id) => format!("no agent with id {id}"),
                    AgentRef::Name(name) => format!("no agent named {name:?}"),
                },
            )
        })
}

/// The agent SET_PERMS may lower for `caller`: itself (an agent), or one
/// it may stop (KILL's rule). Any other is `not_found`, in the words used
/// for one that does not exist.
pub fn lowered_target(table: &Table, caller: Viewer, id: u32) -> Result<u32, ErrorReply> {
    let itself = caller == Viewer::Agent(id);
    if table.get(id).is_some() && (itself || table.may_stop(caller, id)) {
        return Ok(id);
    }
    Err(no_agent(id))
}

/// An agent the caller does not manage, said as one that does not exist.
pub fn no_agent(id: u32) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::NotFound,
        format!("no agent with id {id} among those this caller manages"),
    )
}

/// KILL `remove` forgets only an agent that has ended.
pub fn check_removable(agent: &Agent) -> Result<(), ErrorReply> {
    if agent.is_live() {
        return Err(ErrorReply::new(
            ErrorCode::BadRequest,
            format!(
                "agent {} ({}) is still running ({}); stop it first, then remove it",
                agent.id,
                agent.name,
                agent.state.as_str()
            ),
        ));
    }
    Ok(())
}
