//! PAUSE (0x14) and RESUME (0x15): freeze an agent's processes where they
//! stand, and let them go on — the Clove SDK's `pause` and `resume` — or a
//! session's interpreter; and hibernate a session: its globals saved, its
//! interpreter ended, brought back by its next run or a RESUME.

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::kill::AgentRef;
use super::parse::parse_json;
use super::parse::validate_name;
use super::sessions::SessionState;
use crate::error::{ErrorCode, ErrorReply};

/// A PAUSE or RESUME request: `{"id": N}` or `{"name": "..."}` for an
/// agent, `{"session": "..."}` for one of the caller's sessions;
/// `"hibernate": true` on PAUSE.
///
/// ```
/// use agentos_proto::payload::{AgentRef, PauseRequest};
/// let request = PauseRequest::parse("PAUSE", br#"{"name":"w1"}"#).unwrap();
/// assert_eq!(request.target().unwrap(), AgentRef::Name("w1".into()));
/// assert!(PauseRequest::parse("PAUSE", br#"{"id":1,"signal":"STOP"}"#).is_err());
/// assert!(PauseRequest::parse("PAUSE", br#"{}"#).unwrap().target().is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// The agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The agent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One of the caller's sessions, instead of an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// PAUSE: save the session's globals and end its interpreter, freeing
    /// its memory, instead of freezing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hibernate: bool,
}

impl PauseRequest {
    /// Parses a PAUSE or RESUME (`what`) payload: an agent or a session,
    /// not both; `hibernate` only on PAUSE.
    ///
    /// ```
    /// use agentos_proto::payload::PauseRequest;
    /// let asked = PauseRequest::parse("PAUSE", br#"{"session":"s1","hibernate":true}"#).unwrap();
    /// assert_eq!(asked.session.as_deref(), Some("s1"));
    /// assert!(PauseRequest::parse("PAUSE", br#"{"session":"s1","name":"w1"}"#).is_err());
    /// assert!(PauseRequest::parse("RESUME", br#"{"session":"s1","hibernate":true}"#).is_err());
    /// assert!(PauseRequest::parse("PAUSE", br#"{"session":"../x"}"#).is_err());
    /// ```
    pub fn parse(what: &str, payload: &[u8]) -> Result<Self, ErrorReply> {
        let asked: PauseRequest = parse_json(what, payload)?;
        if let Some(session) = &asked.session {
            if asked.id.is_some() || asked.name.is_some() {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!("{what} names an agent (`id`, `name`) or a `session`, not both"),
                ));
            }
            validate_name("session", session)?;
        }
        if asked.hibernate && what != "PAUSE" {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("{what} field `hibernate`: only PAUSE hibernates"),
            ));
        }
        Ok(asked)
    }

    /// The agent it names.
    pub fn target(&self) -> Result<AgentRef, ErrorReply> {
        AgentRef::from_fields("PAUSE and RESUME", self.id, self.name.as_deref())
    }
}

/// PAUSE's and RESUME's reply: the agent, and its state now (`paused`,
/// `running`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PauseReply {
    /// Always true.
    pub success: bool,
    /// The agent's id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// `paused` after PAUSE, `running` after RESUME.
    pub state: AgentState,
}

/// PAUSE's and RESUME's reply for a session: its state now (`paused`,
/// `hibernated`, or `ready` after RESUME).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionPauseReply {
    /// Always true.
    pub success: bool,
    /// The session.
    pub session: String,
    /// Where it stands now.
    pub state: SessionState,
    /// Hibernating: the globals that could not be saved (each name, with
    /// why); they are gone when it wakes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_saved: Vec<String>,
}
