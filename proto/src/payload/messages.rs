//! SEND (0x20), RECV (0x21), BROADCAST (0x22) and REGISTER (0x23): names
//! and mailboxes, as the Clove SDK's `register_name`, `send_message`,
//! `recv_messages` and `broadcast` send them.
//!
//! A message is any JSON value. Who sent it is the kernel's to say: a
//! request naming its own sender (`from`, `from_id`, ...) is refused like
//! any unknown field. Whom a caller may message, and how much a mailbox
//! holds, are the kernel's rules.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_empty_or_object, parse_json, validate_name};
use crate::error::{ErrorCode, ErrorReply};

/// The largest message, as JSON, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The most messages one RECV returns, whatever its `max` asks.
pub const MAX_RECV: usize = 100;
/// RECV's `max` when the request leaves it out (the Clove SDK's default).
pub const DEFAULT_RECV: usize = 10;

/// A REGISTER request: `{"name": "..."}`, a name to be messaged by.
///
/// ```
/// use agentos_proto::payload::RegisterRequest;
/// assert_eq!(RegisterRequest::parse(br#"{"name":"ipc-main"}"#).unwrap().name, "ipc-main");
/// assert!(RegisterRequest::parse(br#"{"name":""}"#).is_err());
/// assert!(RegisterRequest::parse(br#"{"name":"a b"}"#).is_err());
/// assert!(RegisterRequest::parse(br#"{"name":"a","agent_id":3}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// `[A-Za-z0-9_.-]{1,64}`, as an agent's name.
    pub name: String,
}

impl RegisterRequest {
    /// Parses a REGISTER payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: RegisterRequest = parse_json("REGISTER", payload)?;
        validate_name("name", &request.name)?;
        Ok(request)
    }
}

/// REGISTER's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RegisterReply {
    /// Always true.
    pub success: bool,
    /// The caller's id: what others send to, and what its messages carry.
    pub agent_id: u32,
    /// The name it now has.
    pub name: String,
    /// The name it had before, which is released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<String>,
}

/// A SEND request: `{"message": <any JSON>, "to": N}` or `{"message": ...,
/// "to_name": "..."}` (`to_id` is accepted for `to`). With both, `to`
/// wins, as in Clove; a `to` of 0 means none.
///
/// ```
/// use agentos_proto::payload::SendRequest;
/// let by_name = SendRequest::parse(br#"{"message":{"task":1},"to_name":"w"}"#).unwrap();
/// assert_eq!(by_name.to_name.as_deref(), Some("w"));
/// assert_eq!(SendRequest::parse(br#"{"message":1,"to_id":7}"#).unwrap().to, Some(7));
/// assert!(SendRequest::parse(br#"{"message":1}"#).is_err());
/// assert!(SendRequest::parse(br#"{"message":1,"to":0}"#).is_err());
/// assert!(SendRequest::parse(br#"{"message":1,"to":7,"from_id":1}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// What to send: any JSON value (Clove's default: `{}`).
    #[serde(default = "empty_object")]
    pub message: serde_json::Value,
    /// The recipient's id (an agent's, or an operator connection's).
    #[serde(default, alias = "to_id", skip_serializing_if = "Option::is_none")]
    pub to: Option<u32>,
    /// The recipient's name: registered, or an agent's SPAWN name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_name: Option<String>,
}

/// Whom a SEND is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipient {
    /// By id.
    Id(u32),
    /// By name.
    Name(String),
}

impl SendRequest {
    /// Parses a SEND payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: SendRequest = parse_json("SEND", payload)?;
        request.recipient()?;
        check_message("SEND", &request.message)?;
        Ok(request)
    }

    /// Whom it is for.
    pub fn recipient(&self) -> Result<Recipient, ErrorReply> {
        match (self.to.filter(|id| *id != 0), &self.to_name) {
            (Some(id), _) => Ok(Recipient::Id(id)),
            (None, Some(name)) => {
                validate_name("to_name", name)?;
                Ok(Recipient::Name(name.clone()))
            }
            (None, None) => Err(bad_request(
                "SEND needs a recipient: `to` (an id other than 0) or `to_name`",
            )),
        }
    }
}

/// SEND's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SendReply {
    /// Always true.
    pub success: bool,
    /// The id of the mailbox the message went to.
    pub delivered_to: u32,
}

/// A RECV request: empty, or `{"max": N, "wait": bool}`. `max` above
/// [`MAX_RECV`] takes [`MAX_RECV`]; Clove's `wait` is accepted, and RECV
/// never waits (poll again).
///
/// ```
/// use agentos_proto::payload::RecvRequest;
/// assert_eq!(RecvRequest::parse(b"").unwrap().limit(), 10);
/// assert_eq!(RecvRequest::parse(br#"{"max":1000000000}"#).unwrap().limit(), 100);
/// assert_eq!(RecvRequest::parse(br#"{"max":-5}"#).unwrap().limit(), 0);
/// assert!(RecvRequest::parse(br#"{"max":"all"}"#).is_err());
/// assert!(RecvRequest::parse(br#"{"mux":1}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecvRequest {
    /// The most messages to take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
    /// Clove's; RECV answers at once either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
}

