//! `agentos tools`: the tools you may use and the tool servers' states,
//! or the tools that match some words.

use agentos_proto::payload::{ToolDescription, ToolListReply, ToolSearchReply};
use agentos_proto::{Client, Opcode};
use serde::Serialize;

use crate::error::CliError;
use crate::raw::Raw;

/// The TOOL requests that read the catalogue (the protocol's `ToolCall`
/// is parsed, not built).
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Catalogue<'a> {
    /// Every tool the caller may use, and every server's state.
    List,
    /// The tools that match `query`, best first.
    Search { query: &'a str, limit: u64 },
}

impl Catalogue<'_> {
    /// Asks the kernel; its reply as sent.
    pub fn ask(&self, client: &mut Client) -> Result<Raw, CliError> {
        Ok(client.call_json(Opcode::TOOL, &serde_json::to_vec(self)?)?)
    }
}

pub fn tools(client: &mut Client, search: &[String], json: bool) -> Result<(), CliError> {
    let query = search.join(" ");
    let raw = if search.is_empty() {
        Catalogue::List.ask(client)?
    } else {
        Catalogue::Search {
            query: &query,
            limit: 50,
        }
        .ask(client)?
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

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{Detail, ToolCall};

    use super::*;

    #[test]
    fn each_request_is_the_one_tool_reads() {
        let read = |op: Catalogue<'_>| ToolCall::parse(&serde_json::to_vec(&op).unwrap()).unwrap();
        assert_eq!(read(Catalogue::List), ToolCall::List);
        assert_eq!(
            read(Catalogue::Search {
                query: "read file",
                limit: 50
            }),
            ToolCall::Search {
                query: "read file".into(),
                detail: Detail::Summary,
                limit: 50
            }
        );
    }
}
