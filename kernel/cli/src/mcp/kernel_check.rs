//! The look at the kernel when the server starts, and what `initialize`
//! says of it.
//!
//! A client reads the server's instructions once, before any tool call,
//! so that is where to name what the kernel offers this caller: the MCP
//! servers whose tools it reaches through `tools_search`, `tools_call` and
//! `exec`'s Python. And it is where a kernel missing at the resolved
//! socket is worth naming: a client that started the server with a
//! minimal environment (no `AGENTOS_SOCKET`) learns the path tried and the
//! fix before its first call fails. The look never stops the server from
//! starting, and it shapes nothing else: each call connects afresh, so a
//! kernel that comes up later serves the next call, and a call's own error
//! says what that call found (`KernelError::Unreachable`).

use std::path::Path;
use std::time::Duration;

use agentos_proto::payload::{HelloReply, HelloRequest, ServerInfo};
use agentos_proto::Opcode;

use super::kernel::{KernelError, KernelLink, Wait, SOCKET_HINT};

/// How long the look may hold up the server's start. A kernel that is
/// up answers HELLO at once; a missing one fails its connect at once.
/// Only a stuck kernel meets the limit, and a client waits for
/// `initialize` meanwhile.
const LOOK_LIMIT: Duration = Duration::from_secs(2);

/// What the server tells every client about itself and its tools.
const ABOUT: &str = "AgentOS: isolated code execution (exec, exec_session for sessions), agents \
     (spawn, list_agents, kill, agent_logs), the kernel's LLM (think, and \
     run_prompt: it writes and runs code until it can answer), and \
     background tasks (task_*). Calls act as the user who started this server.";

/// How to find and call the kernel's tools: its MCP servers' and its own.
const FINDING_TOOLS: &str = "The kernel's MCP servers' tools are not tools of this server: \
     find them with tools_search, and call them with tools_call (server, tool, arguments) or \
     in exec's Python as tools.<server>.<tool>(...).";

/// What the look found: the MCP servers the kernel serves this caller
/// (HELLO names the same ones TOOL `list` does, by the caller's tool
/// permissions), unless the kernel is too old to say.
#[derive(Debug)]
pub struct Found {
    tool_servers: Option<Vec<ServerInfo>>,
    /// The kernel's node, in a fleet.
    pub node: Option<String>,
}

/// Connects to the kernel and says HELLO, within [`LOOK_LIMIT`]: what a
/// kernel answered, or why none did.
pub async fn look(kernel: &KernelLink) -> Result<Found, KernelError> {
    let hello = kernel.request::<HelloReply>(Opcode::HELLO, &HelloRequest {}, Wait::Quick);
    match tokio::time::timeout(LOOK_LIMIT, hello).await {
        Ok(reply) => reply.map(|hello| Found {
            tool_servers: hello.tool_servers,
            node: hello.node,
        }),
        Err(_) => Err(KernelError::NoReply(LOOK_LIMIT)),
    }
}

/// The server's instructions, given what the look at `socket` found.
pub fn instructions(socket: &Path, looked: &Result<Found, KernelError>) -> String {
    let why = match looked {
        Ok(Found {
            tool_servers: Some(servers),
            ..
        }) => return format!("{ABOUT}\n\n{} {FINDING_TOOLS}", servers_named(servers)),
        Ok(Found {
            tool_servers: None, ..
        }) => return format!("{ABOUT}\n\n{FINDING_TOOLS}"),
        // Its own message repeats the path and the hint said below.
        Err(KernelError::Unreachable { error, .. }) => error.to_string(),
        Err(other) => other.to_string(),
    };
    format!(
        "{ABOUT}\n\n{FINDING_TOOLS}\n\nWhen this server started, no AgentOS kernel \
         answered at {} ({why}), so tool calls fail until one does. {SOCKET_HINT}.",
        socket.display()
    )
}

