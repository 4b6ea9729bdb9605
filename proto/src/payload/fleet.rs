//! FLEET (0x1A): the nodes of the fleet this node has joined. Operators
//! only.

use serde::{Deserialize, Serialize};

use super::parse::parse_json;
use crate::error::ErrorReply;

/// A FLEET request: `{"op": "nodes"}`.
///
/// ```
/// use agentos_proto::payload::{FleetOp, FleetRequest};
/// let asked = FleetRequest::parse(br#"{"op":"nodes"}"#).unwrap();
/// assert_eq!(asked.op, FleetOp::Nodes);
/// assert!(FleetRequest::parse(br#"{"op":"nodes","all":true}"#).is_err());
/// assert!(FleetRequest::parse(br#"{"op":"join"}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FleetRequest {
    /// What to do.
    pub op: FleetOp,
}

/// FLEET's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FleetOp {
    /// List the fleet's nodes, live and dead.
    Nodes,
}

impl FleetRequest {
    /// Parses a FLEET payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_json("FLEET", payload)
    }
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
    /// Where its HTTP face is reached, if it said.
    pub advertise: Option<String>,
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
