//! EXEC's session operations' replies: `sessions` lists the caller's
//! sessions, `close` ends one, `snapshot`, `restore` and `snapshots` keep
//! and put back a session's files.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::spawn::Limits;

/// One of the caller's sessions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionInfo {
    /// Its name.
    pub session: String,
    /// When its first run started (RFC 3339).
    pub created_at: String,
    /// When its last run started (RFC 3339).
    pub last_used_at: String,
    /// Runs so far.
    pub runs: u64,
    /// Bytes of files in its `/workspace`.
    pub workspace_bytes: u64,
    /// `running` (an order of it is going), `ready` (its interpreter
    /// waits), `paused` (its interpreter frozen), `hibernated` (its
    /// globals saved and its interpreter ended: its next run or a RESUME
    /// brings it back) or `stored` (only its disk is left; its next run
    /// starts a fresh interpreter).
    pub state: SessionState,
    /// Its disk's size, when it has one (the most its files may take).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Bytes used on its disk, when it is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_used_bytes: Option<u64>,
    /// The labels it was opened with (`open`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// When its lifetime ends (RFC 3339), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<String>,
    /// What becomes of it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<LifetimeEnd>,
    /// The limits its sandbox is held to, while it has an interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// What its sandbox uses now, while it has an interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<SessionUsage>,
}

/// What a session's sandbox uses, read from its cgroup when it is listed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionUsage {
    /// Memory charged to it now, page cache included, in bytes.
    pub memory_bytes: u64,
    /// Of that, page cache (files read and written), in bytes.
    pub memory_cache_bytes: u64,
    /// CPU time its processes have used since its interpreter started, in
    /// microseconds.
    pub cpu_usec: u64,
    /// Milliseconds since its interpreter started (over which `cpu_usec`
    /// was used).
    pub uptime_ms: u64,
    /// Processes and threads in it now.
    pub pids: u64,
}

/// What becomes of a session at the end of its lifetime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LifetimeEnd {
    /// It is closed, its files and all.
    #[default]
    Close,
    /// It is hibernated: its globals and files kept, its interpreter
    /// ended; its next run or a RESUME brings it back.
    Hibernate,
}

/// A session's lifetime: `ms` from when it is set, then `then`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// Milliseconds from when it is set, 1 to 30 days' worth.
    pub ms: u64,
    /// What then becomes of the session.
    pub then: LifetimeEnd,
}

/// What `open` gives a session beyond what a run gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionSetup {
    /// The environment of the processes started in it (never listed).
    pub env: BTreeMap<String, String>,
    /// Labels it is listed with (`None`: a stored session keeps its own).
    pub labels: Option<BTreeMap<String, String>>,
    /// When it ends, and how.
    pub lifetime: Option<Lifetime>,
}

/// Where a session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// An order of it is going.
    Running,
    /// Its interpreter waits for the next run.
    Ready,
    /// Its interpreter is frozen.
    Paused,
    /// Its globals are saved and its interpreter ended.
    Hibernated,
    /// Only its disk is left.
    Stored,
}

/// The reply to `{"op":"sessions"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionsReply {
    /// Always true.
    pub success: bool,
    /// The caller's sessions.
    pub sessions: Vec<SessionInfo>,
}

/// The reply to `{"op":"close"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClosedReply {
    /// Always true.
    pub success: bool,
    /// The session existed and is gone.
    pub closed: bool,
}

/// One snapshot of a session's workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SnapshotInfo {
    /// Its name.
    pub name: String,
    /// Bytes of files in it.
    pub bytes: u64,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// It keeps the interpreter's globals too.
    #[serde(default)]
    pub state: bool,
}

/// The reply to `{"op":"snapshot"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SnapshotReply {
    /// Always true.
    pub success: bool,
    /// The snapshot taken.
    pub snapshot: SnapshotInfo,
    /// Paths of the session's files not saved: symlinks and special
    /// files (never followed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// With `state`: the globals that could not be saved (each name, with
    /// why), none dropped silently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_saved: Vec<String>,
}

/// The reply to `{"op":"restore"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestoredReply {
    /// Always true.
    pub success: bool,
    /// The session restored into (`into`, or the snapshot's own).
    pub session: String,
    /// The saved globals that could not be restored (each name, with
    /// why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

/// The reply to `{"op":"snapshots"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SnapshotsReply {
    /// Always true.
    pub success: bool,
    /// The session's snapshots, oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}
