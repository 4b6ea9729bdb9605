//! The tools' arguments: their types (whose JSON schemas are the tools'
//! input schemas) and reading them with errors that name the argument.

use std::collections::BTreeMap;

use agentos_proto::payload::{
    noting_unknown, Language, NetworkPolicy, TaskKind, TaskState, UnknownField, VolumeMount,
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
    /// An argument an `exec_session` op needs, not given.
    #[error("argument {argument}: op {op} needs it")]
    NeededBy {
        argument: &'static str,
        op: SessionOp,
    },
    /// An argument given to an `exec_session` op that does not take it.
    #[error("argument {argument}: op {op} does not take it")]
    NotTakenBy {
        argument: &'static str,
        op: SessionOp,
    },
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

// A field's doc comment is its argument's description in the tool's
// input schema, which every client reads in full: an argument whose name,
// type and tool say what it is has none, and the others say only what a
// caller needs (see `schema`).

/// `exec`: `code` in `language`, with `env`, within `timeout_ms`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArguments {
    pub code: String,
    #[serde(default)]
    pub language: Language,
    /// Keeps variables, files and pip installs across calls.
    pub session: Option<String>,
    /// A prepared environment (e.g. python-data).
    pub template: Option<String>,
    // Each a volume's name and where it goes. Undescribed: its fields say
    // what it is, the kernel names a path it refuses (a volume goes at
    // /data, or beneath /data, /mnt or /workspace), and the tool list
    // stays within its budget.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Hosts, *.domains, * or CIDRs[:port] to allow or deny.
    pub network: Option<NetworkPolicy>,
}

/// `think`: a `prompt`, answered in at most `max_tokens`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThinkArguments {
    pub prompt: String,
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAgentsArguments {
    // Ended agents too (said in the tool's description).
    #[serde(default)]
    pub all: bool,
}

/// `spawn`: an agent `name`d, running a `script` (with `args`) or a
/// `command`, within `limits`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArguments {
    pub name: String,
    /// A Python script's path.
    pub script: Option<String>,
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub args: Vec<String>,
    pub limits: Option<SpawnLimits>,
    /// Hosts, *.domains, * or CIDRs[:port] to allow or deny.
    pub network: Option<NetworkPolicy>,
}

/// Resource limits.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnLimits {
    pub memory_bytes: Option<u64>,
    /// In CPUs: 0.5 is half of one.
    pub cpus: Option<f64>,
    pub max_pids: Option<u64>,
}

/// `kill`: an agent by `name` or by `id`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillArguments {
    pub name: Option<String>,
    pub id: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

/// `agent_logs`: an agent by `name` or by `id`, its last `lines`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLogsArguments {
    pub name: Option<String>,
    pub id: Option<u32>,
    // 100 if left out, and at most 100 000: the kernel says and checks both.
    pub lines: Option<u64>,
}

/// `exec_session`: an `op` on a `session` (but for `list`), with a
/// snapshot's `name` (for `snapshot` and `restore`), `state` (for
/// `snapshot`: the interpreter's globals too) and `into` (for `restore`: a
/// new session to branch into). One flat object, so its schema stays a
/// few plain arguments; which an op needs and which it refuses is
/// `SessionArguments::call`'s to say.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArguments {
    pub op: SessionOp,
    pub session: Option<String>,
    // The snapshot's; `state` saves the globals too, `into` names the
    // branch. Undescribed: the tool's description says all three in
    // fewer bytes, and the tool list stays within its budget.
    pub name: Option<String>,
    pub state: Option<bool>,
    pub into: Option<String>,
}

/// What `exec_session` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionOp {
    List,
    Close,
    Snapshot,
    Restore,
    Pause,
    Resume,
    Hibernate,
}

impl std::fmt::Display for SessionOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SessionOp::List => "list",
            SessionOp::Close => "close",
            SessionOp::Snapshot => "snapshot",
            SessionOp::Restore => "restore",
            SessionOp::Pause => "pause",
            SessionOp::Resume => "resume",
            SessionOp::Hibernate => "hibernate",
        })
    }
}

/// An `exec_session` op with what it takes: the arguments read, checked
/// against the op.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionCall {
    /// The caller's sessions.
    List,
    /// End `session` and remove its files.
    Close { session: String },
    /// Save `session`'s files as `name`; with `state`, its interpreter's
    /// globals too.
    Snapshot {
        session: String,
        name: String,
        state: bool,
    },
    /// Put snapshot `name` back as `session`'s files, or make session
    /// `into` from it.
    Restore {
        session: String,
        name: String,
        into: Option<String>,
    },
    /// Freeze `session`'s interpreter, let it go on (`resume`), or save
    /// its globals and end it (`hibernate`): PAUSE or RESUME.
    Freeze { session: String, op: SessionOp },
}

