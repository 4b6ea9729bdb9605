//! SPAWN's and EXEC's `network` (loopback only, the host's network, or a
//! policy the kernel's egress proxy enforces), and NET (0x17): an agent's
//! connection record, and its policy replaced at runtime.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::kill::AgentRef;
use super::parse::parse_json;
use crate::error::ErrorReply;

/// What a sandbox may reach, as SPAWN's and EXEC's `network` give it.
///
/// ```
/// use agentos_proto::payload::{Network, SpawnRequest};
/// let request = SpawnRequest::parse(
///     br#"{"name":"w1","command":["/bin/true"],"network":{"allow":["*.pypi.org:443"]}}"#,
/// ).unwrap();
/// let Some(Network::Policy(policy)) = request.network else { panic!() };
/// assert_eq!(policy.allow, ["*.pypi.org:443"]);
/// let err = SpawnRequest::parse(
///     br#"{"name":"w1","command":["/bin/true"],"network":{"alow":[]}}"#,
/// ).unwrap_err();
/// assert!(err.error.contains("alow"), "{}", err.error);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(untagged))]
pub enum Network {
    /// `false`: loopback only; `true`: the host's network.
    Host(bool),
    /// Only what the policy allows, through the kernel's proxy (boxed:
    /// requests carry this enum, and most carry no policy).
    Policy(Box<NetworkPolicy>),
}

/// A network policy's entries, as the request gives them: host patterns
/// (`api.github.com`, `*.pypi.org`, `*`) or address ranges (`10.0.0.0/8`,
/// `[fd00::]/8`), each with an optional `:port`. The kernel checks them.
/// LIST and NET report a policy too, so the type itself reads fields it
/// does not know; a request refuses them when it is parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// Published schemas describe requests, which refuse unknown fields.
#[cfg_attr(feature = "schema", schemars(deny_unknown_fields))]
pub struct NetworkPolicy {
    /// What may be reached: host names (`api.github.com`), `*.domain`
    /// patterns, `*` for any name, or address ranges (`10.0.0.0/8`), each
    /// with an optional `:port`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// What may not, whatever `allow` says.
    #[serde(default)]
    pub deny: Vec<String>,
}

impl Default for Network {
    fn default() -> Self {
        Network::Host(false)
    }
}

impl Network {
    /// Whether this is the host's whole network.
    pub fn is_host(&self) -> bool {
        matches!(self, Network::Host(true))
    }
}

impl Serialize for Network {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Network::Host(host) => serializer.serialize_bool(*host),
            Network::Policy(policy) => policy.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NetworkVisitor)
    }
}

struct NetworkVisitor;

impl<'de> Visitor<'de> for NetworkVisitor {
    type Value = Network;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"false, true or a policy {"allow": [...], "deny": [...]}"#)
    }

    fn visit_bool<E: de::Error>(self, host: bool) -> Result<Network, E> {
        Ok(Network::Host(host))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Network, A::Error> {
        NetworkPolicy::deserialize(de::value::MapAccessDeserializer::new(map))
            .map(|policy| Network::Policy(Box::new(policy)))
    }
}

/// What NET does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NetOp {
    /// The agent's policy and connection record.
    #[default]
    Show,
    /// Replace the agent's policy; its connections the new one refuses
    /// are closed.
    Set,
}

/// A NET request: `{"op": "show", "name": "w1"}` or
/// `{"op": "set", "name": "w1", "network": {"allow": [...]}}`.
///
/// ```
/// use agentos_proto::payload::{NetOp, NetRequest};
/// let show = NetRequest::parse(br#"{"name":"w1"}"#).unwrap();
/// assert_eq!(show.op, NetOp::Show);
/// assert!(NetRequest::parse(br#"{"op":"set","name":"w1"}"#).is_err());
/// assert!(NetRequest::parse(br#"{"op":"set","id":3,"network":{"allow":[]}}"#).is_ok());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NetRequest {
    #[serde(default)]
    pub op: NetOp,
    /// The agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The agent's name (the live one, else the latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `set`: the new policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
}

impl NetRequest {
    /// Parses and validates a NET payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: NetRequest = parse_json("NET", payload)?;
        request.target()?;
        match (request.op, &request.network) {
            (NetOp::Set, None) => Err(super::parse::bad_request(
                "NET field `network` is missing: `set` needs the new policy",
            )),
            (NetOp::Show, Some(_)) => Err(super::parse::bad_request(
                "NET field `network`: only `set` takes one",
            )),
            _ => Ok(request),
        }
    }

    /// The agent named by the request.
    pub fn target(&self) -> Result<AgentRef, ErrorReply> {
        AgentRef::from_fields("NET", self.id, self.name.as_deref())
    }
}

/// A connection's counters: LIST's `connections`, an EXEC reply's
/// `network`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetTotals {
    /// Connections allowed.
    pub allowed: u64,
    /// Connections refused.
    pub refused: u64,
    /// Bytes the sandbox sent.
    pub bytes_out: u64,
    /// Bytes it received.
    pub bytes_in: u64,
}

/// One connection attempt in a NET reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetAttempt {
    /// Milliseconds since the Unix epoch, when it was asked for.
    pub at_ms: u64,
    pub host: String,
    pub port: u16,
    /// The address it resolved to, once resolved.
    #[serde(default)]
    pub address: Option<String>,
    pub allowed: bool,
    /// Why it was refused, or why an allowed one failed or was closed.
    #[serde(default)]
    pub reason: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// How long it lasted (so far, while it is open).
    pub duration_ms: u64,
}

/// NET's reply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NetReply {
    pub success: bool,
    pub id: u32,
    pub name: String,
    /// The policy in force (after `set`, the new one).
    pub network: Option<Network>,
    /// All of its connections since it started.
    pub totals: NetTotals,
    /// The newest attempts, oldest first.
    pub attempts: Vec<NetAttempt>,
    /// Older attempts no longer kept.
    pub dropped: u64,
}
