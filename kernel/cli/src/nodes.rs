//! `agentos nodes`: the fleet this node has joined — each node's name,
//! lease, agents, runs, load, version and address; `drain NAME` and
//! `undrain NAME`.

use agentos_proto::payload::{DrainReply, FleetOp, FleetRequest, NodeInfo, NodesReply};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::format::print_json;

#[derive(Debug, clap::Subcommand)]
pub enum NodesCommand {
    /// Stop node NAME from taking new work (the tasks it runs finish;
    /// queued ones go to other nodes)
    Drain { name: String },
    /// Let node NAME take work again
    Undrain { name: String },
}

/// Lists the fleet's nodes, this node's marked with `*`; or drains or
/// undrains one.
pub fn nodes(
    client: &mut Client,
    command: Option<NodesCommand>,
    json: bool,
) -> Result<(), CliError> {
    let (op, node) = match command {
        None => (FleetOp::Nodes, None),
        Some(NodesCommand::Drain { name }) => (FleetOp::Drain, Some(name)),
        Some(NodesCommand::Undrain { name }) => (FleetOp::Undrain, Some(name)),
    };
    let request = serde_json::to_vec(&FleetRequest { op, node })?;
    if op != FleetOp::Nodes {
        let reply: DrainReply = client.call_json(Opcode::FLEET, &request)?;
        if json {
            return print_json(&reply);
        }
        let now = if reply.draining {
            "draining: it takes no new work"
        } else {
            "taking work"
        };
        println!("node {} is {now}", reply.node);
        return Ok(());
    }
    let reply: NodesReply = client.call_json(Opcode::FLEET, &request)?;
    if json {
        return print_json(&reply);
    }
    println!(
        "{:<2}{:<20} {:<9} {:>9} {:>6} {:>5} {:>5} {:<9} {:<26} MCP ADDRESS",
        "", "NAME", "STATE", "LEASE AGE", "AGENTS", "RUNS", "LOAD", "VERSION", "ADDRESS"
    );
    for node in &reply.nodes {
        println!("{}", row(node, node.name == reply.node));
    }
    Ok(())
}

fn row(node: &NodeInfo, is_me: bool) -> String {
    let state = match (node.alive, node.draining) {
        (false, _) => "dead",
        (true, true) => "draining",
        (true, false) => "live",
    };
    format!(
        "{:<2}{:<20} {:<9} {:>8.1}s {:>6} {:>5} {:>5.2} {:<9} {:<26} {}",
        if is_me { "*" } else { "" },
        node.name,
        state,
        node.lease_age_ms as f64 / 1000.0,
        node.agents,
        node.runs,
        node.load,
        node.version,
        node.advertise.as_deref().unwrap_or("-"),
        node.advertise_mcp.as_deref().unwrap_or("-"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_says_which_node_answered_and_whether_each_is_alive() {
        let mut node = NodeInfo {
            name: "n1".into(),
            advertise: None,
            advertise_mcp: None,
            alive: true,
            lease_age_ms: 1500,
            draining: false,
            agents: 2,
            runs: 1,
            load: 0.5,
            version: "0.1.0".into(),
            reads_schema: 1,
            started_at: 0.0,
        };
        let line = row(&node, true);
        assert!(line.starts_with("* n1"), "{line}");
        assert!(line.contains(" live ") && line.contains("1.5s"), "{line}");
        node.alive = false;
        node.advertise = Some("http://10.0.0.2:3000".into());
        node.advertise_mcp = Some("http://10.0.0.2:8765".into());
        let line = row(&node, false);
        assert!(
            line.contains(" dead ")
                && line.contains(" http://10.0.0.2:3000 ")
                && line.ends_with(" http://10.0.0.2:8765"),
            "{line}"
        );
    }
}
