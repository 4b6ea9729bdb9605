//! `agentos audit`: the audit log entries you may read, oldest first.

use agentos_proto::payload::{AuditCategory, AuditEntry, AuditLogReply, AuditLogRequest};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;
use crate::task::owner_name;

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only this category (SECURITY, AGENT_LIFECYCLE, SYSCALL, ...)
    #[arg(long, value_name = "CATEGORY")]
    category: Option<String>,
    /// Only entries about this agent id
    #[arg(long, value_name = "ID")]
    agent: Option<u32>,
    /// Only entries after this id
    #[arg(long, value_name = "ID", default_value_t = 0)]
    since: u64,
    /// At most this many entries (the kernel gives at most 1000)
    #[arg(short = 'n', long, default_value_t = 100)]
    limit: u32,
}

pub fn audit(client: &mut Client, args: AuditArgs, json: bool) -> Result<(), CliError> {
    let category = match &args.category {
        Some(name) => Some(
            AuditCategory::from_name(&name.to_ascii_uppercase()).ok_or_else(|| {
                usage(format!(
                    "--category {name}: not a category of the audit log"
                ))
            })?,
        ),
        None => None,
    };
    let request = AuditLogRequest {
        category,
        agent_id: args.agent,
        since_id: args.since,
        limit: Some(args.limit),
    };
    let reply: AuditLogReply =
        client.call_json(Opcode::GET_AUDIT_LOG, &serde_json::to_vec(&request)?)?;
    if json {
        return print_json(&reply);
    }
    for entry in &reply.entries {
        println!("{}", line(entry));
    }
    if let Some(last) = reply.entries.last().filter(|_| reply.more) {
        eprintln!("(more: agentos audit --since {})", last.id);
    }
    Ok(())
}

/// One entry on a line: id, time, category, what happened, to whom, by whom.
fn line(entry: &AuditEntry) -> String {
    let agent = match (&entry.agent_name, entry.agent_id) {
        (Some(name), Some(id)) => format!(" {name} ({id})"),
        (None, Some(id)) => format!(" agent {id}"),
        _ => String::new(),
    };
    let outcome = if entry.success { "" } else { " [refused]" };
    format!(
        "{:>6} {} {:<15} {}{agent} by {}{outcome}",
        entry.id,
        entry.timestamp,
        entry.category.as_str(),
        entry.event_type,
        owner_name(Some(&entry.principal)),
    )
}