impl RecvRequest {
    /// Parses a RECV payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("RECV", payload)
    }

    /// How many messages to take at most: `max`, within 0 and
    /// [`MAX_RECV`].
    pub fn limit(&self) -> usize {
        match self.max {
            None => DEFAULT_RECV,
            Some(max) => usize::try_from(max.max(0)).map_or(MAX_RECV, |max| max.min(MAX_RECV)),
        }
    }
}

/// A message as RECV gives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReceivedMessage {
    /// The sender's id, as the kernel knows it (Clove's kernel's field).
    pub from: u32,
    /// The same (the field Clove's SDK and tests read).
    pub from_id: u32,
    /// The sender's registered name, else an agent's SPAWN name.
    pub from_name: Option<String>,
    /// `agent`, `operator` or `run` (an EXEC run of the agent or operator
    /// in `run_of`).
    pub from_kind: SenderKind,
    /// For a run: the id of the agent or operator connection it runs for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_of: Option<u32>,
    /// What was sent.
    pub message: serde_json::Value,
    /// How long it waited in the mailbox, in milliseconds.
    pub age_ms: u64,
}

/// What kind of principal sent a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SenderKind {
    /// An agent.
    Agent,
    /// An operator's connection.
    Operator,
    /// An EXEC run's connection.
    Run,
}

/// RECV's reply: the oldest messages first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecvReply {
    /// Always true.
    pub success: bool,
    /// The messages taken.
    pub messages: Vec<ReceivedMessage>,
    /// How many.
    pub count: usize,
    /// How many are still waiting.
    pub remaining: usize,
}

/// A BROADCAST request: `{"message": <any JSON>, "include_self": bool}`.
///
/// ```
/// use agentos_proto::payload::BroadcastRequest;
/// let request = BroadcastRequest::parse(br#"{"message":{"e":1},"include_self":true}"#).unwrap();
/// assert!(request.include_self);
/// assert!(BroadcastRequest::parse(br#"{"message":1,"to":3}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BroadcastRequest {
    /// What to send.
    #[serde(default = "empty_object")]
    pub message: serde_json::Value,
    /// Whether the sender's own mailbox gets it too.
    #[serde(default)]
    pub include_self: bool,
}

impl BroadcastRequest {
    /// Parses a BROADCAST payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: BroadcastRequest = parse_json("BROADCAST", payload)?;
        check_message("BROADCAST", &request.message)?;
        Ok(request)
    }
}

/// BROADCAST's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BroadcastReply {
    /// Always true.
    pub success: bool,
    /// How many mailboxes it went to.
    pub delivered_count: usize,
    /// How many mailboxes were full and did not get it.
    pub full_count: usize,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// The size of `message` as JSON, within [`MAX_MESSAGE_BYTES`].
pub fn message_bytes(message: &serde_json::Value) -> usize {
    serde_json::to_vec(message).map_or(usize::MAX, |json| json.len())
}

fn check_message(what: &str, message: &serde_json::Value) -> Result<(), ErrorReply> {
    let bytes = message_bytes(message);
    if bytes > MAX_MESSAGE_BYTES {
        return Err(ErrorReply::new(
            ErrorCode::LimitExceeded,
            format!(
                "{what} field `message`: {bytes} bytes as JSON, over the limit of \
                 {MAX_MESSAGE_BYTES}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_over_the_cap_is_refused_and_one_at_it_is_kept() {
        let filler = |n: usize| format!(r#"{{"message":"{}","to":3}}"#, "x".repeat(n));
        let at_cap = filler(MAX_MESSAGE_BYTES - 2);
        assert!(SendRequest::parse(at_cap.as_bytes()).is_ok());
        let over = filler(MAX_MESSAGE_BYTES - 1);
        let err = SendRequest::parse(over.as_bytes()).unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
    }

    #[test]
    fn a_sender_cannot_be_claimed_in_a_request() {
        for forged in [
            r#"{"message":1,"to":3,"from":9}"#,
            r#"{"message":1,"to":3,"from_id":9}"#,
            r#"{"message":1,"to":3,"from_name":"root"}"#,
        ] {
            let err = SendRequest::parse(forged.as_bytes()).unwrap_err();
            assert_eq!(err.code, ErrorCode::BadRequest, "{forged}");
        }
        let err = BroadcastRequest::parse(br#"{"message":1,"from_id":9}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
    }

    #[test]
    fn an_id_wins_over_a_name_and_a_bad_name_is_refused() {
        let both = SendRequest::parse(br#"{"message":1,"to":4,"to_name":"w"}"#).unwrap();
        assert_eq!(both.recipient().unwrap(), Recipient::Id(4));
        assert!(SendRequest::parse(br#"{"message":1,"to_name":"../x"}"#).is_err());
        assert!(SendRequest::parse(br#"{"message":1,"to":-1}"#).is_err());
    }
}
