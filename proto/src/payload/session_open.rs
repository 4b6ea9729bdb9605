//! EXEC's `open` and `lifetime` ops: a session opened with no code run —
//! its template, network, limits, volumes and permissions as a run's, and
//! besides an environment for the processes started in it, labels it is
//! listed with, and a lifetime at whose end the kernel closes or
//! hibernates it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::exec_run::{ExecRequest, RunPermissions};
use super::network::Network;
use super::parse::{bad_request, validate_name};
use super::sessions::{Lifetime, LifetimeEnd, SessionSetup, SessionState};
use super::spawn::Limits;
use super::volumes::VolumeMount;
use crate::error::ErrorReply;

/// The longest lifetime a session may be given: 30 days.
pub const MAX_LIFETIME_MS: u64 = 30 * 24 * 3600 * 1000;
/// Labels a session may carry.
pub const MAX_LABELS: usize = 32;
/// Bytes of labels (names and values) a session may carry.
pub const MAX_LABEL_BYTES: usize = 4096;
/// Variables a session's environment may hold.
pub const MAX_ENV_VARS: usize = 256;
/// Bytes of a session's environment (names and values).
pub const MAX_ENV_BYTES: usize = 64 << 10;

/// An `open` request: the run of no code that opens the session, and its
/// setup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOpen {
    /// The session's name, template, network, limits, volumes and
    /// permissions, as a run names them (its `code` is empty).
    pub run: ExecRequest,
    /// The rest.
    pub setup: SessionSetup,
}

impl Serialize for SessionOpen {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OpenOut<'a> {
            session: &'a Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            template: &'a Option<String>,
            #[serde(skip_serializing_if = "<[VolumeMount]>::is_empty")]
            volumes: &'a [VolumeMount],
            #[serde(skip_serializing_if = "Option::is_none")]
            timeout_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            limits: &'a Option<Limits>,
            #[serde(skip_serializing_if = "Option::is_none")]
            permissions: &'a Option<RunPermissions>,
            #[serde(skip_serializing_if = "Option::is_none")]
            network: &'a Option<Network>,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            env: &'a BTreeMap<String, String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            labels: &'a Option<BTreeMap<String, String>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            lifetime_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            then: Option<LifetimeEnd>,
        }
        let (run, setup) = (&self.run, &self.setup);
        OpenOut {
            session: &run.session,
            template: &run.template,
            volumes: &run.volumes,
            timeout_ms: run.timeout_ms,
            limits: &run.limits,
            permissions: &run.permissions,
            network: &run.network,
            env: &setup.env,
            labels: &setup.labels,
            lifetime_ms: setup.lifetime.map(|l| l.ms),
            then: setup.lifetime.map(|l| l.then),
        }
        .serialize(serializer)
    }
}

/// `lifetime`'s fields as the wire has them: `lifetime_ms` (`null` for
/// none) and `then`.
pub(super) mod lifetime_fields {
    use serde::{Serialize, Serializer};

    use super::{Lifetime, LifetimeEnd};

    pub fn serialize<S: Serializer>(lifetime: &Option<Lifetime>, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields {
            lifetime_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            then: Option<LifetimeEnd>,
        }
        Fields {
            lifetime_ms: lifetime.map(|l| l.ms),
            then: lifetime.map(|l| l.then),
        }
        .serialize(s)
    }
}

/// Every field `open` may carry.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(super) struct OpenWire {
    #[serde(rename = "op")]
    _op: String,
    session: Option<String>,
    template: Option<String>,
    #[serde(default)]
    volumes: Vec<VolumeMount>,
    timeout_ms: Option<u64>,
    limits: Option<Limits>,
    permissions: Option<RunPermissions>,
    network: Option<Network>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    labels: Option<BTreeMap<String, String>>,
    lifetime_ms: Option<u64>,
    then: Option<LifetimeEnd>,
}

impl OpenWire {
    /// The request it makes, checked.
    pub(super) fn open(self) -> Result<SessionOpen, ErrorReply> {
        let session = self.session.ok_or_else(|| {
            bad_request("EXEC field `session` is missing: `open` names a session")
        })?;
        let run = ExecRequest {
            session: Some(session),
            template: self.template,
            volumes: self.volumes,
            timeout_ms: self.timeout_ms,
            limits: self.limits,
            permissions: self.permissions,
            network: self.network,
            ..ExecRequest::default()
        };
        run.validate()?;
        check_env(&self.env)?;
        if let Some(labels) = &self.labels {
            check_labels(labels)?;
        }
        let setup = SessionSetup {
            env: self.env,
            labels: self.labels,
            lifetime: lifetime(self.lifetime_ms, self.then)?,
        };
        Ok(SessionOpen { run, setup })
    }
}

