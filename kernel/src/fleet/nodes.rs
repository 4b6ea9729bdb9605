//! Nodes and their leases. A node's row is its registration: it renews its
//! lease every third of the lease's length, and a node whose lease has run
//! out — by the database's `now()`, so nodes' clocks never matter — is dead
//! to the fleet. Each start is an incarnation of its own, so a node that
//! lost its name to another after its lease ran out cannot renew it.

use std::time::Duration;

use agentos_proto::payload::NodeInfo;
use postgres::Client;

use super::error::FleetError;
use super::schema::READS;

/// Who this node is to the fleet.
#[derive(Clone, Debug)]
pub struct Registration {
    pub node: String,
    pub incarnation: i64,
    pub advertise: Option<String>,
    pub advertise_mcp: Option<String>,
    pub lease: Duration,
}

/// What a node tells the fleet of itself at each renewal.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub agents: u32,
    pub runs: u32,
    pub load: f32,
}

/// Takes this node's name for a new incarnation: refused while another
/// node holds the name with a live lease.
pub fn register(client: &mut Client, me: &Registration) -> Result<(), FleetError> {
    let taken = client.query_opt(
        "INSERT INTO agentos_nodes
            (name, incarnation, advertise, version, reads_schema, lease_until, lease_ms,
             advertise_mcp)
         VALUES ($1, $2, $3, $4, $5, now() + $6::float8 * interval '1 millisecond',
                 $6::float8::integer, $7)
         ON CONFLICT (name) DO UPDATE SET
            incarnation = EXCLUDED.incarnation,
            advertise = EXCLUDED.advertise,
            advertise_mcp = EXCLUDED.advertise_mcp,
            version = EXCLUDED.version,
            reads_schema = EXCLUDED.reads_schema,
            started_at = now(),
            renewed_at = now(),
            lease_until = EXCLUDED.lease_until,
            lease_ms = EXCLUDED.lease_ms
         WHERE agentos_nodes.lease_until <= now()
            OR agentos_nodes.incarnation = EXCLUDED.incarnation
         RETURNING name",
        &[
            &me.node,
            &me.incarnation,
            &me.advertise,
            &env!("CARGO_PKG_VERSION"),
            &READS,
            &lease_ms(me.lease),
            &me.advertise_mcp,
        ],
    )?;
    if taken.is_some() {
        return Ok(());
    }
    let left_ms: f64 = client
        .query_opt(
            "SELECT EXTRACT(EPOCH FROM lease_until - now())::float8 * 1000
             FROM agentos_nodes WHERE name = $1",
            &[&me.node],
        )?
        .map_or(0.0, |row| row.get(0));
    Err(FleetError::NameTaken {
        node: me.node.clone(),
        left: Duration::from_millis(left_ms.max(0.0) as u64),
    })
}

/// Renews this incarnation's lease with its figures. Returns whether the
/// node is draining, and the fleet's live and dead nodes;
/// [`FleetError::Superseded`] when another node has taken the name.
pub fn renew(
    client: &mut Client,
    me: &Registration,
    figures: Figures,
) -> Result<(bool, (i64, i64)), FleetError> {
    let row = client.query_opt(
        "UPDATE agentos_nodes SET
            renewed_at = now(),
            lease_until = now() + $3::float8 * interval '1 millisecond',
            agents = $4, runs = $5, load = $6
         WHERE name = $1 AND incarnation = $2
         RETURNING draining,
            (SELECT count(*) FILTER (WHERE lease_until > now()) FROM agentos_nodes),
            (SELECT count(*) FILTER (WHERE lease_until <= now()) FROM agentos_nodes)",
        &[
            &me.node,
            &me.incarnation,
            &lease_ms(me.lease),
            &clamp(figures.agents),
            &clamp(figures.runs),
            &figures.load,
        ],
    )?;
    row.map(|row| (row.get(0), (row.get(1), row.get(2))))
        .ok_or_else(|| FleetError::Superseded(me.node.clone()))
}

/// Ends this incarnation's lease at once: the node is stopping.
pub fn release(client: &mut Client, me: &Registration) -> Result<(), FleetError> {
    client.execute(
        "UPDATE agentos_nodes SET lease_until = now()
         WHERE name = $1 AND incarnation = $2",
        &[&me.node, &me.incarnation],
    )?;
    Ok(())
}

/// Marks node `name` draining (or not); false when there is no such node.
pub fn set_draining(client: &mut Client, name: &str, draining: bool) -> Result<bool, FleetError> {
    let changed = client.execute(
        "UPDATE agentos_nodes SET draining = $2 WHERE name = $1",
        &[&name, &draining],
    )?;
    Ok(changed == 1)
}

/// Every node the database knows, by name.
pub fn list(client: &mut Client) -> Result<Vec<NodeInfo>, FleetError> {
    let rows = client.query(
        "SELECT name, advertise, lease_until > now(),
                GREATEST(EXTRACT(EPOCH FROM now() - renewed_at), 0)::float8 * 1000,
                draining, agents, runs, load, version, reads_schema,
                EXTRACT(EPOCH FROM started_at)::float8, advertise_mcp
         FROM agentos_nodes ORDER BY name",
        &[],
    )?;
    Ok(rows
        .iter()
        .map(|row| NodeInfo {
            name: row.get(0),
            advertise: row.get(1),
            alive: row.get(2),
            lease_age_ms: row.get::<_, f64>(3) as u64,
            draining: row.get(4),
            agents: u32::try_from(row.get::<_, i32>(5)).unwrap_or(0),
            runs: u32::try_from(row.get::<_, i32>(6)).unwrap_or(0),
            load: row.get(7),
            version: row.get(8),
            reads_schema: row.get(9),
            started_at: row.get(10),
            advertise_mcp: row.get(11),
        })
        .collect())
}

fn lease_ms(lease: Duration) -> f64 {
    lease.as_millis() as f64
}

fn clamp(count: u32) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}
