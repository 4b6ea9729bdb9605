//! GET_PERMS (0x40) and SET_PERMS (0x41): what the caller may do, and
//! lowering it, with the Clove SDK's levels and `can_*` switches.
//!
//! Nothing here raises a permission. `unrestricted` means "everything I
//! was granted" and changes nothing; a lower level, or a switch set to
//! `false`, takes away: for an operator, on this connection only (an
//! operator is every connection of its uid); for an agent or an EXEC run,
//! for good. `agent_id` names an agent the caller manages (KILL's rule:
//! an operator any, an agent its descendants, a run what it spawned),
//! which is lowered for good with its descendants, so no child keeps more
//! than its parent.

use agentos_proto::payload::{
    AuditCategory, GetPermsRequest, Permissions, PermsReply, SetPermsRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::audit::note;
use super::request::{actor, reply, Outcome, Request};
use crate::kernel::{Actor, Kernel};

/// GET_PERMS: the caller's own permissions.
pub fn get(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(GetPermsRequest::parse(request.payload).and_then(|_| {
        Ok(PermsReply {
            success: true,
            agent_id: request.caller.identity.id(),
            permissions: actor(kernel, request)?.permissions().into(),
        })
    }))
}

/// SET_PERMS: lowers the caller, or an agent it manages.
pub fn set(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let lowered = SetPermsRequest::parse(request.payload).and_then(|set| {
        let caller = actor(kernel, request)?;
        let lower = |permissions: Permissions| lowered(&set, permissions);
        if let Some(id) = set
            .agent_id
            .filter(|id| Some(*id) != request.caller.identity.agent())
        {
            let viewer = caller.viewer();
            let current = kernel.agents.managed(viewer, id)?;
            check_only_lowers(&set, current, &format!("agent {id}"))?;
            let kept = kernel.agents.lower(viewer, id, lower)?;
            let reply = PermsReply {
                success: true,
                agent_id: id,
                permissions: kept.into(),
            };
            return Ok((reply, Some(id)));
        }
        let current = caller.permissions();
        check_only_lowers(&set, &current, &caller.name())?;
        let about = match caller {
            Actor::Agent { id, .. } => Some(id),
            Actor::Operator { .. } | Actor::Delegate { .. } | Actor::Run { .. } => None,
        };
        let kept = match caller {
            Actor::Operator { .. } | Actor::Delegate { .. } => {
                let kept = lower(current.clone());
                // Only a connection can lower an operator or a delegate (a
                // kernel-made request has none), and only what changes is
                // kept.
                if let Some(serial) = request.reply_to.connection().filter(|_| kept != current) {
                    kernel.services.lowered.set(serial, kept.clone());
                }
                kept
            }
            Actor::Agent { id, .. } => kernel.agents.lower(caller.viewer(), id, lower)?,
            Actor::Run { number, .. } => kernel.runs.lower(number, lower).ok_or_else(|| {
                ErrorReply::new(ErrorCode::PermissionDenied, "this EXEC run is over")
            })?,
        };
        let reply = PermsReply {
            success: true,
            agent_id: request.caller.identity.id(),
            permissions: kept.into(),
        };
        Ok((reply, about))
    });
    if let Ok((set, about)) = &lowered {
        let security = AuditCategory::Security;
        note(
            kernel,
            request,
            security,
            "PERMISSIONS_CHANGED",
            *about,
            &set.permissions,
        );
    }
    reply(lowered.map(|(set, _)| set))
}

/// `permissions` with what `set` takes away taken away.
fn lowered(set: &SetPermsRequest, permissions: Permissions) -> Permissions {
    let kept = match set.level {
        Some(level) => level.lower(permissions),
        None => permissions,
    };
    match &set.permissions {
        Some(switches) => switches.lower(kept),
        None => kept,
    }
}

/// A switch set to `true` keeps what is held; asking for one not held is
/// a raise, refused by name.
fn check_only_lowers(
    set: &SetPermsRequest,
    current: &Permissions,
    whose: &str,
) -> Result<(), ErrorReply> {
    match set.permissions.as_ref().and_then(|p| p.raise_in(current)) {
        Some(field) => Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "SET_PERMS field `permissions.{field}`: {whose} does not have it, and \
                 SET_PERMS only lowers"
            ),
        )),
        None => Ok(()),
    }
}
