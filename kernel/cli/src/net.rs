//! `agentos net NAME`: an agent's network policy and its connection record;
//! `agentos net NAME --allow ... [--deny ...]`: a new policy while it runs.

use agentos_proto::payload::{NetOp, NetReply, NetRequest, Network, NetworkPolicy};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::format::human_size;

#[derive(Debug, clap::Args)]
pub struct NetArgs {
    /// Agent name, or id
    agent: String,
    /// Replace its policy: an entry it may reach (host, *.domain, CIDR,
    /// each with an optional :port); repeat for more
    #[arg(long, value_name = "ENTRY")]
    allow: Vec<String>,
    /// With --allow (or --cut): an entry it may not reach
    #[arg(long, value_name = "ENTRY")]
    deny: Vec<String>,
    /// Replace its policy with one that allows nothing
    #[arg(long, conflicts_with = "allow")]
    cut: bool,
}

pub fn net(client: &mut Client, args: NetArgs, json: bool) -> Result<(), CliError> {
    let (id, name) = crate::agents::id_or_name(&args.agent);
    let setting = args.cut || !args.allow.is_empty();
    if !setting && !args.deny.is_empty() {
        return Err(CliError::DenyWithoutPolicy);
    }
    let request = NetRequest {
        op: if setting { NetOp::Set } else { NetOp::Show },
        id,
        name,
        network: setting.then(|| {
            Network::Policy(Box::new(NetworkPolicy {
                allow: args.allow.clone(),
                deny: args.deny.clone(),
            }))
        }),
    };
    let reply: NetReply = client
        .call_json(Opcode::NET, &serde_json::to_vec(&request)?)
        .map_err(|err| crate::failure::about_agent(&args.agent, err))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
        print!("{}", describe(&reply));
    }
    Ok(())
}

/// The reply as text: the policy, the counters, then one line per attempt.
fn describe(reply: &NetReply) -> String {
    let policy = match &reply.network {
        Some(Network::Host(true)) => "the host's network".to_owned(),
        Some(Network::Policy(policy)) => format!(
            "allow {}{}",
            list(&policy.allow),
            if policy.deny.is_empty() {
                String::new()
            } else {
                format!("; deny {}", list(&policy.deny))
            }
        ),
        _ => "loopback only".to_owned(),
    };
    let totals = reply.totals;
    let mut text = format!(
        "{} (id {}): {policy}\nconnections: {} allowed, {} refused; {} out, {} in\n",
        reply.name,
        reply.id,
        totals.allowed,
        totals.refused,
        human_size(totals.bytes_out),
        human_size(totals.bytes_in)
    );
    if reply.dropped > 0 {
        text.push_str(&format!("({} older attempts not kept)\n", reply.dropped));
    }
    for attempt in &reply.attempts {
        let verdict = if attempt.allowed {
            "allowed"
        } else {
            "REFUSED"
        };
        let address = attempt.address.as_deref().unwrap_or("-");
        text.push_str(&format!(
            "{} {verdict:7} {}:{} ({address}) {} out, {} in, {} ms{}\n",
            crate::format::clock_ms(attempt.at_ms),
            attempt.host,
            attempt.port,
            human_size(attempt.bytes_out),
            human_size(attempt.bytes_in),
            attempt.duration_ms,
            attempt
                .reason
                .as_deref()
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        ));
    }
    text
}

fn list(entries: &[String]) -> String {
    if entries.is_empty() {
        "nothing".to_owned()
    } else {
        entries.join(" ")
    }
}
