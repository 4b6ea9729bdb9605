//! HELLO (0xFE): protocol and feature discovery.

use serde::{Deserialize, Serialize};

use super::delegate_name::DelegateName;

use super::parse::parse_empty_or_object;
use crate::error::ErrorReply;

/// A HELLO request: an empty payload or `{}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HelloRequest {}

impl HelloRequest {
    /// Parses a HELLO payload: empty, or `{}`.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("HELLO", payload)
    }
}

/// Which cgroup hierarchy enforces limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies.
    #[serde(rename = "v1")]
    V1,
    /// The unified hierarchy.
    #[serde(rename = "v2")]
    V2,
}

impl CgroupVersion {
    /// The protocol word, `"v1"` or `"v2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// What works on this host right now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Features {
    /// THINK reaches a model.
    pub think: bool,
    /// EXEC runs code.
    pub exec: bool,
    /// SPAWN starts agents.
    pub spawn: bool,
    /// TOOL lists and calls tools.
    #[serde(default)]
    pub tools: bool,
    /// TASK runs background work.
    #[serde(default)]
    pub task: bool,
    /// The cgroup version in use for agent limits, or `null`.
    pub cgroup: Option<CgroupVersion>,
    /// Network policies are served (the egress proxy runs).
    #[serde(default)]
    pub network_policy: bool,
    /// PAUSE freezes agents (cgroups with a freezer).
    #[serde(default)]
    pub pause: bool,
    /// Sessions keep their files and packages on disks of their own,
    /// which outlive their interpreters and the kernel (else in memory).
    #[serde(default)]
    pub session_disks: bool,
    /// EXEC starts processes inside sessions (`start`, `output`, ...).
    #[serde(default)]
    pub processes: bool,
    /// This node has joined a fleet and its database answers now.
    #[serde(default)]
    pub fleet: bool,
}

/// Size limits a client should respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProtocolLimits {
    /// Largest request payload accepted.
    pub max_request_bytes: u64,
    /// Largest reply payload sent.
    pub max_reply_bytes: u64,
    /// Requests a connection may have awaiting replies before the kernel
    /// stops reading from it.
    pub max_in_flight: u32,
}

/// The reply to HELLO.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HelloReply {
    /// Always `true`.
    pub success: bool,
    /// The wire protocol version, 1.
    pub protocol_version: u32,
    /// The kernel's version.
    pub kernel_version: String,
    /// The caller's identity as the kernel sees it.
    pub agent_id: u32,
    /// Whom the connection speaks for: an operator, an agent, or a run of
    /// EXEC code (never its caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<PrincipalInfo>,
    /// What works right now.
    pub features: Features,
    /// Limits in force on this connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProtocolLimits>,
    /// THINK's provider and model (never its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmInfo>,
    /// The MCP tool servers and their states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_servers: Option<Vec<super::tool::ServerInfo>>,
    /// This node's name in its fleet, when it has `[fleet]` (told to
    /// operators and delegates only), whether or not its database
    /// answers now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Whom a connection speaks for, on the wire:
/// `{"kind": "operator", "uid": 0}`, `{"kind": "agent", "id": 7, "name": "w1"}`,
/// or `{"kind": "run", "of": <the caller's principal>}`.
///
/// ```
/// use agentos_proto::payload::PrincipalInfo;
/// let run = PrincipalInfo::Run { of: Some(Box::new(PrincipalInfo::Operator { uid: 0 })) };
/// assert_eq!(
///     serde_json::to_string(&run).unwrap(),
///     r#"{"kind":"run","of":{"kind":"operator","uid":0}}"#
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PrincipalInfo {
    /// A trusted local user, by uid.
    Operator {
        /// The user id.
        uid: u32,
    },
    /// An agent the kernel spawned.
    Agent {
        /// Its id.
        id: u32,
        /// Its name, while the kernel knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// A delegate principal an operator named (DELEGATE): what it creates
    /// is its own, within what `of` has.
    Delegate {
        /// Its name.
        name: DelegateName,
        /// The operator it was named by.
        of: Box<PrincipalInfo>,
    },
    /// The kernel connection of an EXEC run: a principal of its own, acting
    /// for `of` within what the run was given.
    Run {
        /// Whose run it is (left out for a run that is over, whose tasks
        /// an operator lists).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        of: Option<Box<PrincipalInfo>>,
    },
}

/// What THINK talks to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LlmInfo {
    /// `local`, `openai`, `anthropic`, `gemini` or `none`.
    pub provider: String,
    /// The model used when a request names none.
    pub model: String,
    /// Whether THINK would be answered now (for `local`: the model is
    /// loaded).
    pub ready: bool,
    /// Why THINK is unavailable or not ready, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `ready`, `starting` (the local model is loading), `unreachable`
    /// (the last call could not connect to the provider; THINKs are still
    /// tried), `not_answering` (the provider takes connections but answers
    /// no health probe; THINKs are refused until it does) or `unavailable`
    /// (THINK cannot work as configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// While `unreachable`: since when (RFC 3339, UTC), the first failed
    /// call's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<String>,
    /// While `unreachable`: the last connection error, naming the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// THINKs answered since the kernel started.
    pub calls: u64,
    /// Tokens used since the kernel started.
    pub tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_versions_serialise_as_protocol_words() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let json = serde_json::to_string(&version).unwrap();
            assert_eq!(json, format!("\"{}\"", version.as_str()));
        }
        assert_eq!(
            serde_json::to_string(&Features::default()).unwrap(),
            r#"{"think":false,"exec":false,"spawn":false,"tools":false,"task":false,"cgroup":null,"network_policy":false,"pause":false,"session_disks":false,"processes":false,"fleet":false}"#
        );
    }

    #[test]
    fn hello_accepts_empty_or_object_only() {
        assert!(HelloRequest::parse(b"").is_ok());
        assert!(HelloRequest::parse(b"{}").is_ok());
        let err = HelloRequest::parse(b"hello?").unwrap_err();
        assert!(err.error.contains("HELLO"), "{}", err.error);
    }
}
