//! PAUSE (0x14) and RESUME (0x15): freeze an agent's processes where they
//! stand, and let them go on — the Clove SDK's `pause` and `resume`.

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::kill::AgentRef;
use super::parse::parse_json;
use crate::error::ErrorReply;

/// A PAUSE or RESUME request: `{"id": N}` or `{"name": "..."}`.
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
}

impl PauseRequest {
    /// Parses a PAUSE or RESUME (`what`) payload.
    pub fn parse(what: &str, payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_json(what, payload)
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