/// A `lifetime` request's fields.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(super) struct LifetimeWire {
    #[serde(rename = "op")]
    _op: String,
    session: Option<String>,
    /// Required, `null` to clear it.
    #[serde(default, deserialize_with = "present")]
    lifetime_ms: Option<Option<u64>>,
    then: Option<LifetimeEnd>,
}

/// Tells a field given as `null` from one left out.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

impl LifetimeWire {
    /// The session it names and its new lifetime (`None`: none).
    pub(super) fn lifetime(self) -> Result<(String, Option<Lifetime>), ErrorReply> {
        let session = self.session.ok_or_else(|| {
            bad_request("EXEC field `session` is missing: `lifetime` names a session")
        })?;
        validate_name("session", &session)?;
        let ms = self.lifetime_ms.ok_or_else(|| {
            bad_request(
                "EXEC field `lifetime_ms` is missing: give the milliseconds from now, or null \
                 for none",
            )
        })?;
        if ms.is_none() && self.then.is_some() {
            return Err(bad_request(
                "EXEC field `then`: a session without a lifetime has no end to choose",
            ));
        }
        Ok((session, lifetime(ms, self.then)?))
    }
}

/// `lifetime_ms` and `then`, checked.
fn lifetime(ms: Option<u64>, then: Option<LifetimeEnd>) -> Result<Option<Lifetime>, ErrorReply> {
    match (ms, then) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(bad_request(
            "EXEC field `then` needs `lifetime_ms`: what becomes of the session at its end",
        )),
        (Some(ms), _) if ms == 0 || ms > MAX_LIFETIME_MS => Err(bad_request(format!(
            "EXEC field `lifetime_ms`: {ms} is not 1 to {MAX_LIFETIME_MS} (30 days)"
        ))),
        (Some(ms), then) => Ok(Some(Lifetime {
            ms,
            then: then.unwrap_or_default(),
        })),
    }
}

/// Whether map `field` holds at most `most` entries (`what`) and
/// `max_bytes` of names and values.
fn within(
    field: &str,
    what: &str,
    map: &BTreeMap<String, String>,
    most: usize,
    max_bytes: usize,
) -> Result<(), ErrorReply> {
    if map.len() > most {
        return Err(bad_request(format!(
            "EXEC field `{field}`: {} {what}, more than {most}",
            map.len()
        )));
    }
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > max_bytes {
        return Err(bad_request(format!(
            "EXEC field `{field}`: {bytes} bytes, more than {max_bytes}"
        )));
    }
    Ok(())
}

/// A session's environment: names without `=` or NUL, none of the
/// kernel's own (`AGENTOS_*`), values without NUL, within the caps.
pub(super) fn check_env(env: &BTreeMap<String, String>) -> Result<(), ErrorReply> {
    within("env", "variables", env, MAX_ENV_VARS, MAX_ENV_BYTES)?;
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(bad_request(format!(
                "EXEC field `env`: {name:?} is not a valid variable (a name without `=` or \
                 NUL, a value without NUL)"
            )));
        }
        if name.starts_with("AGENTOS_") {
            return Err(bad_request(format!(
                "EXEC field `env`: {name:?} is the kernel's (AGENTOS_* are reserved)"
            )));
        }
    }
    Ok(())
}

/// A session's labels: at most 32, 4 KiB in all, names 1 to 64 bytes,
/// names and values printable (no control characters).
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ErrorReply> {
    within("labels", "labels", labels, MAX_LABELS, MAX_LABEL_BYTES)?;
    for (name, value) in labels {
        let printable = |text: &str| !text.chars().any(char::is_control);
        if name.is_empty() || name.len() > 64 || !printable(name) || !printable(value) {
            return Err(bad_request(format!(
                "EXEC field `labels`: {name:?} is not a label (a name of 1 to 64 bytes, name \
                 and value without control characters)"
            )));
        }
    }
    Ok(())
}

/// The reply to `open`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionOpenedReply {
    /// Always true.
    pub success: bool,
    /// The session.
    pub session: String,
    /// `ready`.
    pub state: SessionState,
    /// Its interpreter is a fresh one on a stored session's disk.
    #[serde(default)]
    pub fresh_interpreter: bool,
    /// When its lifetime ends (RFC 3339), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<String>,
}

/// The reply to `lifetime`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LifetimeReply {
    /// Always true.
    pub success: bool,
    /// The session.
    pub session: String,
    /// When its lifetime ends now (RFC 3339); `null`: it has none.
    pub ends_at: Option<String>,
}
