//! What the benchmarks send the kernel and how they read its replies.
//!
//! Replies are read into the wire crate's own types. Two requests are
//! written here instead: `agentos_proto`'s `ExecRequest` and
//! `SpawnRequest` serialise every field, defaults included (a run's
//! `language`, an agent's restart policy and permissions), and a
//! benchmark's figures are only comparable from run to run while it sends
//! the same fields it always has. Everything else the benchmarks send
//! (THINK, KILL, TASK) is proto's own type.

use std::path::Path;

use agentos_proto::payload::{Language, Limits};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An EXEC `run` with only the fields a benchmark sets.
///
/// ```
/// use agentos_bench::wire::Run;
///
/// let run = serde_json::to_string(&Run::python("print(1)").in_session("s")).unwrap();
/// assert_eq!(run, r#"{"code":"print(1)","session":"s"}"#);
/// let bash = serde_json::to_string(&Run::bash("echo 1")).unwrap();
/// assert_eq!(bash, r#"{"code":"echo 1","language":"bash"}"#);
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Run<'a> {
    /// The program text.
    pub code: &'a str,
    /// Left out: Python.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<Language>,
    /// The session whose interpreter runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<&'a str>,
    /// Its wall-clock limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl<'a> Run<'a> {
    /// Python `code` in a fresh run, with the kernel's default timeout.
    pub const fn python(code: &'a str) -> Run<'a> {
        Run {
            code,
            language: None,
            session: None,
            timeout_ms: None,
        }
    }

    /// A bash script in a fresh run.
    pub fn bash(code: &'a str) -> Run<'a> {
        Run {
            language: Some(Language::Bash),
            ..Run::python(code)
        }
    }

    /// The same, through `session`.
    pub fn in_session(self, session: &'a str) -> Run<'a> {
        Run {
            session: Some(session),
            ..self
        }
    }

    /// The same, stopped after `timeout_ms`.
    pub fn timeout_ms(self, timeout_ms: u64) -> Run<'a> {
        Run {
            timeout_ms: Some(timeout_ms),
            ..self
        }
    }
}

/// A SPAWN with only the fields a benchmark sets: an agent's name, its
/// program (a command, or a script and the Python that runs it) and its
/// limits. Everything else is the kernel's default (sandboxed, never
/// restarted, the default permissions).
///
/// ```
/// use agentos_bench::wire::Spawn;
/// use agentos_proto::payload::Limits;
///
/// let limits = Limits { max_pids: Some(16), ..Limits::default() };
/// let spawn = Spawn::command("w", &["/bin/true"]).limits(limits);
/// assert_eq!(
///     serde_json::to_string(&spawn).unwrap(),
///     r#"{"name":"w","command":["/bin/true"],"limits":{"max_pids":16}}"#
/// );
/// ```
#[derive(Clone, Debug, Serialize)]
pub struct Spawn<'a> {
    /// The agent's name.
    pub name: String,
    /// Its argv.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<&'a [&'a str]>,
    /// The Python that runs `script`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<&'a str>,
    /// A script to run instead of a command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<&'a Path>,
    /// Arguments after the script.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its cgroup limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

impl<'a> Spawn<'a> {
    /// An agent called `name` running `command`.
    pub fn command(name: impl Into<String>, command: &'a [&'a str]) -> Spawn<'a> {
        Spawn {
            name: name.into(),
            command: Some(command),
            python: None,
            script: None,
            args: Vec::new(),
            limits: None,
        }
    }

    /// An agent called `name` running `script` with `python`, given `args`.
    pub fn script(
        name: impl Into<String>,
        python: &'a str,
        script: &'a Path,
        args: Vec<String>,
    ) -> Spawn<'a> {
        Spawn {
            name: name.into(),
            command: None,
            python: Some(python),
            script: Some(script),
            args,
            limits: None,
        }
    }

    /// The same agent within `limits`.
    pub fn limits(self, limits: Limits) -> Spawn<'a> {
        Spawn {
            limits: Some(limits),
            ..self
        }
    }
}

/// A reply that is not the one its request expects (an error reply, a
/// run that failed): its text, for the message that says so.
#[derive(Debug, thiserror::Error)]
#[error("{text}")]
pub struct UnexpectedReply {
    /// The reply's payload, as text.
    pub text: String,
}

impl UnexpectedReply {
    /// The reply `payload`.
    pub fn of(payload: &[u8]) -> UnexpectedReply {
        UnexpectedReply {
            text: String::from_utf8_lossy(payload).into_owned(),
        }
    }
}

