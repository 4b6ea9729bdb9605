//! DELEGATE (0x19): an operator's connection narrows itself, for as long
//! as it lasts, to a delegate principal the operator names — a tenant of
//! that operator (an API key of an HTTP face, say). What the delegate
//! creates (sessions, volumes, snapshots, tasks) is its own: other
//! delegates, and the operator itself, do not see it. A delegate never
//! has more than its operator, and reaches only EXEC, THINK and TASK.

use serde::{Deserialize, Serialize};

use super::delegate_name::DelegateName;
use super::hello::PrincipalInfo;
use super::parse::parse_json;
use crate::error::ErrorReply;

/// A DELEGATE request: `{"delegate": NAME}`.
///
/// ```
/// use agentos_proto::payload::DelegateRequest;
/// let asked = DelegateRequest::parse(br#"{"delegate":"key-1"}"#).unwrap();
/// assert_eq!(asked.delegate.as_str(), "key-1");
/// assert!(DelegateRequest::parse(br#"{"delegate":"../x"}"#).is_err());
/// assert!(DelegateRequest::parse(br#"{"delegate":"k","uid":0}"#).is_err());
/// assert!(DelegateRequest::parse(br#"{}"#).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DelegateRequest {
    /// The delegate the connection speaks for from its next request on.
    pub delegate: DelegateName,
}

impl DelegateRequest {
    /// Parses a DELEGATE payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_json("DELEGATE", payload)
    }
}

/// DELEGATE's reply: the connection's id (unchanged) and the principal it
/// now speaks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DelegateReply {
    /// Always `true`.
    pub success: bool,
    /// The id in the connection's reply headers.
    pub agent_id: u32,
    /// `{"kind": "delegate", "name": ..., "of": {"kind": "operator", ...}}`.
    pub principal: PrincipalInfo,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn a_refusal_names_the_field_and_the_rule() {
        let refused = DelegateRequest::parse(br#"{"delegate":"a\u0000b"}"#).unwrap_err();
        assert_eq!(refused.code, ErrorCode::BadRequest);
        assert!(refused.error.contains("`delegate`"), "{}", refused.error);
        assert!(refused.error.contains("only A-Z"), "{}", refused.error);
    }
}
