//! GET_AUDIT_LOG (0x76) and SET_AUDIT_CONFIG (0x77): the audit log (see
//! `audit`), as the Clove SDK's `get_audit_log` and `set_audit_config`
//! call it; and what the other syscalls tell it.
//!
//! An operator reads the entries of its uid's tree: those about its
//! agents and those it or its agents caused. An agent reads the entries
//! about itself and its descendants written by this kernel (agent ids are
//! given again after a restart), never another tree's nor its operator's
//! own. An EXEC run reads only what it caused itself. Only an operator
//! changes what is recorded, and security and lifecycle entries are
//! always recorded.

use std::time::Instant;

use agentos_proto::payload::{
    AuditCategory, AuditConfigReply, AuditLogRequest, SetAuditConfigRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde::Serialize;

use super::request::{actor, delegate_refused, reply, Outcome, Request};
use crate::address::Answer;
use crate::audit::{Cause, Event, Reader, Subject};
use crate::identity::Principal;
use crate::kernel::{Actor, Kernel, Root};

/// GET_AUDIT_LOG.
pub fn get(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let prepared = AuditLogRequest::parse(request.payload).and_then(|asked| {
        let boot = kernel.audit.boot();
        let reader = match actor(kernel, request)? {
            Actor::Operator { uid, .. } => Reader::Operator { uid },
            Actor::Agent { id, .. } => Reader::Agent { id, boot },
            Actor::Run { number, .. } => Reader::Run { number, boot },
            Actor::Delegate { .. } => return Err(delegate_refused("GET_AUDIT_LOG")),
        };
        Ok(kernel.audit.read(reader, asked))
    });
    match prepared {
        Ok(job) => Outcome::Deferred(job),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// SET_AUDIT_CONFIG: operators only.
pub fn set(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(
        SetAuditConfigRequest::parse(request.payload).and_then(|asked| {
            let caller = actor(kernel, request)?;
            if !matches!(caller, Actor::Operator { .. }) {
                return Err(ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "SET_AUDIT_CONFIG is for operators: {} may read the audit log \
                     (GET_AUDIT_LOG), not change what it records",
                        caller.name()
                    ),
                ));
            }
            let settings = kernel.config().audit.clone();
            let config = kernel.audit.set(&settings, &asked)?;
            note(
                kernel,
                request,
                AuditCategory::Security,
                "AUDIT_CONFIG_CHANGED",
                None,
                &config,
            );
            Ok(AuditConfigReply {
                success: true,
                config,
            })
        }),
    )
}

/// Records that `request` did `event_type` (successfully) to agent
/// `about`, if one, with `details`.
pub(super) fn note(
    kernel: &mut Kernel,
    request: &Request<'_>,
    category: AuditCategory,
    event_type: &'static str,
    about: Option<u32>,
    details: &impl Serialize,
) {
    if !kernel
        .audit
        .config(&kernel.config().audit)
        .records(category)
    {
        return;
    }
    let Some((cause, _)) = cause(kernel, request.caller.principal()) else {
        return;
    };
    let subject = about.and_then(|id| Subject::of(&kernel.agents, id));
    record(kernel, category, event_type, cause, subject, true, details);
}

/// Records a `permission_denied` reply to `request`, about the agent
/// that was refused (a run's, the agent it is of).
pub(super) fn refusal(kernel: &mut Kernel, request: &Request<'_>, outcome: &Outcome) {
    let Outcome::Reply(Answer::Error(err)) = outcome else {
        return;
    };
    if err.code != ErrorCode::PermissionDenied {
        return;
    }
    let Some((cause, agent)) = cause(kernel, request.caller.principal()) else {
        return;
    };
    let by = (cause.tree_uid, agent, cause.run);
    let Some(suppressed) = kernel.audit.admit_refusal(by, Instant::now()) else {
        return;
    };
    let subject = agent.and_then(|id| Subject::of(&kernel.agents, id));
    let details = Refused {
        opcode: request.opcode.to_string(),
        error: &err.error,
        unrecorded_before: (suppressed > 0).then_some(suppressed),
    };
    let event_type = "PERMISSION_DENIED";
    record(
        kernel,
        AuditCategory::Security,
        event_type,
        cause,
        subject,
        false,
        &details,
    );
}

fn record(
    kernel: &mut Kernel,
    category: AuditCategory,
    event_type: &'static str,
    cause: Cause,
    subject: Option<Subject>,
    success: bool,
    details: &impl Serialize,
) {
    let details = match serde_json::to_value(details) {
        Ok(details) => details,
        Err(err) => {
            log::error!("audit: the details of {event_type} cannot be written: {err}");
            return;
        }
    };
    let settings = kernel.config().audit.clone();
    let event = Event {
        category,
        event_type,
        cause,
        subject,
        success,
        details,
    };
    kernel.audit.record(&settings, event);
}

/// Who `principal` is to the audit log, and the agent it acts as (an
/// agent itself; a run, the agent it is of). `None` for an agent or a
/// run the kernel no longer knows: no tree to file it under.
fn cause(kernel: &Kernel, principal: Principal) -> Option<(Cause, Option<u32>)> {
    let (tree_uid, agent, run) = match principal {
        Principal::Operator { uid } | Principal::Delegate { uid, .. } => (uid, None, None),
        Principal::Agent { id } => (kernel.agents.owner_uid(id)?, Some(id), None),
        Principal::Run { number } => match kernel.runs.get(number)?.root {
            Root::Operator(uid) | Root::Delegate(uid, _) => (uid, None, Some(number)),
            Root::Agent(id) => (kernel.agents.owner_uid(id)?, Some(id), Some(number)),
        },
    };
    let cause = Cause {
        principal: kernel.runs.describe(principal, &kernel.agents),
        tree_uid,
        run,
    };
    Some((cause, agent))
}

/// The details of a refusal: with how many of the same caller's went
/// unrecorded before it, if any did.
#[derive(Serialize)]
struct Refused<'a> {
    opcode: String,
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    unrecorded_before: Option<u64>,
}
