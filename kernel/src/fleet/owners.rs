//! Principals as the fleet names them: an operator by user name (the
//! nodes of one fleet share their users), a delegate by its name and its
//! operator's user name. Agents and runs are their node's alone: their
//! tasks stay there.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use agentos_proto::payload::DelegateName;
use agentos_proto::{ErrorCode, ErrorReply};
use nix::unistd::{Uid, User};

use super::error::FleetError;
use super::tasks::FleetOwner;
use crate::identity::Principal;

/// How the fleet names `principal`; `None` for an agent or a run.
pub fn fleet_owner(principal: Principal) -> Result<Option<FleetOwner>, FleetError> {
    let (uid, delegate) = match principal {
        Principal::Operator { uid } => (uid, String::new()),
        Principal::Delegate { uid, name } => (uid, name.as_str().to_owned()),
        Principal::Agent { .. } | Principal::Run { .. } => return Ok(None),
    };
    Ok(Some(FleetOwner {
        user: user_name(uid)?,
        delegate,
    }))
}

/// The name `principal`'s THINK quota is kept under on every node: its
/// user name, and its delegate's after a `/` (a delegate's name holds
/// none); `#UID` for a uid with no name. `None` for an agent or a run,
/// which have token budgets of their own instead.
pub fn quota_owner(principal: Principal) -> Option<String> {
    let uid = match principal {
        Principal::Operator { uid } | Principal::Delegate { uid, .. } => uid,
        Principal::Agent { .. } | Principal::Run { .. } => return None,
    };
    let owner = match fleet_owner(principal) {
        Ok(owner) => owner?,
        Err(_) => FleetOwner {
            user: format!("#{uid}"),
            delegate: match principal {
                Principal::Delegate { name, .. } => name.as_str().to_owned(),
                _ => String::new(),
            },
        },
    };
    Some(if owner.delegate.is_empty() {
        owner.user
    } else {
        format!("{}/{}", owner.user, owner.delegate)
    })
}

/// The user name of `uid`, looked up once for the daemon's life, a uid
/// without one too (the lookup may ask a directory service; the reactor
/// asks it, for every THINK held to a quota).
fn user_name(uid: u32) -> Result<String, FleetError> {
    static NAMES: OnceLock<Mutex<HashMap<u32, Option<String>>>> = OnceLock::new();
    let names = NAMES.get_or_init(Mutex::default);
    let known = names
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&uid)
        .cloned();
    let name = match known {
        Some(name) => name,
        None => {
            let looked_up = User::from_uid(Uid::from_raw(uid)).ok().flatten();
            let name = looked_up.map(|user| user.name);
            names
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(uid, name.clone());
            name
        }
    };
    name.ok_or_else(|| {
        FleetError::Unavailable(format!(
            "uid {uid} has no user name on this node, and a fleet knows operators by name"
        ))
    })
}

/// The principal `owner` is on this node.
pub fn local_principal(owner: &FleetOwner) -> Result<Principal, ErrorReply> {
    let user = User::from_name(&owner.user).ok().flatten().ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::Unavailable,
            format!("user {:?} does not exist on this node", owner.user),
        )
    })?;
    let uid = user.uid.as_raw();
    if owner.delegate.is_empty() {
        return Ok(Principal::Operator { uid });
    }
    let name = DelegateName::new(&owner.delegate)?;
    Ok(Principal::Delegate { uid, name })
}