impl SessionArguments {
    /// The call the arguments make: each op with the arguments it needs,
    /// and none it does not take, else the argument at fault.
    pub fn call(self) -> Result<SessionCall, ArgumentError> {
        let SessionArguments {
            op,
            session,
            name,
            state,
            into,
        } = self;
        let needed = |argument: &'static str, value: Option<String>| {
            value.ok_or(ArgumentError::NeededBy { argument, op })
        };
        let not_taken = |argument: &'static str, given: bool| {
            if given {
                Err(ArgumentError::NotTakenBy { argument, op })
            } else {
                Ok(())
            }
        };
        if op != SessionOp::Snapshot {
            not_taken("state", state.is_some())?;
        }
        if op != SessionOp::Restore {
            not_taken("into", into.is_some())?;
        }
        match op {
            SessionOp::List => {
                not_taken("session", session.is_some())?;
                not_taken("name", name.is_some())?;
                Ok(SessionCall::List)
            }
            SessionOp::Close => {
                not_taken("name", name.is_some())?;
                Ok(SessionCall::Close {
                    session: needed("session", session)?,
                })
            }
            SessionOp::Pause | SessionOp::Resume | SessionOp::Hibernate => {
                not_taken("name", name.is_some())?;
                Ok(SessionCall::Freeze {
                    session: needed("session", session)?,
                    op,
                })
            }
            SessionOp::Snapshot => Ok(SessionCall::Snapshot {
                session: needed("session", session)?,
                name: needed("name", name)?,
                state: state.unwrap_or(false),
            }),
            SessionOp::Restore => Ok(SessionCall::Restore {
                session: needed("session", session)?,
                name: needed("name", name)?,
                into,
            }),
        }
    }
}

/// `task_dispatch`: `code` (with `language`, `session`, `timeout_ms` and
/// `env`, as `exec` takes them) or a `prompt` (with `max_tokens`), and a
/// `label`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskDispatchArguments {
    pub code: Option<String>,
    pub language: Option<Language>,
    pub session: Option<String>,
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub prompt: Option<String>,
    pub max_tokens: Option<u32>,
    pub label: Option<String>,
}

/// A task, by its `task_id` (`t-...`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArguments {
    pub task_id: String,
}

/// `task_wait`: a task by `task_id`, waited for up to `timeout_ms`
/// (none, or 0: not waited for, the task as it is now).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskWaitArguments {
    pub task_id: String,
    pub timeout_ms: Option<u64>,
}

/// `task_list`: the caller's tasks in a `state`, of a `kind`, `limit` of
/// them, older than the task `before`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListArguments {
    pub state: Option<TaskState>,
    pub kind: Option<TaskKind>,
    pub limit: Option<u32>,
    // A listing's next: the tasks older than this task_id (said in the
    // tool's description).
    pub before: Option<String>,
}

/// `tools_search`: the tools matching a `query`, `limit` of them, with
/// their schemas when `detail`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsSearchArguments {
    pub query: String,
    // The tools' schemas too (said in the tool's description).
    #[serde(default)]
    pub detail: bool,
    pub limit: Option<u32>,
}

