//! `agentos tools` and `agentos call`: the kernel's tools.

use agentos_proto::{Client, Opcode};
use anyhow::bail;

#[derive(Debug, clap::Args)]
pub struct CallArgs {
    /// The tool, as SERVER.TOOL (`everything.echo`)
    pub tool: String,
    /// Its arguments, as key=value
    #[arg(value_name = "KEY=VALUE")]
    pub arguments: Vec<String>,
    /// How long the call may take [default: the server's own]
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Print the TOOL reply as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn tools(client: &mut Client, search: &[String], json: bool) -> anyhow::Result<()> {
    let request = if search.is_empty() {
        serde_json::json!({"op": "list"})
    } else {
        serde_json::json!({"op": "search", "query": search.join(" "), "limit": 50})
    };
    let reply: serde_json::Value =
        client.call_json(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
    }
    for server in reply["servers"].as_array().into_iter().flatten() {
        let error = server["error"]
            .as_str()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        println!(
            "server {} {} ({} tools){error}",
            server["name"].as_str().unwrap_or("?"),
            server["state"].as_str().unwrap_or("?"),
            server["tools"],
        );
    }
    let tools = reply["tools"].as_array().cloned().unwrap_or_default();
    let width = tools.iter().map(|t| tool_name(t).len()).max().unwrap_or(0);
    for tool in &tools {
        let description = tool["description"].as_str().unwrap_or("");
        let first_line = description.lines().next().unwrap_or("");
        let mut summary: String = first_line.chars().take(100).collect();
        if summary.len() < first_line.len() {
            summary.push('…');
        }
        println!("{:width$}  {summary}", tool_name(tool));
    }
    if tools.is_empty() && !search.is_empty() {
        eprintln!("agentos: no tool matches {:?}", search.join(" "));
    }
    Ok(())
}

/// `server.name` of a tool in a TOOL reply.
fn tool_name(tool: &serde_json::Value) -> String {
    format!(
        "{}.{}",
        tool["server"].as_str().unwrap_or("?"),
        tool["name"].as_str().unwrap_or("?")
    )
}

pub fn call_tool(client: &mut Client, args: CallArgs) -> anyhow::Result<()> {
    let Some((server, tool)) = args.tool.split_once('.') else {
        bail!(
            "name the tool as SERVER.TOOL (like everything.echo), not {:?}",
            args.tool
        );
    };
    let mut arguments = serde_json::Map::new();
    for pair in &args.arguments {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("arguments are key=value, not {pair:?}");
        };
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
        arguments.insert(key.to_owned(), value);
    }
    let mut request = serde_json::json!({
        "op": "call", "server": server, "tool": tool, "arguments": arguments,
    });
    if let Some(timeout_ms) = args.timeout_ms {
        request["timeout_ms"] = timeout_ms.into();
    }
    let reply = client.call(Opcode::TOOL, &serde_json::to_vec(&request)?)?;
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    if reply["success"] != true {
        bail!(
            "{} ({})",
            reply["error"].as_str().unwrap_or("the call failed"),
            reply["code"].as_str().unwrap_or("?")
        );
    }
    if !args.json {
        match &reply["result"] {
            serde_json::Value::String(text) => println!("{text}"),
            result => println!("{}", serde_json::to_string_pretty(result)?),
        }
    }
    Ok(())
}
