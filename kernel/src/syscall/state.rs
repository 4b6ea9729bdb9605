//! STORE (0x30), FETCH (0x31), DELETE (0x32) and KEYS (0x33): the state
//! store (see `state_store`), as the Clove SDK's `store`, `fetch`,
//! `delete_key` and `list_keys` call it.
//!
//! An operator's keys are its uid's; an agent's own keys are its own, and
//! its `global` keys its tree's: shared with the operator that started
//! the tree and every agent in it, never beyond. An EXEC run is refused:
//! its code is hostile, and it keeps its state in its session.

use agentos_proto::payload::{KeyRequest, KeysRequest, StoreRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, delegate_refused, Outcome, Request};
use crate::kernel::{Actor, Kernel};
use crate::state_store::{Holder, Quota};
use crate::workers::Job;

/// STORE.
pub fn store(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    deferred(StoreRequest::parse(request.payload).and_then(|asked| {
        let holder = holder(kernel, request)?;
        let limits = &kernel.config().state;
        let value = serde_json::to_string(&asked.value).map_err(|err| {
            ErrorReply::new(ErrorCode::BadRequest, format!("STORE field `value`: {err}"))
        })?;
        if value.len() as u64 > limits.max_value_bytes {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "STORE field `value`: {} bytes as JSON, over `state.max_value_bytes` ({})",
                    value.len(),
                    limits.max_value_bytes
                ),
            ));
        }
        let quota = Quota {
            keys: limits.max_keys_per_owner,
            bytes: limits.max_bytes_per_owner,
        };
        Ok(kernel.state_store.store(holder, asked, value, quota))
    }))
}

/// FETCH.
pub fn fetch(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    deferred(
        KeyRequest::parse("FETCH", request.payload).and_then(|asked| {
            let holder = holder(kernel, request)?;
            Ok(kernel.state_store.fetch(holder, asked))
        }),
    )
}

/// DELETE.
pub fn delete(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    deferred(
        KeyRequest::parse("DELETE", request.payload).and_then(|asked| {
            let holder = holder(kernel, request)?;
            Ok(kernel.state_store.delete(holder, asked))
        }),
    )
}

/// KEYS.
pub fn keys(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    deferred(KeysRequest::parse(request.payload).and_then(|asked| {
        let holder = holder(kernel, request)?;
        Ok(kernel.state_store.keys(holder, asked))
    }))
}

/// Whose keys the caller reaches.
fn holder(kernel: &Kernel, request: &Request<'_>) -> Result<Holder, ErrorReply> {
    match actor(kernel, request)? {
        Actor::Operator { uid, .. } => Ok(Holder::Operator { uid }),
        Actor::Agent { id, .. } => {
            let owner_uid = kernel.agents.owner_uid(id).ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    format!("agent {id} is not known"),
                )
            })?;
            Ok(Holder::Agent { id, owner_uid })
        }
        Actor::Delegate { .. } => Err(delegate_refused("the state store")),
        Actor::Run { .. } => Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            "an EXEC run keeps its state in its session (EXEC `session`), never in the state \
             store: STORE, FETCH, DELETE and KEYS are for operators and agents",
        )),
    }
}

/// The job, on a worker; or the refusal, now.
fn deferred(prepared: Result<Job, ErrorReply>) -> Outcome {
    match prepared {
        Ok(job) => Outcome::Deferred(job),
        Err(err) => Outcome::Reply(err.into()),
    }
}