/// `tools_call`: a `server`'s `tool`, called with `arguments`, within
/// `timeout_ms`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsCallArguments {
    pub server: String,
    pub tool: String,
    #[serde(default)]
    pub arguments: JsonObject,
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
    fn volumes_are_read_as_mounts_and_a_misspelt_field_is_named() {
        let read_only = read::<ExecArguments>(object(serde_json::json!({
            "code": "", "volumes": [{"name": "data", "path": "/data", "read_only": true}]
        })))
        .expect("arguments");
        assert_eq!(
            read_only.volumes,
            [VolumeMount {
                name: "data".into(),
                path: "/data".into(),
                read_only: true
            }]
        );
        let err = read::<ExecArguments>(object(serde_json::json!({
            "code": "", "volumes": [{"name": "data", "path": "/data", "readonly": true}]
        })))
        .unwrap_err()
        .to_string();
        assert!(err.contains("readonly"), "{err}");
    }

    fn session_call(value: serde_json::Value) -> Result<SessionCall, String> {
        read::<SessionArguments>(object(value))
            .and_then(SessionArguments::call)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn each_session_op_takes_what_it_needs_and_refuses_the_rest_by_name() {
        use serde_json::json;
        assert_eq!(session_call(json!({"op": "list"})), Ok(SessionCall::List));
        assert_eq!(
            session_call(json!({"op": "close", "session": "s"})),
            Ok(SessionCall::Close {
                session: "s".into()
            })
        );
        assert_eq!(
            session_call(json!({"op": "restore", "session": "s", "name": "n"})),
            Ok(SessionCall::Restore {
                session: "s".into(),
                name: "n".into(),
                into: None
            })
        );
        assert_eq!(
            session_call(json!({"op": "restore", "session": "s", "name": "n", "into": "b"})),
            Ok(SessionCall::Restore {
                session: "s".into(),
                name: "n".into(),
                into: Some("b".into())
            })
        );
        assert_eq!(
            session_call(json!({"op": "snapshot", "session": "s", "name": "n"})),
            Ok(SessionCall::Snapshot {
                session: "s".into(),
                name: "n".into(),
                state: false
            })
        );
        assert_eq!(
            session_call(json!({"op": "snapshot", "session": "s", "name": "n", "state": true})),
            Ok(SessionCall::Snapshot {
                session: "s".into(),
                name: "n".into(),
                state: true
            })
        );
        let refused = |value| session_call(value).unwrap_err();
        assert_eq!(
            refused(json!({"op": "snapshot", "session": "s"})),
            "argument name: op snapshot needs it"
        );
        assert_eq!(
            refused(json!({"op": "close"})),
            "argument session: op close needs it"
        );
        assert_eq!(
            refused(json!({"op": "list", "session": "s"})),
            "argument session: op list does not take it"
        );
        assert_eq!(
            refused(json!({"op": "close", "session": "s", "name": "n"})),
            "argument name: op close does not take it"
        );
        assert_eq!(
            refused(json!({"op": "restore", "session": "s", "name": "n", "state": true})),
            "argument state: op restore does not take it"
        );
        assert_eq!(
            refused(json!({"op": "snapshot", "session": "s", "name": "n", "into": "b"})),
            "argument into: op snapshot does not take it"
        );
        assert_eq!(
            refused(json!({"op": "close", "session": "s", "state": false})),
            "argument state: op close does not take it"
        );
        let err = refused(json!({"op": "snapshot", "session": "s", "name": "n", "state": "yes"}));
        assert!(err.starts_with("argument state:"), "{err}");
        let err = refused(json!({"op": "list", "sesion": "s"}));
        assert!(err.contains("`sesion`"), "{err}");
        let err = refused(json!({"op": "drop", "session": "s"}));
        assert!(
            err.starts_with("argument op:") && err.contains("drop"),
            "{err}"
        );
        let err = refused(json!({"session": "s"}));
        assert!(err.contains("`op`"), "{err}");
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

/// `state`: an `op` on the state store — `get`, `set`, `delete` a `key`,
/// or `list` the keys that start with `prefix`; `set` takes the `value`
/// (any JSON) and a `ttl` in seconds; `scope` is `global` (your tree's,
/// the default for `set`) or `agent` (your own).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateArguments {
    pub op: StateOp,
    pub key: Option<String>,
    // `default` keeps it out of `required`, which a schema of its own
    // (`schema_with`) would otherwise put it in: only op set takes it.
    #[serde(default)]
    #[schemars(schema_with = "any_json")]
    pub value: Option<serde_json::Value>,
    pub scope: Option<StateScope>,
    pub ttl: Option<f64>,
    pub prefix: Option<String>,
}

/// What `state` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StateOp {
    Get,
    Set,
    Delete,
    List,
}

/// `messages`: `send` a `message` (any JSON) to an agent `to` (its name
/// or id), or `recv` the messages sent to this server.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessagesArguments {
    pub op: MessagesOp,
    pub to: Option<String>,
    // Not `required` (see `StateArguments::value`): op recv refuses it.
    #[serde(default)]
    #[schemars(schema_with = "any_json")]
    pub message: Option<serde_json::Value>,
}

/// Where a key lives: your tree's, or your own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StateScope {
    Global,
    Agent,
}

impl From<StateScope> for agentos_proto::payload::Scope {
    fn from(scope: StateScope) -> Self {
        match scope {
            StateScope::Global => agentos_proto::payload::Scope::Global,
            StateScope::Agent => agentos_proto::payload::Scope::Agent,
        }
    }
}

/// What `messages` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MessagesOp {
    Send,
    Recv,
}

/// Any JSON value: a schema that says nothing.
fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::Schema::default()
}