/// `payload` read as `T`, the reply its request expects, when it is one
/// and `accept` takes it; read after the clock has stopped, so a
/// benchmark times the round trip alone.
///
/// ```
/// use agentos_bench::wire::read_reply;
/// use agentos_proto::payload::TaskDispatchReply;
///
/// let ok: TaskDispatchReply =
///     read_reply(br#"{"success":true,"task_id":"t-1"}"#, |r: &TaskDispatchReply| r.success)
///         .unwrap();
/// assert_eq!(ok.task_id, "t-1");
/// let refused = br#"{"success":false,"error":"no","code":"bad_request"}"#;
/// let err = read_reply(refused, |r: &TaskDispatchReply| r.success).unwrap_err();
/// assert_eq!(err.text, String::from_utf8_lossy(refused));
/// ```
pub fn read_reply<T: DeserializeOwned>(
    payload: &[u8],
    accept: impl FnOnce(&T) -> bool,
) -> Result<T, UnexpectedReply> {
    match serde_json::from_slice::<T>(payload) {
        Ok(reply) if accept(&reply) => Ok(reply),
        _ => Err(UnexpectedReply::of(payload)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use agentos_proto::payload::{
        KillRequest, Limits, TaskDispatch, TaskKind, TaskList, TaskRef, TaskRequest, TaskWait,
        ThinkRequest,
    };
    use serde_json::{json, Value};

    use super::{Run, Spawn};

    fn sent(request: impl serde::Serialize) -> Value {
        serde_json::to_value(request).unwrap()
    }

    #[test]
    fn runs_and_spawns_carry_only_the_fields_a_benchmark_sets() {
        assert_eq!(sent(Run::python("print(1)")), json!({"code": "print(1)"}));
        assert_eq!(
            sent(Run::python("x").timeout_ms(120_000)),
            json!({"code": "x", "timeout_ms": 120_000})
        );
        let limits = Limits {
            memory: Some(64 << 20),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            max_pids: Some(16),
        };
        assert_eq!(
            sent(Spawn::command("b-1", &["/bin/true"]).limits(limits)),
            json!({"name": "b-1", "command": ["/bin/true"],
                   "limits": {"memory": 64u64 << 20, "cpu_quota": 50_000,
                              "cpu_period": 100_000, "max_pids": 16}})
        );
        let script = Spawn::script(
            "f",
            "/usr/bin/python3",
            Path::new("/a/f.py"),
            vec!["3".into()],
        );
        assert_eq!(
            sent(script),
            json!({"name": "f", "python": "/usr/bin/python3", "script": "/a/f.py", "args": ["3"]})
        );
    }

    #[test]
    fn the_wire_crates_requests_send_what_the_benchmarks_always_sent() {
        let dispatch = TaskRequest::Dispatch(TaskDispatch::new(
            TaskKind::Exec,
            sent(Run::python("print(1)")),
        ));
        assert_eq!(
            sent(dispatch),
            json!({"op": "dispatch", "kind": "exec", "request": {"code": "print(1)"}})
        );
        let think = TaskRequest::Dispatch(TaskDispatch::new(TaskKind::Think, "hi".into()));
        assert_eq!(
            sent(think),
            json!({"op": "dispatch", "kind": "think", "request": "hi"})
        );
        let task_id = "t-1".to_owned();
        assert_eq!(
            sent(TaskRequest::Status(TaskRef {
                task_id: task_id.clone()
            })),
            json!({"op": "status", "task_id": "t-1"})
        );
        assert_eq!(
            sent(TaskRequest::Wait(TaskWait {
                task_id,
                timeout_ms: Some(60_000)
            })),
            json!({"op": "wait", "task_id": "t-1", "timeout_ms": 60_000})
        );
        let list = TaskList {
            limit: Some(1000),
            ..TaskList::default()
        };
        assert_eq!(
            sent(TaskRequest::List(list)),
            json!({"op": "list", "limit": 1000})
        );
        let kill = KillRequest {
            name: Some("flooder".into()),
            grace_ms: Some(0),
            ..KillRequest::default()
        };
        assert_eq!(sent(kill), json!({"name": "flooder", "grace_ms": 0}));
        let think = ThinkRequest {
            prompt: Some("p".into()),
            max_tokens: Some(24),
            temperature: Some(0.0),
            ..ThinkRequest::default()
        };
        assert_eq!(
            sent(think),
            json!({"prompt": "p", "max_tokens": 24, "temperature": 0.0})
        );
    }
}
