//! KILL (0x11): stop an agent's process tree.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, check_range, parse_json, validate_name};
use crate::error::{ErrorCode, ErrorReply};

/// Default time between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE_MS: u64 = 5000;
/// Longest grace a KILL may ask for (five minutes).
pub const MAX_GRACE_MS: u64 = 300_000;

/// Which agent a request is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentRef {
    /// By the id SPAWN returned.
    Id(u32),
    /// By name.
    Name(String),
}

impl AgentRef {
    /// The agent an `op` request names by exactly one of `id` and `name`.
    pub fn from_fields(op: &str, id: Option<u32>, name: Option<&str>) -> Result<Self, ErrorReply> {
        match (id, name) {
            (Some(id), None) => Ok(AgentRef::Id(id)),
            (None, Some(name)) => {
                validate_name("name", name)?;
                Ok(AgentRef::Name(name.to_owned()))
            }
            (Some(_), Some(_)) => Err(bad_request(format!("{op} takes `id` or `name`, not both"))),
            (None, None) => Err(bad_request(format!("{op} needs an agent `id` or `name`"))),
        }
    }
}

/// A KILL request: `{"id": N}` or `{"name": "..."}`, optional `grace_ms`,
/// and at most one of `remove` (forget an ended agent's record) and
/// `restart` (stop it if live, then start it again).
///
/// ```
/// use agentos_proto::payload::{AgentRef, KillAction, KillRequest};
/// let request = KillRequest::parse(br#"{"name":"w1"}"#).unwrap();
/// assert_eq!(request.target().unwrap(), AgentRef::Name("w1".into()));
/// assert_eq!(request.grace_ms(), 5000);
/// assert_eq!(request.action(), KillAction::Stop);
/// let restart = KillRequest::parse(br#"{"id":3,"restart":true}"#).unwrap();
/// assert_eq!(restart.action(), KillAction::Restart);
/// assert!(KillRequest::parse(br#"{"id":3,"restart":true,"remove":true}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    /// The agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The agent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Time between SIGTERM and SIGKILL (default 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// Forget the record of an ended agent instead of stopping a live one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub remove: bool,
    /// Stop the live incarnation (if any), then start the agent again
    /// with the same spec and id.
    #[serde(default, skip_serializing_if = "is_false")]
    pub restart: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// What a KILL request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillAction {
    /// Stop a live agent.
    Stop,
    /// Forget an ended agent's record.
    Remove,
    /// Stop it if live, then start it again.
    Restart,
}

impl KillRequest {
    /// Parses and validates a KILL payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: KillRequest = parse_json("KILL", payload)?;
        request.target()?;
        check_range("grace_ms", request.grace_ms, 0, MAX_GRACE_MS)?;
        if request.remove && request.restart {
            return Err(bad_request(
                "KILL takes `remove` or `restart`, not both: remove forgets an ended agent, \
                 restart starts it again",
            ));
        }
        Ok(request)
    }

    /// What the request asks for.
    pub fn action(&self) -> KillAction {
        match (self.remove, self.restart) {
            (true, _) => KillAction::Remove,
            (false, true) => KillAction::Restart,
            (false, false) => KillAction::Stop,
        }
    }

    /// The agent named by the request.
    pub fn target(&self) -> Result<AgentRef, ErrorReply> {
        AgentRef::from_fields("KILL", self.id, self.name.as_deref())
    }

    /// The grace period, defaulted.
    pub fn grace_ms(&self) -> u64 {
        self.grace_ms.unwrap_or(DEFAULT_GRACE_MS)
    }
}

/// The reply to KILL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KillReply {
    /// Whether the agent was found and is being stopped.
    pub success: bool,
    /// Whether a live agent received the signal.
    pub killed: bool,
    /// The agent's id.
    pub id: Option<u32>,
    /// Why not, when `killed` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error code, when `killed` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
}

impl KillReply {
    /// The reply for an agent now being stopped.
    pub fn killed(id: u32) -> KillReply {
        KillReply {
            success: true,
            killed: true,
            id: Some(id),
            error: None,
            code: None,
        }
    }

    /// The reply for no such live agent: `killed` false, with the error.
    pub fn not_found(err: ErrorReply) -> KillReply {
        KillReply {
            success: false,
            killed: false,
            id: None,
            error: Some(err.error),
            code: Some(err.code),
        }
    }
}

/// The reply to KILL with `remove`: `{"success":true,"removed":true,"id":N}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RemoveReply {
    /// Always true: a refusal is an error reply.
    pub success: bool,
    /// The record is forgotten.
    pub removed: bool,
    /// The agent's id.
    pub id: u32,
}

impl RemoveReply {
    /// The reply for agent `id`'s record, now forgotten.
    pub fn removed(id: u32) -> RemoveReply {
        RemoveReply {
            success: true,
            removed: true,
            id,
        }
    }
}

/// The reply to KILL with `restart`: `{"success":true,"restarted":true,
/// "killed":bool,"id":N}`, where `killed` says whether a live incarnation
/// was being stopped first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RestartReply {
    /// Always true: a refusal is an error reply.
    pub success: bool,
    /// The agent is being started again.
    pub restarted: bool,
    /// A live incarnation was stopped first (false: the agent had ended).
    pub killed: bool,
    /// The agent's id.
    pub id: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_or_name_exactly_one() {
        assert!(KillRequest::parse(br#"{}"#).is_err());
        assert!(KillRequest::parse(br#"{"id":1,"name":"a"}"#).is_err());
        assert_eq!(
            KillRequest::parse(br#"{"id":7,"grace_ms":0}"#)
                .unwrap()
                .target()
                .unwrap(),
            AgentRef::Id(7)
        );
    }

    #[test]
    fn remove_and_restart_are_exclusive_and_typed() {
        let err = KillRequest::parse(br#"{"id":1,"remove":true,"restart":true}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
        assert!(err.error.contains("`remove` or `restart`"), "{}", err.error);
        let remove = KillRequest::parse(br#"{"name":"a","remove":true}"#).unwrap();
        assert_eq!(remove.action(), KillAction::Remove);
        let plain = KillRequest::parse(br#"{"name":"a","restart":false}"#).unwrap();
        assert_eq!(plain.action(), KillAction::Stop);
        assert!(KillRequest::parse(br#"{"id":1,"remove":"yes"}"#).is_err());
        let err = KillRequest::parse(br#"{"id":1,"purge":true}"#).unwrap_err();
        assert!(err.error.contains("purge"), "{}", err.error);
    }

    #[test]
    fn grace_is_bounded() {
        let err = KillRequest::parse(br#"{"id":1,"grace_ms":999999999}"#).unwrap_err();
        assert!(err.error.contains("grace_ms"), "{}", err.error);
    }
}
