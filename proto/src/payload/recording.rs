//! Record and replay (0x70–0x74), as the Clove SDK calls them: a
//! principal records the calls it and the agents it may see make, exports
//! the recording as JSON, and replays one — as itself, re-issuing only
//! NOOP and the state store's calls.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_empty_or_object, parse_json};
use crate::error::ErrorReply;

/// The most entries a recording keeps (and a replay takes).
pub const MAX_RECORDING_ENTRIES: usize = 1000;
/// A recorded request's payload is kept up to this many bytes; a longer
/// one is kept cut, marked `truncated`, and never replayed.
pub const MAX_RECORDED_PAYLOAD: usize = 4096;

/// RECORD_START: what to record.
///
/// ```
/// use agentos_proto::payload::RecordStartRequest;
/// let asked = RecordStartRequest::parse(
///     br#"{"include_think":false,"include_http":false,"include_exec":false,"max_entries":10000}"#,
/// ).unwrap();
/// assert_eq!(asked.limit(), 1000);
/// assert!(RecordStartRequest::parse(br#"{"include_all":true}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordStartRequest {
    /// Record THINK calls too.
    #[serde(default)]
    pub include_think: bool,
    /// Record HTTP calls too.
    #[serde(default)]
    pub include_http: bool,
    /// Record EXEC calls too.
    #[serde(default)]
    pub include_exec: bool,
    /// The most entries kept (at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Only these agents' calls (of those the caller may see).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_agents: Option<Vec<u32>>,
}

impl RecordStartRequest {
    /// Parses a RECORD_START payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let asked: RecordStartRequest = parse_empty_or_object("RECORD_START", payload)?;
        if asked
            .filter_agents
            .as_ref()
            .is_some_and(|ids| ids.len() > MAX_RECORDING_ENTRIES)
        {
            return Err(bad_request(format!(
                "RECORD_START field `filter_agents`: at most {MAX_RECORDING_ENTRIES} ids"
            )));
        }
        Ok(asked)
    }

    /// The most entries kept.
    pub fn limit(&self) -> usize {
        self.max_entries
            .map_or(MAX_RECORDING_ENTRIES as u64, |max| {
                max.min(MAX_RECORDING_ENTRIES as u64)
            }) as usize
    }
}

/// RECORD_STATUS: `{"export": true}` adds the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordStatusRequest {
    /// Put the recording, as a JSON string, in `recording`.
    #[serde(default)]
    pub export: bool,
}

impl RecordStatusRequest {
    /// Parses a RECORD_STATUS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("RECORD_STATUS", payload)
    }
}

/// Whether a principal is recording.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum RecordingState {
    /// Not recording (a stopped recording is kept for export).
    #[default]
    Idle,
    /// Recording.
    Recording,
}

/// The reply of RECORD_START, RECORD_STOP and RECORD_STATUS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecordStatusReply {
    /// Always true.
    pub success: bool,
    /// `RECORDING` or `IDLE`.
    pub state: RecordingState,
    /// Entries recorded.
    pub entry_count: usize,
    /// The most it keeps.
    pub max_entries: usize,
    /// Calls not kept because it was full.
    pub dropped: u64,
    /// With `export`: the entries, as a JSON string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<String>,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecordedCall {
    /// Its place in the recording, from 1.
    pub seq: u64,
    /// When it came, in milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Who made it: `operator:UID`, `agent:ID` or `run:N`.
    pub principal: String,
    /// The agent that made it, if an agent did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<u32>,
    /// Its opcode.
    pub opcode: u8,
    /// Its name.
    pub opcode_name: String,
    /// Its payload: JSON as sent (secrets redacted), or text.
    pub payload: serde_json::Value,
    /// The payload was longer than 4096 bytes and is cut (never
    /// replayed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// REPLAY_START: `{"recording": "<an exported recording>"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ReplayStartRequest {
    /// The recording, as RECORD_STATUS exported it.
    pub recording: String,
}

/// What a replay takes of an entry; the rest (who made it, when) is not
/// trusted and not read.
#[derive(Clone, Debug, Deserialize)]
pub struct ReplayEntry {
    /// Its opcode.
    pub opcode: u8,
    /// Its payload.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Cut when recorded: not replayed.
    #[serde(default)]
    pub truncated: bool,
}

impl ReplayStartRequest {
    /// Parses a REPLAY_START payload and the recording in it.
    ///
    /// ```
    /// use agentos_proto::payload::ReplayStartRequest;
    /// let entries = ReplayStartRequest::parse(
    ///     br#"{"recording":"[{\"opcode\":48,\"payload\":{\"key\":\"k\",\"value\":1},\"agent_id\":9}]"}"#,
    /// ).unwrap();
    /// assert_eq!(entries[0].opcode, 0x30);
    /// assert!(ReplayStartRequest::parse(br#"{"recording":"[]"}"#).is_err());
    /// assert!(ReplayStartRequest::parse(br#"{"recording":"{}"}"#).is_err());
    /// ```
    pub fn parse(payload: &[u8]) -> Result<Vec<ReplayEntry>, ErrorReply> {
        let asked: ReplayStartRequest = parse_json("REPLAY_START", payload)?;
        let entries: Vec<ReplayEntry> = serde_json::from_str(&asked.recording).map_err(|err| {
            bad_request(format!(
                "REPLAY_START field `recording`: not an exported recording ({err})"
            ))
        })?;
        if entries.is_empty() {
            return Err(bad_request(
                "REPLAY_START field `recording`: the recording is empty",
            ));
        }
        if entries.len() > MAX_RECORDING_ENTRIES {
            return Err(bad_request(format!(
                "REPLAY_START field `recording`: at most {MAX_RECORDING_ENTRIES} entries"
            )));
        }
        Ok(entries)
    }
}

/// How a replay went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum ReplayState {
    /// No replay yet.
    #[default]
    Idle,
    /// The last replay has ended.
    Completed,
}

/// The reply of REPLAY_START and REPLAY_STATUS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReplayStatusReply {
    /// Always true.
    pub success: bool,
    /// `IDLE` or `COMPLETED`.
    pub state: ReplayState,
    /// Entries in the recording.
    pub total_entries: usize,
    /// Entries gone through.
    pub current_entry: usize,
    /// Entries re-issued (NOOP and the state store's calls).
    pub entries_replayed: usize,
    /// Entries skipped (every other call, and cut ones).
    pub entries_skipped: usize,
}
