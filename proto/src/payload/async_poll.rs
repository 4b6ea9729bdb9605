//! Clove's asynchronous EXEC: `"async": true` on an EXEC answers at once
//! with a `request_id` (the run becomes a TASK of the caller's), and
//! ASYNC_POLL (0x80) hands over the results that are done, each once.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_empty_or_object};
use crate::error::ErrorReply;

/// The most results one ASYNC_POLL hands over.
pub const MAX_ASYNC_RESULTS: usize = 100;

/// The two fields of an EXEC payload that ask for a later answer; the
/// rest is `ExecRequest`'s to check.
#[derive(Deserialize)]
struct AsyncFields {
    #[serde(default, rename = "async")]
    asynchronous: bool,
    #[serde(default)]
    request_id: Option<serde_json::Value>,
}

/// An EXEC that asked to be answered later, under this id (the kernel
/// makes one when the client gave none).
///
/// ```
/// use agentos_proto::payload::AsyncAsk;
/// assert!(AsyncAsk::of_exec(br#"{"command":"ls","async":false}"#).unwrap().is_none());
/// let ask = AsyncAsk::of_exec(br#"{"command":"ls","async":true,"request_id":7}"#).unwrap();
/// assert_eq!(ask.unwrap().request_id, Some(7));
/// assert!(AsyncAsk::of_exec(br#"{"command":"ls","async":true,"request_id":"x"}"#).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncAsk {
    /// The client's id for it, if it gave one.
    pub request_id: Option<u64>,
}

impl AsyncAsk {
    /// Whether an EXEC payload asks to be answered later. A payload that
    /// is not an object of the right shape asks nothing here: EXEC's own
    /// parse says what is wrong with it.
    pub fn of_exec(payload: &[u8]) -> Result<Option<AsyncAsk>, ErrorReply> {
        let Ok(fields) = serde_json::from_slice::<AsyncFields>(payload) else {
            return Ok(None);
        };
        if !fields.asynchronous {
            return Ok(None);
        }
        let request_id = match fields.request_id {
            None | Some(serde_json::Value::Null) => None,
            Some(id) => Some(id.as_u64().filter(|id| *id > 0).ok_or_else(|| {
                bad_request("EXEC field `request_id`: a positive integer, or leave it out")
            })?),
        };
        Ok(Some(AsyncAsk { request_id }))
    }
}

/// EXEC's answer to an asynchronous request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AsyncExecReply {
    /// Always true.
    pub success: bool,
    /// The id ASYNC_POLL gives its result under.
    pub request_id: u64,
    /// The TASK that runs it (TASK `status`, `wait` and `cancel` take it).
    pub task_id: String,
}

/// An ASYNC_POLL request: empty, or `{"max": N}` (at most 100).
///
/// ```
/// use agentos_proto::payload::AsyncPollRequest;
/// assert_eq!(AsyncPollRequest::parse(b"").unwrap().limit(), 10);
/// assert_eq!(AsyncPollRequest::parse(br#"{"max":1000000000}"#).unwrap().limit(), 100);
/// assert!(AsyncPollRequest::parse(br#"{"mx":1}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AsyncPollRequest {
    /// The most results wanted (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

impl AsyncPollRequest {
    /// Parses an ASYNC_POLL payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("ASYNC_POLL", payload)
    }

    /// How many results to hand over at most.
    pub fn limit(&self) -> usize {
        self.max
            .map_or(10, |max| max.min(MAX_ASYNC_RESULTS as u64) as usize)
    }
}

/// One finished asynchronous request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AsyncResult {
    /// Its id.
    pub request_id: u64,
    /// The opcode it was (EXEC).
    pub opcode: u8,
    /// The opcode's name.
    pub opcode_name: String,
    /// Its reply, as a JSON string (what a synchronous call would have
    /// answered).
    pub payload: String,
    /// The TASK that ran it.
    pub task_id: String,
}

/// ASYNC_POLL's reply: the results that are done, oldest first, each
/// handed over once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AsyncPollReply {
    /// Always true.
    pub success: bool,
    /// The results.
    pub results: Vec<AsyncResult>,
    /// How many.
    pub count: usize,
}
