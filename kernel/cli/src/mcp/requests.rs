//! Kernel requests whose proto type is one the kernel reads but no client
//! writes: EXEC's session operations (`ExecCall`), TOOL's `search` and
//! `call` (`ToolCall`), and SPAWN with only the fields a tool sets
//! (`SpawnRequest`, whose defaults are the kernel's to fill in). Each
//! serialises to a payload that proto's own parser reads as the request
//! meant; the tests below hold them to it. Every other request the
//! server sends is proto's own type.

use std::path::PathBuf;

use agentos_proto::payload::{Detail, Limits, Network};
use rmcp::model::JsonObject;
use serde::Serialize;

/// An EXEC operation on the caller's sessions.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum SessionOp<'a> {
    /// The caller's sessions.
    Sessions,
    /// End a session and delete its workspace.
    Close { session: &'a str },
    /// Save a session's `/workspace` under a name.
    Snapshot { session: &'a str, name: &'a str },
    /// Put a snapshot back as a session's `/workspace`.
    Restore { session: &'a str, name: &'a str },
}

/// A TOOL request of the kernel's catalogue.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ToolOp<'a> {
    /// The tools that best match the words.
    Search {
        query: &'a str,
        detail: Detail,
        #[serde(skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// One call of one tool; its arguments go as the caller gave them.
    Call {
        server: &'a str,
        tool: &'a str,
        arguments: &'a JsonObject,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        trace: Option<String>,
    },
}

/// A SPAWN request: what the `spawn` tool sets, the rest left to the
/// kernel's defaults.
#[derive(Debug, Serialize)]
pub struct SpawnCall {
    pub name: String,
    #[serde(flatten)]
    pub program: Program,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
}

/// What an agent runs.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Program {
    /// A Python script, by its absolute path, and its arguments.
    Script { script: PathBuf, args: Vec<String> },
    /// A program and its arguments.
    Command { command: Vec<String> },
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{ExecCall, NetworkPolicy, SpawnRequest, ToolCall};

    use super::*;

    fn payload(request: &impl Serialize) -> Vec<u8> {
        serde_json::to_vec(request).unwrap()
    }

    #[test]
    fn session_operations_are_the_ones_exec_reads() {
        let read = |op: SessionOp<'_>| ExecCall::parse(&payload(&op)).unwrap();
        assert_eq!(read(SessionOp::Sessions), ExecCall::Sessions);
        assert_eq!(
            read(SessionOp::Close { session: "s" }),
            ExecCall::Close {
                session: "s".into()
            }
        );
        let (session, name) = ("s".to_owned(), "n".to_owned());
        assert_eq!(
            read(SessionOp::Snapshot {
                session: "s",
                name: "n"
            }),
            ExecCall::Snapshot {
                session: session.clone(),
                name: name.clone()
            }
        );
        assert_eq!(
            read(SessionOp::Restore {
                session: "s",
                name: "n"
            }),
            ExecCall::Restore { session, name }
        );
    }

    #[test]
    fn a_search_and_a_call_are_the_ones_tool_reads() {
        let search = ToolOp::Search {
            query: "read file",
            detail: Detail::Full,
            limit: Some(3),
        };
        assert_eq!(
            ToolCall::parse(&payload(&search)).unwrap(),
            ToolCall::Search {
                query: "read file".into(),
                detail: Detail::Full,
                limit: 3
            }
        );
        let arguments = JsonObject::from_iter([("message".to_owned(), "hi".into())]);
        let call = ToolOp::Call {
            server: "everything",
            tool: "echo",
            arguments: &arguments,
            timeout_ms: None,
            trace: None,
        };
        assert_eq!(
            ToolCall::parse(&payload(&call)).unwrap(),
            ToolCall::Call {
                server: "everything".into(),
                tool: "echo".into(),
                arguments,
                timeout_ms: None,
                trace: None
            }
        );
    }

    #[test]
    fn a_spawn_is_the_one_spawn_reads_with_the_kernels_defaults() {
        let call = SpawnCall {
            name: "w".into(),
            program: Program::Script {
                script: "/srv/agent.py".into(),
                args: vec!["-v".into()],
            },
            limits: Some(Limits {
                max_pids: Some(8),
                ..Limits::default()
            }),
            network: Some(Network::Policy(Box::new(NetworkPolicy {
                allow: vec!["pypi.org:443".into()],
                deny: Vec::new(),
            }))),
        };
        let read = SpawnRequest::parse(&payload(&call)).unwrap();
        assert_eq!(read.script.as_deref(), Some("/srv/agent.py"));
        assert_eq!(
            (read.args, read.limits.max_pids),
            (vec!["-v".into()], Some(8))
        );
        assert!(read.sandboxed && matches!(read.network, Some(Network::Policy(_))));
        let command = SpawnCall {
            name: "w".into(),
            program: Program::Command {
                command: vec!["/bin/true".into()],
            },
            limits: None,
            network: None,
        };
        let read = SpawnRequest::parse(&payload(&command)).unwrap();
        assert_eq!(read.command, Some(vec!["/bin/true".to_owned()]));
    }
}
