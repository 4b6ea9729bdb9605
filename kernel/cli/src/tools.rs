//! `agentos tools`: the tools you may use and the tool servers' states,
//! or the tools that match some words.

use agentos_proto::payload::{Detail, ToolCall, ToolDescription, ToolListReply, ToolSearchReply};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::raw::Raw;

/// Asks TOOL; its reply as sent.
pub fn ask(client: &mut Client, request: &ToolCall) -> Result<Raw, CliError> {
    Ok(client.call_json(Opcode::TOOL, &serde_json::to_vec(request)?)?)
}

pub fn tools(client: &mut Client, search: &[String], json: bool) -> Result<(), CliError> {
    let query = search.join(" ");
    let raw = if search.is_empty() {
        ask(client, &ToolCall::List)?
    } else {
        let search = ToolCall::Search {
            query: query.clone(),
            detail: Detail::Summary,
            limit: 50,
        };
        ask(client, &search)?
    };
    if json {
        return raw.print();
    }
    let tools = if search.is_empty() {
        let reply: ToolListReply = raw.decode()?;
        for server in &reply.servers {
            let error = server
                .error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            println!(
                "server {} {} ({} tools){error}",
                server.name, server.state, server.tools,
            );
        }
        reply.tools
    } else {
        raw.decode::<ToolSearchReply>()?.tools
    };
    let width = tools.iter().map(|t| tool_name(t).len()).max().unwrap_or(0);
    for tool in &tools {
        let description = tool.description.as_deref().unwrap_or("");
        let first_line = description.lines().next().unwrap_or("");
        let mut summary: String = first_line.chars().take(100).collect();
        if summary.len() < first_line.len() {
            summary.push('…');
        }
        println!("{:width$}  {summary}", tool_name(tool));
    }
    if tools.is_empty() && !search.is_empty() {
        eprintln!("agentos: no tool matches {query:?}");
    }
    Ok(())
}

/// `server.name` of a tool.
fn tool_name(tool: &ToolDescription) -> String {
    format!("{}.{}", tool.server, tool.name)
}
