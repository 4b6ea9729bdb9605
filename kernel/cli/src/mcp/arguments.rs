//! The tools' arguments: their types (whose JSON schemas are the tools'
//! input schemas) and reading them with errors that name the argument.

use std::collections::BTreeMap;

use agentos_proto::payload::{
    noting_unknown, Language, NetworkPolicy, TaskKind, TaskState, UnknownField,
};
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Why a tool's arguments are refused before anything is asked of the
/// kernel. Each names the argument at fault, which a model can act on.
#[derive(Debug, thiserror::Error)]
pub enum ArgumentError {
    /// The arguments as a whole do not read as the tool's.
    #[error("bad arguments: {0}")]
    Malformed(serde_json::Error),
    /// One argument does not read: `path` names it (`limits.cpus`).
    #[error("argument {path}: {error}")]
    Invalid {
        path: String,
        error: serde_json::Error,
    },
    /// An argument the tool does not take, by its path (`network.dney`).
    #[error("unknown argument {0}")]
    Unknown(UnknownField),
    /// Both or neither of two arguments, where exactly one is needed.
    #[error("give exactly one of the arguments {0} and {1}")]
    OneOf(&'static str, &'static str),
    /// An argument whose value, or whose company, the tool does not take.
    #[error("argument {argument}: {why}")]
    Refused {
        argument: &'static str,
        why: &'static str,
    },
    /// The script's path could not be made absolute.
    #[error("argument script: {0}")]
    Script(std::io::Error),
    /// Arguments for code given with a prompt.
    #[error("language, session, timeout_ms and env go with code, not prompt")]
    CodeOnly,
}

/// Reads a tool's arguments as `T`. The error names the argument at fault
/// (`argument timeout_ms: invalid type ...`); serde alone would say only
/// what was wrong, not where.
/// An argument no type along the way knows (a misspelt `deny` in a
/// network policy) is refused, not passed over.
pub fn read<T: DeserializeOwned>(arguments: JsonObject) -> Result<T, ArgumentError> {
    let mut track = serde_path_to_error::Track::new();
    let mut unknown = None;
    let tracked =
        serde_path_to_error::Deserializer::new(serde_json::Value::Object(arguments), &mut track);
    let read = noting_unknown(tracked, &mut unknown).map_err(|error| {
        let path = track.path().to_string();
        if path == "." {
            ArgumentError::Malformed(error)
        } else {
            ArgumentError::Invalid { path, error }
        }
    })?;
    match unknown {
        Some(field) => Err(ArgumentError::Unknown(field)),
        None => Ok(read),
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArguments {
    /// The code to run.
    pub code: String,
    /// python (default) or bash.
    #[serde(default)]
    pub language: Language,
    /// Keep interpreter state and /workspace across calls under this name.
    pub session: Option<String>,
    /// The run's wall-clock limit in ms (default: the kernel's).
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// Environment variables for the run.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What the run may reach beyond its own loopback, through the kernel's egress proxy (default: the kernel's default policy, or nothing).
    pub network: Option<NetworkPolicy>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThinkArguments {
    /// The prompt.
    pub prompt: String,
    /// Upper bound on the answer's tokens.
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAgentsArguments {
    /// Include agents that have ended.
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArguments {
    /// Agent name ([A-Za-z0-9_.-], up to 64).
    pub name: String,
    /// A Python script to run (give this or command).
    pub script: Option<String>,
    /// A program and its arguments (give this or script).
    pub command: Option<Vec<String>>,
    /// Arguments for the script.
    #[serde(default)]
    pub args: Vec<String>,
    /// Resource limits.
    pub limits: Option<SpawnLimits>,
    /// What the agent may reach beyond its own loopback, through the kernel's egress proxy (default: the kernel's default policy, or nothing).
    pub network: Option<NetworkPolicy>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnLimits {
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU share in CPUs (0.5 = half of one CPU).
    pub cpus: Option<f64>,
    /// Process limit.
    pub max_pids: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillArguments {
    /// The agent's name (give this or id).
    pub name: Option<String>,
    /// The agent's id (give this or name).
    pub id: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLogsArguments {
    /// The agent's name (give this or id).
    pub name: Option<String>,
    /// The agent's id (give this or name).
    pub id: Option<u32>,
    /// How many of the log's last lines (default 100).
    #[schemars(range(min = 0, max = 100_000))]
    pub lines: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArguments {
    /// The session's name.
    pub session: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArguments {
    /// The session's name.
    pub session: String,
    /// The snapshot's name.
    pub name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskDispatchArguments {
    /// Code to run as an exec task (give this or prompt).
    pub code: Option<String>,
    /// For code: python (default) or bash.
    pub language: Option<Language>,
    /// For code: the exec session to run in.
    pub session: Option<String>,
    /// For code: the run's wall-clock limit in ms.
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// For code: environment variables for the run.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A prompt for the LLM as a think task (give this or code).
    pub prompt: Option<String>,
    /// For prompt: upper bound on the answer's tokens.
    pub max_tokens: Option<u32>,
    /// A label to find the task by.
    pub label: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArguments {
    /// The task's id (t-...).
    pub task_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskWaitArguments {
    /// The task's id (t-...).
    pub task_id: String,
    /// How long to wait for the task to finish, in ms (default: the kernel's).
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListArguments {
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks of this kind.
    pub kind: Option<TaskKind>,
    /// At most this many tasks.
    #[schemars(range(min = 1))]
    pub limit: Option<u32>,
    /// Tasks older than this task id (a previous listing's next).
    pub before: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsSearchArguments {
    /// Words describing what the tool should do.
    pub query: String,
    /// Give each tool's full input and output schemas, not only name and description.
    #[serde(default)]
    pub detail: bool,
    /// At most this many tools (default: the kernel's).
    #[schemars(range(min = 1))]
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsCallArguments {
    /// The MCP server, as tools_search names it.
    pub server: String,
    /// The tool's name.
    pub tool: String,
    /// The tool's arguments, as its input schema describes them.
    #[serde(default)]
    pub arguments: JsonObject,
    /// The call's limit in ms (default: the kernel's).
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: serde_json::Value) -> JsonObject {
        value.as_object().expect("an object").clone()
    }

    #[test]
    fn a_wrongly_typed_argument_is_named() {
        let err = read::<ExecArguments>(object(serde_json::json!({
            "code": "print(1)", "timeout_ms": "soon"
        })))
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("argument timeout_ms:"), "{err}");
    }

    #[test]
    fn a_missing_or_unknown_argument_is_named() {
        let err = read::<ExecArguments>(object(serde_json::json!({"language": "bash"})))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`code`"), "{err}");
        let err = read::<ExecArguments>(object(serde_json::json!({"code": "", "sesion": "a"})))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`sesion`"), "{err}");
        // A misspelt denial must not pass as no denial at all.
        let err = read::<ExecArguments>(object(serde_json::json!({
            "code": "", "network": {"allow": ["*"], "dney": ["10.0.0.0/8"]}
        })))
        .unwrap_err()
        .to_string();
        assert_eq!(err, "unknown argument network.dney");
    }

    #[test]
    fn a_language_other_than_python_or_bash_is_refused() {
        let err = read::<ExecArguments>(object(serde_json::json!({
            "code": "puts 1", "language": "ruby"
        })))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("argument language:") && err.contains("ruby"),
            "{err}"
        );
    }
}
