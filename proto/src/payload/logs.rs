//! LOGS (0x16): an agent's log — its last lines, or what it writes after
//! a point, waiting for more when asked to follow.

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::kill::AgentRef;
use super::parse::{check_range, parse_json};
use crate::error::ErrorReply;

/// Lines a tail gives when the request names no number.
pub const DEFAULT_LOG_LINES: u64 = 100;
/// Most lines one tail may ask for.
pub const MAX_LOG_LINES: u64 = 100_000;
/// Most bytes of log text one reply carries (JSON escapes make a reply up
/// to six times that); a follower asks again from the reply's `offset`
/// for the rest.
pub const MAX_LOG_CHUNK: u64 = 256 << 10;
/// How long a follow waits for new output when the request names no time.
pub const DEFAULT_FOLLOW_WAIT_MS: u64 = 10_000;
/// Longest wait a follow may ask for.
pub const MAX_FOLLOW_WAIT_MS: u64 = 60_000;

/// A LOGS request.
///
/// ```
/// use agentos_proto::payload::{AgentRef, LogsRequest};
/// let tail = LogsRequest::parse(br#"{"name":"w1","lines":20}"#).unwrap();
/// assert_eq!(tail.target().unwrap(), AgentRef::Name("w1".into()));
/// assert_eq!(tail.lines(), 20);
/// let follow = LogsRequest::parse(br#"{"id":7,"after":4096,"follow":true}"#).unwrap();
/// assert_eq!(follow.wait_ms(), 10_000);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LogsRequest {
    /// The agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The agent's name (the live one, else the latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Without `after`: how many of the last lines (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// The byte offset to read on from (a previous reply's `offset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// Wait for output beyond `after` (or beyond the current end) until
    /// some comes, the agent ends, or `wait_ms` passes.
    #[serde(default)]
    pub follow: bool,
    /// How long a follow waits (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

impl LogsRequest {
    /// Parses and validates a LOGS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: LogsRequest = parse_json("LOGS", payload)?;
        request.target()?;
        check_range("lines", request.lines, 0, MAX_LOG_LINES)?;
        check_range("wait_ms", request.wait_ms, 0, MAX_FOLLOW_WAIT_MS)?;
        Ok(request)
    }

    /// The agent named by the request.
    pub fn target(&self) -> Result<AgentRef, ErrorReply> {
        AgentRef::from_fields("LOGS", self.id, self.name.as_deref())
    }

    /// Lines of the tail, defaulted.
    pub fn lines(&self) -> u64 {
        self.lines.unwrap_or(DEFAULT_LOG_LINES)
    }

    /// A follow's wait, defaulted.
    pub fn wait_ms(&self) -> u64 {
        self.wait_ms.unwrap_or(DEFAULT_FOLLOW_WAIT_MS)
    }
}

/// The reply to LOGS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LogsReply {
    /// Always true; failures are error replies.
    pub success: bool,
    /// The agent's id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its state when the reply was made.
    pub state: AgentState,
    /// Log text (UTF-8; bytes that are not are replaced).
    pub text: String,
    /// Where the text ends in the log: the `after` of the next request.
    pub offset: u64,
    /// The agent has ended and the reply reaches the end of its log: a
    /// follower stops here.
    pub ended: bool,
    /// The log was cut since `after` (it is kept under a size by dropping
    /// its older half), so the text starts again at the log's beginning.
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn bad_requests_name_the_field() {
        for (payload, code, says) in [
            (&br#"{}"#[..], ErrorCode::BadRequest, "`id` or `name`"),
            (br#"{"id":1,"name":"a"}"#, ErrorCode::BadRequest, "not both"),
            (br#"{"name":"../etc"}"#, ErrorCode::BadRequest, "name"),
            (
                br#"{"id":1,"lines":100001}"#,
                ErrorCode::LimitExceeded,
                "lines",
            ),
            (
                br#"{"id":1,"wait_ms":60001}"#,
                ErrorCode::LimitExceeded,
                "wait_ms",
            ),
            (br#"{"id":-1}"#, ErrorCode::BadRequest, "id"),
            (br#"{"id":1,"after":"x"}"#, ErrorCode::BadRequest, "after"),
        ] {
            let err = LogsRequest::parse(payload).unwrap_err();
            assert_eq!(err.code, code, "{err:?}");
            assert!(err.error.contains(says), "{err:?}");
        }
    }
}
