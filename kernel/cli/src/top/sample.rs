//! What the kernel said at one moment: the figures `agentos top` shows.

use std::time::Instant;

use agentos_proto::payload::{
    AgentState, CpuStats, ExecStats, HelloReply, Limits, LlmStats, MemoryStats, MetricsReply,
    ServerInfo, TaskInfo, TaskList, TaskListReply, TaskOwner, TaskRequest, ToolCall, ToolListReply,
};
use agentos_proto::{Client, ClientError, Opcode};
use serde::Deserialize;

use super::keys::Pane;
use crate::error::CliError;
use crate::raw::Raw;
use crate::tools;

/// The fields of a LIST entry the view shows. They are read on their own,
/// not as `AgentInfo`, so that a kernel whose entries lack `exec` (or carry
/// more) is still shown.
#[derive(Debug, Deserialize)]
pub struct Entry {
    pub id: u32,
    pub name: String,
    pub state: String,
    pub restarts: u32,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub memory: MemoryStats,
    #[serde(default)]
    pub cpu: CpuStats,
    #[serde(default)]
    pub llm: LlmStats,
    #[serde(default)]
    pub exec: Option<ExecStats>,
}

impl Entry {
    /// Whether it has (or is about to have) processes using CPU.
    pub fn is_live(&self) -> bool {
        AgentState::LIVE
            .iter()
            .any(|live| live.as_str() == self.state)
    }
}

/// The entries of a list in a reply, as the kernel sent them (what
/// `--json` prints) and as read (what the table shows).
#[derive(Debug)]
pub struct Listed<T> {
    pub sent: Vec<Raw>,
    pub read: Vec<T>,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed {
            sent: Vec::new(),
            read: Vec::new(),
        }
    }
}

/// TASK `list`'s tasks as sent.
#[derive(Deserialize)]
struct SentTasks {
    tasks: Vec<Raw>,
}

/// TOOL `list`'s servers as sent.
#[derive(Deserialize)]
struct SentServers {
    servers: Vec<Raw>,
}

/// What the kernel said at one moment.
#[derive(Debug)]
pub struct Sample {
    /// When the LIST reply arrived.
    pub at: Instant,
    pub hello: HelloReply,
    pub agents: Vec<Entry>,
    /// The tasks view's: the TASK list reply's `tasks`.
    pub tasks: Listed<TaskInfo>,
    /// The servers view's: the TOOL list reply's `servers`.
    pub servers: Listed<ServerInfo>,
    /// The kernel's metrics text (METRICS), for an operator.
    pub metrics: Option<String>,
}

impl Sample {
    /// One HELLO and one LIST, then what `pane` shows besides the agents,
    /// and the metrics if the caller may read them.
    pub fn take(client: &mut Client, pane: Pane) -> Result<Sample, CliError> {
        let hello = client.hello()?;
        let agents: Vec<Entry> = client
            .call_json(Opcode::LIST, b"")
            .map_err(CliError::ReadingList)?;
        let at = Instant::now();
        let tasks = match pane {
            Pane::Tasks => {
                let raw = tasks(client)?;
                Listed {
                    sent: raw.decode::<SentTasks>()?.tasks,
                    read: raw.decode::<TaskListReply>()?.tasks,
                }
            }
            _ => Listed::default(),
        };
        let servers = match pane {
            Pane::Servers => {
                let raw = tools::ask(client, &ToolCall::List)?;
                Listed {
                    sent: raw.decode::<SentServers>()?.servers,
                    read: raw.decode::<ToolListReply>()?.servers,
                }
            }
            _ => Listed::default(),
        };
        // Operators only: anyone else gets the line without figures.
        let metrics = client
            .call_json::<MetricsReply>(Opcode::METRICS, b"")
            .ok()
            .map(|reply| reply.text);
        Ok(Sample {
            at,
            hello,
            agents,
            tasks,
            servers,
            metrics,
        })
    }
}

/// The newest tasks: everyone's for an operator, else the caller's own.
fn tasks(client: &mut Client) -> Result<Raw, CliError> {
    let list = |owner| {
        TaskRequest::List(TaskList {
            limit: Some(100),
            owner,
            ..TaskList::default()
        })
    };
    let everyone = list(Some(TaskOwner::Name("*".to_owned())));
    match client.call_json(Opcode::TASK, &serde_json::to_vec(&everyone)?) {
        Ok(reply) => Ok(reply),
        Err(ClientError::Remote(_)) => {
            let own = list(None);
            Ok(client.call_json(Opcode::TASK, &serde_json::to_vec(&own)?)?)
        }
        Err(err) => Err(err.into()),
    }
}

/// Samples made up for the view's tests.
#[cfg(test)]
pub mod fixtures {
    use super::*;

    /// An agent of `state` that has used `usage_usec` of CPU; agent 1 has
    /// made EXEC runs, the others' LIST entries say nothing of them.
    pub fn entry(id: u32, name: &str, state: &str, usage_usec: u64) -> Entry {
        let exec = if id == 1 {
            Some(ExecStats { runs: 3 })
        } else {
            None
        };
        Entry {
            id,
            name: name.into(),
            state: state.into(),
            restarts: 0,
            limits: Limits {
                memory: Some(256 << 20),
                ..Limits::default()
            },
            memory: MemoryStats {
                current: 12_900_000,
                peak: 0,
            },
            cpu: CpuStats {
                usage_usec,
                ..CpuStats::default()
            },
            llm: LlmStats {
                calls: 1,
                tokens: 40,
                queue_ms: 0,
            },
            exec,
        }
    }

    /// A sample taken `at` of a kernel without an LLM.
    pub fn sample(at: Instant, agents: Vec<Entry>) -> Sample {
        let hello = serde_json::from_str(
            r#"{"success": true, "protocol_version": 1, "kernel_version": "0.1.0",
                "agent_id": 1000000,
                "features": {"think": false, "exec": true, "spawn": true, "cgroup": "v2"},
                "llm": {"provider": "none", "model": "", "ready": false, "calls": 0,
                        "tokens": 0}}"#,
        )
        .expect("a HELLO reply");
        Sample {
            at,
            hello,
            agents,
            tasks: Listed::default(),
            servers: Listed::default(),
            metrics: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_entries_without_exec_or_with_unknown_fields_are_read() {
        let entries: Vec<Entry> = serde_json::from_str(
            r#"[{"id": 1, "name": "a", "state": "running", "restarts": 0, "limits": {},
                "memory": {"current": 1, "peak": 1}, "cpu": {"usage_usec": 5,
                "nr_throttled": 0, "throttled_usec": 0}, "llm": {"calls": 0, "tokens": 0},
                "boot": true},
               {"id": 2, "name": "b", "state": "exited", "restarts": 1, "limits": {},
                "memory": {"current": 0, "peak": 1}, "cpu": {"usage_usec": 5,
                "nr_throttled": 0, "throttled_usec": 0}, "llm": {"calls": 0, "tokens": 0},
                "exec": {"runs": 7}}]"#,
        )
        .expect("LIST entries");
        assert!(entries[0].exec.is_none());
        assert_eq!(entries[1].exec.as_ref().map(|e| e.runs), Some(7));
    }
}
