//! A sandbox's life once made: read it, end it, set its timeout, pause
//! it, and connect to it (waking it if it sleeps).

use agentos_proto::payload::{
    ExecRequest, LifetimeEnd, SessionInfo, SessionOpen, SessionSetup, SessionState,
};
use chrono::{DateTime, Utc};
use http::StatusCode;
use serde::Deserialize;

use super::context::Control;
use super::create::{kernel_template, lifetime_of, within_quota};
use super::shapes::{Lifecycle, ListedSandbox, SandboxAccess, SandboxDetail};
use crate::answer::ApiError;
use crate::tenant::{ON_TIMEOUT_LABEL, TEMPLATE_LABEL};

/// `POST /v2/sandboxes/{id}/connect`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectBody {
    timeout: Option<i64>,
    /// `false`: come back without the paused memory (a fresh start).
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutBody {
    timeout: i64,
}

/// `POST /sandboxes/{id}/pause`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// `false`: keep the files only (hibernate); else keep the memory
    /// too (freeze).
    memory: Option<bool>,
    /// Pause only a guest that answers: every sandbox's steward does.
    #[serde(rename = "requireHealthyGuest")]
    _require_healthy_guest: Option<bool>,
}

/// What becomes of `session` at its timeout, as its creator asked.
fn then_of(session: &SessionInfo) -> LifetimeEnd {
    match session.labels.get(ON_TIMEOUT_LABEL).map(String::as_str) {
        Some("pause") => LifetimeEnd::Hibernate,
        _ => LifetimeEnd::Close,
    }
}

/// `GET /sandboxes/{id}`.
pub async fn detail(cx: &Control<'_>, id: &str) -> Result<SandboxDetail, ApiError> {
    let session = cx.tenant.sandbox(id).await?;
    let token = cx.face.tokens.mint(cx.tenant.delegate, &session.session);
    Ok(SandboxDetail {
        listed: ListedSandbox::of(&session, cx.face.sizing.sizes()),
        envd_access_token: token,
        domain: None,
        lifecycle: Lifecycle::of(then_of(&session)),
    })
}

/// `DELETE /sandboxes/{id}`.
pub async fn kill(cx: &Control<'_>, id: &str) -> Result<(), ApiError> {
    cx.tenant.sandbox(id).await?;
    cx.face.cpu_samples().forget(cx.tenant.delegate, id);
    match cx.tenant.close(id).await? {
        true => Ok(()),
        false => Err(ApiError::not_found(id)),
    }
}

/// `POST /sandboxes/{id}/timeout`: it ends `timeout` seconds from now
/// (a negative one is now), as its creator asked it to end.
pub async fn set_timeout(cx: &Control<'_>, id: &str, body: TimeoutBody) -> Result<(), ApiError> {
    let session = cx.tenant.sandbox(id).await?;
    let mut lifetime = lifetime_of(Some(body.timeout.max(1)), then_of(&session))?;
    if body.timeout <= 0 {
        lifetime.ms = 1;
    }
    cx.tenant.set_lifetime(id, lifetime).await
}

/// `POST /sandboxes/{id}/pause`: 409 if it is paused already. Keeping
/// the memory freezes it for the face's `paused_keep`, after which it
/// is hibernated (its files kept); without, it is hibernated now.
pub async fn pause(cx: &Control<'_>, id: &str, body: PauseBody) -> Result<(), ApiError> {
    let session = cx.tenant.sandbox(id).await?;
    if !matches!(session.state, SessionState::Running | SessionState::Ready) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is already paused"),
        ));
    }
    if body.memory == Some(false) {
        return cx.tenant.pause(id, true).await;
    }
    cx.tenant.pause(id, false).await?;
    let kept = cx.face.sizing.paused_keep_ms;
    let lifetime = agentos_proto::payload::Lifetime {
        ms: kept,
        then: LifetimeEnd::Hibernate,
    };
    cx.tenant.set_lifetime(id, lifetime).await
}

/// `POST /v2/sandboxes/{id}/connect`: a running sandbox's timeout is
/// only ever extended (200); a paused one is woken first (201).
pub async fn connect(
    cx: &Control<'_>,
    id: &str,
    body: ConnectBody,
) -> Result<(StatusCode, SandboxAccess), ApiError> {
    let session = cx.tenant.sandbox(id).await.map_err(|err| {
        if err.status == StatusCode::NOT_FOUND {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Paused sandbox {id} not found"),
            )
        } else {
            err
        }
    })?;
    let then = then_of(&session);
    let lifetime = lifetime_of(body.timeout, then)?;
    let template_id = session
        .labels
        .get(TEMPLATE_LABEL)
        .cloned()
        .unwrap_or_default();
    let status = match session.state {
        SessionState::Running | SessionState::Ready => {
            let now = DateTime::<Utc>::from(std::time::SystemTime::now());
            let wanted = now + chrono::Duration::milliseconds(lifetime.ms as i64);
            let ends = session
                .ends_at
                .as_deref()
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok());
            if ends.is_none_or(|ends| ends < wanted) {
                cx.tenant.set_lifetime(id, lifetime).await?;
            }
            return Ok((StatusCode::OK, cx.access(session.session, template_id)));
        }
        SessionState::Paused => {
            if body.memory == Some(false) {
                cx.tenant.pause(id, true).await?;
            }
            cx.tenant.resume(id).await?;
            StatusCode::CREATED
        }
        // Woken, it is live again: within the key's share.
        SessionState::Hibernated => {
            let _place = within_quota(cx, id).await?;
            cx.tenant.resume(id).await?;
            StatusCode::CREATED
        }
        // Only its disk is left (the kernel restarted): it opens
        // again on it, from its template, with the face's limits.
        SessionState::Stored => {
            let _place = within_quota(cx, id).await?;
            let open = SessionOpen {
                run: ExecRequest {
                    session: Some(id.to_owned()),
                    template: kernel_template(&template_id),
                    limits: Some(cx.face.sizing.limits()),
                    ..ExecRequest::default()
                },
                setup: SessionSetup {
                    lifetime: Some(lifetime),
                    ..SessionSetup::default()
                },
            };
            cx.tenant.open(open).await?;
            return Ok((StatusCode::CREATED, cx.access(id.to_owned(), template_id)));
        }
    };
    cx.tenant.set_lifetime(id, lifetime).await?;
    Ok((status, cx.access(id.to_owned(), template_id)))
}
