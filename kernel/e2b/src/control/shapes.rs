//! The sandbox records E2B's API answers with, made from a session's.
//! The Python SDK requires every field it parses (a missing one is a
//! `KeyError` in the caller's code), so each is always there.

use std::collections::BTreeMap;

use agentos_proto::payload::{LifetimeEnd, SessionInfo, SessionState};
use serde::Serialize;

use crate::face::Sizes;
use crate::tenant::{OWN_LABEL_PREFIX, STARTED_LABEL, TEMPLATE_LABEL};

/// The envd version reported: the SDKs turn features on by it, and
/// 0.6.4 or later turns on every one the face serves.
pub const ENVD_VERSION: &str = "0.6.13";

/// `clientID`: which cluster client a sandbox runs on; one here.
pub const CLIENT_ID: &str = "agentos";

/// What create and connect answer.
#[derive(Debug, Serialize)]
pub struct SandboxAccess {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

impl SandboxAccess {
    pub fn new(
        sandbox_id: String,
        template_id: String,
        token: String,
        traffic: String,
    ) -> SandboxAccess {
        SandboxAccess {
            sandbox_id,
            template_id,
            client_id: CLIENT_ID,
            envd_version: ENVD_VERSION,
            envd_access_token: token,
            traffic_access_token: Some(traffic),
            domain: None,
        }
    }
}

/// One sandbox in a list.
#[derive(Debug, Serialize)]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "startedAt")]
    pub started_at: String,
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    pub metadata: BTreeMap<String, String>,
}

impl ListedSandbox {
    pub fn of(session: &SessionInfo, sizes: Sizes) -> ListedSandbox {
        ListedSandbox {
            template_id: session
                .labels
                .get(TEMPLATE_LABEL)
                .cloned()
                .unwrap_or_default(),
            sandbox_id: session.session.clone(),
            client_id: CLIENT_ID,
            started_at: session
                .labels
                .get(STARTED_LABEL)
                .cloned()
                .unwrap_or_else(|| session.created_at.clone()),
            // A paused sandbox kept with no end is listed as ending when
            // it started: E2B's record has no way to say "never".
            end_at: session
                .ends_at
                .clone()
                .unwrap_or_else(|| session.created_at.clone()),
            cpu_count: sizes.cpu_count,
            memory_mb: sizes.memory_mb,
            disk_size_mb: session.disk_bytes.unwrap_or(0) >> 20,
            state: e2b_state(session.state),
            envd_version: ENVD_VERSION,
            metadata: metadata_of(session),
        }
    }
}

/// One sandbox, in full.
#[derive(Debug, Serialize)]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    pub domain: Option<String>,
    pub lifecycle: Lifecycle,
}

/// What becomes of a sandbox at its timeout.
#[derive(Debug, Serialize)]
pub struct Lifecycle {
    #[serde(rename = "onTimeout")]
    pub on_timeout: &'static str,
    #[serde(rename = "autoResume")]
    pub auto_resume: bool,
}

impl Lifecycle {
    pub fn of(then: LifetimeEnd) -> Lifecycle {
        Lifecycle {
            on_timeout: match then {
                LifetimeEnd::Close => "kill",
                LifetimeEnd::Hibernate => "pause",
            },
            auto_resume: false,
        }
    }
}

/// E2B's two states: a session whose interpreter runs is `running`; a
/// frozen, hibernated or stored one is `paused`.
pub fn e2b_state(state: SessionState) -> &'static str {
    match state {
        SessionState::Running | SessionState::Ready => "running",
        SessionState::Paused | SessionState::Hibernated | SessionState::Stored => "paused",
    }
}

/// The metadata its creator gave: its labels but the face's own.
pub fn metadata_of(session: &SessionInfo) -> BTreeMap<String, String> {
    session
        .labels
        .iter()
        .filter(|(name, _)| !name.starts_with(OWN_LABEL_PREFIX))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}
