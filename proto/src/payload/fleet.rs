//! FLEET (0x1A): the nodes of the fleet this node has joined. Operators
//! only.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_json, validate_name};
use crate::error::ErrorReply;

/// A FLEET request: `{"op": "nodes"}`, or `{"op": "drain", "node":
/// NAME}` and `undrain`.
///
/// ```
/// use agentos_proto::payload::{FleetOp, FleetRequest};
/// let asked = FleetRequest::parse(br#"{"op":"nodes"}"#).unwrap();
/// assert_eq!(asked.op, FleetOp::Nodes);
/// assert!(FleetRequest::parse(br#"{"op":"nodes","all":true}"#).is_err());
/// assert!(FleetRequest::parse(br#"{"op":"join"}"#).is_err());
/// let drain = FleetRequest::parse(br#"{"op":"drain","node":"n2"}"#).unwrap();
/// assert_eq!(drain.node.as_deref(), Some("n2"));
/// assert!(FleetRequest::parse(br#"{"op":"drain"}"#).is_err());
/// assert!(FleetRequest::parse(br#"{"op":"nodes","node":"n2"}"#).is_err());
/// assert!(FleetRequest::parse(br#"{"op":"drain","node":"../x"}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FleetRequest {
    /// What to do.
    pub op: FleetOp,
    /// `drain` and `undrain`: the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// FLEET's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FleetOp {
    /// List the fleet's nodes, live and dead.
    Nodes,
    /// Stop a node from taking new work.
    Drain,
    /// Let a drained node take work again.
    Undrain,
}

impl FleetRequest {
    /// Parses a FLEET payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let asked: FleetRequest = parse_json("FLEET", payload)?;
        match (asked.op, &asked.node) {
            (FleetOp::Nodes, Some(_)) => Err(bad_request("FLEET field `node`: not with `nodes`")),
            (FleetOp::Drain | FleetOp::Undrain, None) => Err(bad_request(
                "FLEET needs `node`: the node to drain or undrain",
            )),
            (_, Some(node)) => validate_name("node", node).map(|()| asked),
            (_, None) => Ok(asked),
        }
    }
}

/// `drain`'s and `undrain`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DrainReply {
    pub success: bool,
    /// The node.
    pub node: String,
    /// Whether it takes no new work now.
    pub draining: bool,
}

/// `nodes`' reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodesReply {
    pub success: bool,
    /// The name of the node that answered.
    pub node: String,
    /// Every node the database knows, by name.
    pub nodes: Vec<NodeInfo>,
}

/// One node of the fleet, as the database last heard from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Where its `agentos e2b` face is reached, if it said.
    pub advertise: Option<String>,
    /// Where its `agentos mcp --http` face is reached, if it said.
    #[serde(default)]
    pub advertise_mcp: Option<String>,
    /// Whether its lease is current, by the database's clock.
    pub alive: bool,
    /// Milliseconds since it last renewed its lease.
    pub lease_age_ms: u64,
    /// Whether it takes no new work.
    pub draining: bool,
    /// Its live agents, at its last renewal.
    pub agents: u32,
    /// Its EXEC runs in progress, at its last renewal.
    pub runs: u32,
    /// Its host's one-minute load average, at its last renewal.
    pub load: f32,
    /// Its agentosd's version.
    pub version: String,
    /// The newest schema version it reads.
    pub reads_schema: i32,
    /// When it joined, as seconds since the Unix epoch.
    pub started_at: f64,
}