/// The sentence naming `servers`, each that is not serving with its
/// state (`starting`, `failed`).
fn servers_named(servers: &[ServerInfo]) -> String {
    if servers.is_empty() {
        return "The kernel runs no MCP server for you.".to_owned();
    }
    let names: Vec<String> = servers
        .iter()
        .map(|server| match server.state.as_str() {
            "ready" => server.name.clone(),
            state => format!("{} ({state})", server.name),
        })
        .collect();
    format!("The kernel's MCP servers for you: {}.", names.join(", "))
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::PathBuf;

    use super::*;

    fn server(name: &str, state: &str) -> ServerInfo {
        ServerInfo {
            name: name.to_owned(),
            state: state.to_owned(),
            error: None,
            tools: 0,
        }
    }

    fn answered(servers: Option<Vec<ServerInfo>>) -> String {
        let found = Found {
            tool_servers: servers,
            node: None,
        };
        instructions(Path::new("/s.sock"), &Ok(found))
    }

    #[test]
    fn a_kernel_that_answered_has_its_servers_named_and_tools_search_pointed_to() {
        let said = answered(Some(vec![
            server("everything", "ready"),
            server("time", "starting"),
        ]));
        assert!(said.starts_with(ABOUT), "{said}");
        assert!(
            said.contains("MCP servers for you: everything, time (starting)."),
            "{said}"
        );
        assert!(said.contains("tools_search"), "{said}");
        assert!(said.contains("tools.<server>.<tool>("), "{said}");
        assert!(!said.contains("/s.sock"), "{said}");
    }

    #[test]
    fn no_server_is_said_as_none_and_an_unsaid_list_as_nothing() {
        let none = answered(Some(Vec::new()));
        assert!(none.contains("no MCP server for you"), "{none}");
        assert!(none.contains("tools_search"), "{none}");
        let unsaid = answered(None);
        assert_eq!(unsaid, format!("{ABOUT}\n\n{FINDING_TOOLS}"));
    }

    #[test]
    fn a_missing_kernel_is_named_with_its_socket_and_the_ways_to_set_it() {
        let socket = PathBuf::from("/tmp/agentos-0/agentos.sock");
        let missing = KernelError::Unreachable {
            socket: socket.clone(),
            error: io::Error::from(io::ErrorKind::NotFound),
            hint: SOCKET_HINT,
        };
        let said = instructions(&socket, &Err(missing));
        assert!(said.starts_with(ABOUT), "{said}");
        // A kernel not reached has named no servers: none is guessed at.
        assert!(!said.contains("MCP servers for you"), "{said}");
        assert!(said.contains("tools_search"), "{said}");
        assert_eq!(
            said.matches("/tmp/agentos-0/agentos.sock").count(),
            1,
            "{said}"
        );
        for fix in [
            "agentos mcp --socket PATH",
            "AGENTOS_SOCKET",
            "`env`",
            "not found",
        ] {
            assert!(said.contains(fix), "{fix}: {said}");
        }
        let stuck = instructions(&socket, &Err(KernelError::NoReply(LOOK_LIMIT)));
        assert!(stuck.contains("did not answer within 2 s"), "{stuck}");
        assert!(stuck.contains("--socket PATH"), "{stuck}");
    }

    #[test]
    fn the_look_reports_the_socket_it_found_nothing_at() {
        let socket = PathBuf::from("/nonexistent/agentos.sock");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let looked = runtime.block_on(look(&crate::mcp::kernel::link(socket.clone())));
        let Err(KernelError::Unreachable { socket: tried, .. }) = &looked else {
            panic!("{looked:?}");
        };
        assert_eq!(tried, &socket);
        let said = looked.unwrap_err().to_string();
        assert!(
            said.starts_with("cannot connect to the AgentOS kernel at /nonexistent/agentos.sock"),
            "{said}"
        );
        assert!(said.contains("`agentos mcp --socket PATH`"), "{said}");
        assert!(
            said.contains("AGENTOS_SOCKET=PATH in the server's `env`"),
            "{said}"
        );
    }
}
