//! EXEC (0x02): a run (its request is `exec_run`'s), or an operation on
//! the caller's sessions, snapshots, templates or volumes. The request's
//! `op` (default `run`) picks which, and each op takes its own fields.

use serde::{Deserialize, Serialize};

use super::exec_run::check_timeout;
use super::exec_run::ExecRequest;
use super::parse::{bad_request, parse_json, validate_name};
use super::session_files::{FileCall, FileOp};
use super::session_open::{LifetimeWire, OpenWire, SessionOpen};
use super::session_procs::{ProcCall, ProcOp};
use super::sessions::Lifetime;
use crate::error::ErrorReply;

/// An EXEC request: a run, or an operation on the caller's sessions.
/// Serialised, it is the payload [`ExecCall::parse`] reads back.
///
/// ```
/// use agentos_proto::payload::ExecCall;
/// let close = ExecCall::Close { session: "s1".into() };
/// assert_eq!(serde_json::to_string(&close).unwrap(), r#"{"op":"close","session":"s1"}"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ExecCall {
    /// Run code.
    Run(Box<ExecRequest>),
    /// List the caller's sessions; with `usage`, what each one's sandbox
    /// uses (read from its cgroup as it is listed).
    Sessions {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        usage: bool,
    },
    /// Open a session without running code.
    Open(Box<SessionOpen>),
    /// Set or clear a session's lifetime.
    Lifetime {
        /// The session.
        session: String,
        /// From now, and what then; `None`: none.
        #[serde(flatten, with = "super::session_open::lifetime_fields")]
        lifetime: Option<Lifetime>,
    },
    /// End a session and delete its workspace.
    Close {
        /// The session.
        session: String,
    },
    /// Save a session's files (its `/workspace` and its home, with the
    /// packages it installed) under a name, in the kernel's store.
    Snapshot {
        /// The session.
        session: String,
        /// The snapshot's name.
        name: String,
        /// Also save the interpreter's picklable globals.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        state: bool,
    },
    /// Replace a session's files with a snapshot's and restart its
    /// interpreter (with the snapshot's globals, if it saved them); or,
    /// `into` a new session, branch.
    Restore {
        /// The session the snapshot was taken of.
        session: String,
        /// The snapshot's name.
        name: String,
        /// A new session to restore into, instead of `session`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        into: Option<String>,
    },
    /// Remove one of a session's snapshots.
    RemoveSnapshot {
        /// The session.
        session: String,
        /// The snapshot's name.
        name: String,
    },
    /// List a session's snapshots.
    Snapshots {
        /// The session.
        session: String,
    },
    /// List the templates the caller may use.
    Templates,
    /// Build a template: pip installs `packages` and `requirements` into
    /// a new environment, in a sandbox whose network is the index alone.
    #[serde(rename = "build_template")]
    BuildTemplate {
        /// Its name.
        template: String,
        /// Packages to install (requirement specifiers).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        packages: Vec<String>,
        /// A requirements file's text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        requirements: Option<String>,
        /// The build's wall-clock limit, in milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Remove a template the caller built.
    RemoveTemplate {
        /// Its name.
        template: String,
    },
    /// List the caller's volumes, and those it was given.
    Volumes,
    /// Make a volume of the caller's own.
    #[serde(rename = "create_volume")]
    CreateVolume {
        /// Its name.
        volume: String,
        /// Its size (left out: `exec.volume_bytes`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
    /// Remove a volume of the caller's own, and its files.
    RemoveVolume {
        /// Its name.
        volume: String,
    },
    /// A process op: `start`, `processes`, `output`, `input`, `signal`
    /// or `resize` (its own `op`).
    #[serde(untagged)]
    Proc(ProcCall),
    /// A file op: `stat`, `list`, `mkdir`, `move`, `remove`, `read`,
    /// `write`, `watch`, `events` or `unwatch` (its own `op`).
    #[serde(untagged)]
    Files(FileCall),
}

/// The operations of EXEC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
enum ExecOp {
    #[default]
    Run,
    Sessions,
    Open,
    Lifetime,
    Close,
    Snapshot,
    Restore,
    RemoveSnapshot,
    Snapshots,
    Templates,
    BuildTemplate,
    RemoveTemplate,
    Volumes,
    CreateVolume,
    RemoveVolume,
    Start,
    Processes,
    Output,
    Input,
    Signal,
    Resize,
    Stat,
    List,
    Mkdir,
    Move,
    Remove,
    Read,
    Write,
    Watch,
    Events,
    Unwatch,
}

impl ExecOp {
    /// The fields it takes beside `op` (a run's are its own struct's).
    fn fields(self) -> &'static [&'static str] {
        match self {
            ExecOp::Run | ExecOp::Templates | ExecOp::Volumes => &[],
            ExecOp::Sessions => &["usage"],
            // Their own wire structs name what they take.
            ExecOp::Open | ExecOp::Lifetime => &[],
            ExecOp::Start
            | ExecOp::Processes
            | ExecOp::Output
            | ExecOp::Input
            | ExecOp::Signal
            | ExecOp::Resize => &[],
            ExecOp::Stat
            | ExecOp::List
            | ExecOp::Mkdir
            | ExecOp::Move
            | ExecOp::Remove
            | ExecOp::Read
            | ExecOp::Write
            | ExecOp::Watch
            | ExecOp::Events
            | ExecOp::Unwatch => &[],
            ExecOp::Close | ExecOp::Snapshots => &["session"],
            ExecOp::Snapshot => &["session", "name", "state"],
            ExecOp::Restore => &["session", "name", "into"],
            ExecOp::RemoveSnapshot => &["session", "name"],
            ExecOp::BuildTemplate => &["template", "packages", "requirements", "timeout_ms"],
            ExecOp::RemoveTemplate => &["template"],
            ExecOp::CreateVolume => &["volume", "bytes"],
            ExecOp::RemoveVolume => &["volume"],
        }
    }

    /// `bad_request` naming the first field of `value` that `self` does
    /// not take: one another op takes is refused as an unknown one is,
    /// never ignored.
    fn only_its_fields(self, value: &serde_json::Value) -> Result<(), ErrorReply> {
        let Some(fields) = value.as_object() else {
            return Ok(());
        };
        let takes = self.fields();
        let Some(other) = fields
            .keys()
            .find(|k| *k != "op" && !takes.contains(&k.as_str()))
        else {
            return Ok(());
        };
        let op = value
            .get("op")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("run");
        let takes = match takes {
            [] => "no other field".to_owned(),
            takes => takes
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        Err(bad_request(format!(
            "EXEC field `{other}` is not one op {op:?} takes (it takes {takes})"
        )))
    }
}

/// Which operation a payload asks for (its other fields are each
/// operation's own business).
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
struct OpOnly {
    #[serde(default)]
    op: ExecOp,
}

/// The fields of a session operation.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct OpWire {
    #[serde(rename = "op")]
    _op: ExecOp,
    session: Option<String>,
    name: Option<String>,
    template: Option<String>,
    #[serde(default)]
    packages: Vec<String>,
    requirements: Option<String>,
    timeout_ms: Option<u64>,
    volume: Option<String>,
    bytes: Option<u64>,
    state: Option<bool>,
    usage: Option<bool>,
    into: Option<String>,
}

impl ExecCall {
    /// Parses and validates an EXEC payload of any `op`.
    ///
    /// ```
    /// use agentos_proto::payload::ExecCall;
    /// let call = ExecCall::parse(br#"{"op":"close","session":"s1"}"#).unwrap();
    /// assert_eq!(call, ExecCall::Close { session: "s1".into() });
    /// ```
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let value: serde_json::Value = parse_json("EXEC", payload)?;
        let OpOnly { op } = super::parse::peek("EXEC", value.clone())?;
        let fields = |value: serde_json::Value| -> Result<OpWire, ErrorReply> {
            op.only_its_fields(&value)?;
            super::parse::from_value("EXEC", value)
        };
        Ok(match op {
            ExecOp::Run => ExecCall::Run(Box::new(ExecRequest::from_wire(
                super::parse::from_value("EXEC", value)?,
            )?)),
            ExecOp::Sessions => ExecCall::Sessions {
                usage: fields(value)?.usage.unwrap_or(false),
            },
            ExecOp::Open => {
                let wire: OpenWire = super::parse::from_value("EXEC", value)?;
                ExecCall::Open(Box::new(wire.open()?))
            }
            ExecOp::Lifetime => {
                let wire: LifetimeWire = super::parse::from_value("EXEC", value)?;
                let (session, lifetime) = wire.lifetime()?;
                ExecCall::Lifetime { session, lifetime }
            }
            ExecOp::Close => ExecCall::Close {
                session: fields(value)?.session()?,
            },
            ExecOp::Snapshot => {
                let fields = fields(value)?;
                ExecCall::Snapshot {
                    session: fields.session()?,
                    name: fields.name()?,
                    state: fields.state.unwrap_or(false),
                }
            }
            ExecOp::Restore => {
                let fields = fields(value)?;
                if let Some(into) = &fields.into {
                    validate_name("into", into)?;
                }
                ExecCall::Restore {
                    session: fields.session()?,
                    name: fields.name()?,
                    into: fields.into,
                }
            }
            ExecOp::RemoveSnapshot => {
                let fields = fields(value)?;
                ExecCall::RemoveSnapshot {
                    session: fields.session()?,
                    name: fields.name()?,
                }
            }
            ExecOp::Snapshots => ExecCall::Snapshots {
                session: fields(value)?.session()?,
            },
            ExecOp::Templates => {
                fields(value)?;
                ExecCall::Templates
            }
            ExecOp::BuildTemplate => fields(value)?.build()?,
            ExecOp::RemoveTemplate => ExecCall::RemoveTemplate {
                template: fields(value)?.template()?,
            },
            ExecOp::Volumes => {
                fields(value)?;
                ExecCall::Volumes
            }
            ExecOp::CreateVolume => {
                let fields = fields(value)?;
                ExecCall::CreateVolume {
                    volume: fields.volume()?,
                    bytes: fields.bytes,
                }
            }
            ExecOp::RemoveVolume => ExecCall::RemoveVolume {
                volume: fields(value)?.volume()?,
            },
            ExecOp::Start => ExecCall::Proc(ProcOp::Start.parse(value)?),
            ExecOp::Processes => ExecCall::Proc(ProcOp::Processes.parse(value)?),
            ExecOp::Output => ExecCall::Proc(ProcOp::Output.parse(value)?),
            ExecOp::Input => ExecCall::Proc(ProcOp::Input.parse(value)?),
            ExecOp::Signal => ExecCall::Proc(ProcOp::Signal.parse(value)?),
            ExecOp::Resize => ExecCall::Proc(ProcOp::Resize.parse(value)?),
            ExecOp::Stat => ExecCall::Files(FileOp::Stat.parse(value)?),
            ExecOp::List => ExecCall::Files(FileOp::List.parse(value)?),
            ExecOp::Mkdir => ExecCall::Files(FileOp::Mkdir.parse(value)?),
            ExecOp::Move => ExecCall::Files(FileOp::Move.parse(value)?),
            ExecOp::Remove => ExecCall::Files(FileOp::Remove.parse(value)?),
            ExecOp::Read => ExecCall::Files(FileOp::Read.parse(value)?),
            ExecOp::Write => ExecCall::Files(FileOp::Write.parse(value)?),
            ExecOp::Watch => ExecCall::Files(FileOp::Watch.parse(value)?),
            ExecOp::Events => ExecCall::Files(FileOp::Events.parse(value)?),
            ExecOp::Unwatch => ExecCall::Files(FileOp::Unwatch.parse(value)?),
        })
    }
}

impl OpWire {
    /// The session an op names.
    fn session(&self) -> Result<String, ErrorReply> {
        let session = self.session.clone().ok_or_else(|| {
            bad_request("EXEC field `session` is missing: this op names a session")
        })?;
        validate_name("session", &session)?;
        Ok(session)
    }

    /// The template an op names.
    fn template(&self) -> Result<String, ErrorReply> {
        let template = self.template.clone().ok_or_else(|| {
            bad_request("EXEC field `template` is missing: this op names a template")
        })?;
        validate_name("template", &template)?;
        Ok(template)
    }

    /// The volume an op names.
    fn volume(&self) -> Result<String, ErrorReply> {
        let volume = self
            .volume
            .clone()
            .ok_or_else(|| bad_request("EXEC field `volume` is missing: this op names a volume"))?;
        validate_name("volume", &volume)?;
        Ok(volume)
    }

    /// A `build_template`, its packages and requirements checked.
    fn build(self) -> Result<ExecCall, ErrorReply> {
        let template = self.template()?;
        super::templates::check_build(&self.packages, self.requirements.as_deref())?;
        check_timeout(self.timeout_ms)?;
        Ok(ExecCall::BuildTemplate {
            template,
            packages: self.packages,
            requirements: self.requirements,
            timeout_ms: self.timeout_ms,
        })
    }

    /// The snapshot an op names.
    fn name(&self) -> Result<String, ErrorReply> {
        let name = self
            .name
            .clone()
            .ok_or_else(|| bad_request("EXEC field `name` is missing: this op names a snapshot"))?;
        validate_name("name", &name)?;
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::payload::exec_reply::ExecReply;
    use crate::payload::exec_run::Language;
    use crate::payload::session_open::MAX_LIFETIME_MS;
    use crate::payload::sessions::LifetimeEnd;

    #[test]
    fn an_op_refuses_a_field_only_another_op_takes_by_name() {
        let cases: [&[u8]; 6] = [
            br#"{"op":"close","session":"s1","volume":"v"}"#,
            br#"{"op":"snapshot","session":"s1","name":"n","into":"b"}"#,
            br#"{"op":"restore","session":"s1","name":"n","state":true}"#,
            br#"{"op":"sessions","session":"s1"}"#,
            br#"{"op":"create_volume","volume":"v","packages":["six"]}"#,
            br#"{"op":"remove_template","template":"t","timeout_ms":5}"#,
        ];
        for payload in cases {
            let err = ExecCall::parse(payload).unwrap_err();
            let text = String::from_utf8_lossy(payload);
            assert_eq!(err.code, ErrorCode::BadRequest, "{text}");
            assert!(err.error.contains("is not one op"), "{text}: {}", err.error);
        }
        let err = ExecCall::parse(br#"{"op":"close","session":"s1","volume":"v"}"#).unwrap_err();
        assert!(err.error.contains("`volume`"), "{}", err.error);
        assert!(err.error.contains("`session`"), "{}", err.error);
        let ok = ExecCall::parse(br#"{"op":"restore","session":"s1","name":"n","into":"b"}"#);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn a_build_names_its_fields_exactly_and_asks_for_something() {
        let misspelt = br#"{"op":"build_template","template":"t","packges":["six"]}"#;
        let err = ExecCall::parse(misspelt).unwrap_err();
        assert!(err.error.contains("packges"), "{}", err.error);
        let empty = br#"{"op":"build_template","template":"t"}"#;
        assert!(ExecCall::parse(empty).unwrap_err().error.contains("needs"));
        let path = br#"{"op":"remove_template","template":"../x"}"#;
        assert!(ExecCall::parse(path).is_err());
        let call = ExecCall::parse(br#"{"op":"build_template","template":"t","packages":["six"]}"#);
        assert!(
            matches!(call, Ok(ExecCall::BuildTemplate { .. })),
            "{call:?}"
        );
    }
    use crate::error::ErrorCode;

    fn refused(json: &str) -> ErrorReply {
        ExecCall::parse(json.as_bytes()).unwrap_err()
    }

    #[test]
    fn out_of_range_timeouts_and_bad_sessions_are_bad_requests_naming_the_field() {
        for json in [
            r#"{"code":"x","timeout_ms":0}"#,
            r#"{"code":"x","timeout_ms":99999999999}"#,
        ] {
            let err = refused(json);
            assert_eq!(err.code, ErrorCode::BadRequest, "{json}");
            assert!(err.error.contains("timeout_ms"), "{}", err.error);
        }
        assert!(ExecRequest::parse(br#"{"code":"x","session":"../s"}"#).is_err());
    }

    #[test]
    fn an_unknown_language_is_named() {
        let err = refused(r#"{"code":"x","language":"ruby"}"#);
        assert_eq!(err.code, ErrorCode::BadRequest);
        assert!(err.error.contains("language"), "{}", err.error);
    }

    #[test]
    fn the_clove_shell_form_is_bash_in_milliseconds_with_unknown_fields_ignored() {
        let call = ExecCall::parse(
            br#"{"command":"ls -la","cwd":"/tmp","timeout":30,"async":false,"request_id":7}"#,
        )
        .unwrap();
        let ExecCall::Run(request) = call else {
            panic!("not a run: {call:?}");
        };
        assert_eq!(request.language, Language::Bash);
        assert_eq!(request.code, "ls -la");
        assert_eq!(request.timeout_ms, Some(30_000));
        assert_eq!(request.cwd.as_deref(), Some("/tmp"));
        assert!(ExecRequest::parse(br#"{"command":"ls","async":true}"#).is_ok());
    }

    #[test]
    fn files_and_collect_stay_under_the_workspace() {
        for path in [
            "../x",
            "/etc/passwd",
            "a/../../b",
            "",
            "a/./b/..",
            "x\u{0}y",
        ] {
            for field in ["files", "collect"] {
                let json = if field == "files" {
                    serde_json::json!({"code": "x", "files": {path: "aGk="}})
                } else {
                    serde_json::json!({"code": "x", "collect": [path]})
                };
                let err = refused(&json.to_string());
                assert_eq!(err.code, ErrorCode::BadRequest, "{path:?}");
                assert!(err.error.contains(field), "{}", err.error);
            }
        }
        let ok = ExecCall::parse(
            br#"{"code":"x","files":{"data/in.csv":"aGk="},"collect":["out.png"]}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn session_operations_name_what_they_miss() {
        assert_eq!(
            ExecCall::parse(br#"{"op":"sessions"}"#).unwrap(),
            ExecCall::Sessions { usage: false }
        );
        assert_eq!(
            ExecCall::parse(br#"{"op":"sessions","usage":true}"#).unwrap(),
            ExecCall::Sessions { usage: true }
        );
        assert!(ExecCall::parse(br#"{"op":"sessions","usage":1}"#).is_err());
        assert!(ExecCall::parse(br#"{"op":"sessions","session":"s1"}"#).is_err());
        assert_eq!(
            ExecCall::parse(br#"{"op":"restore","session":"s1","name":"before"}"#).unwrap(),
            ExecCall::Restore {
                session: "s1".into(),
                name: "before".into(),
                into: None,
            }
        );
        assert_eq!(
            ExecCall::parse(br#"{"op":"restore","session":"s1","name":"n","into":"b1"}"#).unwrap(),
            ExecCall::Restore {
                session: "s1".into(),
                name: "n".into(),
                into: Some("b1".into()),
            }
        );
        assert!(
            refused(r#"{"op":"restore","session":"s1","name":"n","into":"a/b"}"#)
                .error
                .contains("into")
        );
        assert!(
            refused(r#"{"op":"snapshot","session":"s1","name":"n","state":1}"#)
                .error
                .contains("state")
        );
        assert!(refused(r#"{"op":"close"}"#).error.contains("session"));
        assert!(refused(r#"{"op":"snapshot","session":"s1"}"#)
            .error
            .contains("name"));
        assert!(refused(r#"{"op":"snapshot","session":"s1","name":"../x"}"#)
            .error
            .contains("name"));
        assert!(refused(r#"{"op":"launch"}"#).error.contains("op"));
    }

    #[test]
    fn run_limits_are_checked_and_take_no_period() {
        let err = refused(r#"{"code":"x","limits":{"max_pids":0}}"#);
        assert!(err.error.contains("limits.max_pids"), "{}", err.error);
        let err = refused(r#"{"code":"x","limits":{"cpu_period":100000}}"#);
        assert!(err.error.contains("cpu_period"), "{}", err.error);
    }

    #[test]
    fn the_reply_has_every_field_of_the_contract() {
        let reply = serde_json::to_value(ExecReply::default()).unwrap();
        for field in [
            "success",
            "stdout",
            "stderr",
            "exit_code",
            "signal",
            "error",
            "duration_ms",
            "timed_out",
            "oom_killed",
            "truncated",
            "tool_calls",
            "tool_bytes",
            "files",
            "session",
        ] {
            assert!(reply.get(field).is_some(), "{field} missing from {reply}");
        }
        assert!(reply.get("code").is_none());
    }

    fn open(json: &str) -> Result<SessionOpen, ErrorReply> {
        match ExecCall::parse(json.as_bytes())? {
            ExecCall::Open(open) => Ok(*open),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn open_takes_a_runs_session_fields_and_its_setup() {
        let opened = open(
            r#"{"op":"open","session":"sb1","template":"t","network":false,
                "limits":{"memory":1048576},"env":{"E2B_SANDBOX":"true"},
                "labels":{"e2b.template":"base"},"lifetime_ms":300000,"then":"hibernate"}"#,
        )
        .unwrap();
        assert_eq!(opened.run.session.as_deref(), Some("sb1"));
        assert_eq!(opened.run.code, "");
        assert_eq!(opened.setup.env["E2B_SANDBOX"], "true");
        assert_eq!(opened.setup.labels.unwrap()["e2b.template"], "base");
        let lifetime = opened.setup.lifetime.unwrap();
        assert_eq!(
            (lifetime.ms, lifetime.then),
            (300_000, LifetimeEnd::Hibernate)
        );
    }

    #[test]
    fn open_refuses_what_a_session_cannot_be_given_by_name() {
        let many: BTreeMap<String, String> =
            (0..33).map(|n| (format!("k{n}"), "v".into())).collect();
        let many = serde_json::to_string(&many).unwrap();
        let big = format!(r#"{{"k":"{}"}}"#, "v".repeat(5000));
        for (json, names) in [
            (r#"{"op":"open"}"#.to_owned(), "`session`"),
            (r#"{"op":"open","session":"../x"}"#.to_owned(), "session"),
            (
                r#"{"op":"open","session":"s","code":"1"}"#.to_owned(),
                "`code`",
            ),
            (
                r#"{"op":"open","session":"s","lifetime_ms":0}"#.to_owned(),
                "lifetime_ms",
            ),
            (
                format!(
                    r#"{{"op":"open","session":"s","lifetime_ms":{}}}"#,
                    MAX_LIFETIME_MS + 1
                ),
                "lifetime_ms",
            ),
            (
                r#"{"op":"open","session":"s","then":"close"}"#.to_owned(),
                "`then`",
            ),
            (
                r#"{"op":"open","session":"s","lifetime_ms":5,"then":"explode"}"#.to_owned(),
                "then",
            ),
            (
                r#"{"op":"open","session":"s","env":{"A=B":"x"}}"#.to_owned(),
                "`env`",
            ),
            (
                r#"{"op":"open","session":"s","env":{"A":"x\u0000"}}"#.to_owned(),
                "`env`",
            ),
            (
                r#"{"op":"open","session":"s","env":{"AGENTOS_SOCKET":"x"}}"#.to_owned(),
                "AGENTOS_",
            ),
            (
                format!(r#"{{"op":"open","session":"s","labels":{many}}}"#),
                "33 labels",
            ),
            (
                format!(r#"{{"op":"open","session":"s","labels":{big}}}"#),
                "bytes",
            ),
            (
                r#"{"op":"open","session":"s","labels":{"a\nb":"x"}}"#.to_owned(),
                "`labels`",
            ),
            (
                r#"{"op":"open","session":"s","labels":{"a":"\u0007"}}"#.to_owned(),
                "`labels`",
            ),
        ] {
            let refused = ExecCall::parse(json.as_bytes()).unwrap_err();
            assert_eq!(refused.code.as_str(), "bad_request", "{json}");
            assert!(refused.error.contains(names), "{json}: {}", refused.error);
        }
    }

    #[test]
    fn open_and_lifetime_serialise_to_what_parses_back() {
        let call = ExecCall::parse(
            br#"{"op":"open","session":"sb1","env":{"A":"b"},"labels":{"k":"v"},
                "lifetime_ms":5000,"then":"hibernate","network":false}"#,
        )
        .unwrap();
        let json = serde_json::to_vec(&call).unwrap();
        assert_eq!(ExecCall::parse(&json).unwrap(), call);
        for lifetime in [
            None,
            Some(Lifetime {
                ms: 9,
                then: LifetimeEnd::Close,
            }),
        ] {
            let call = ExecCall::Lifetime {
                session: "s".into(),
                lifetime,
            };
            let json = serde_json::to_vec(&call).unwrap();
            assert_eq!(ExecCall::parse(&json).unwrap(), call);
        }
    }

    #[test]
    fn lifetime_sets_or_clears_and_must_say_which() {
        let parse = |json: &str| ExecCall::parse(json.as_bytes());
        assert_eq!(
            parse(r#"{"op":"lifetime","session":"s","lifetime_ms":1000}"#).unwrap(),
            ExecCall::Lifetime {
                session: "s".into(),
                lifetime: Some(Lifetime {
                    ms: 1000,
                    then: LifetimeEnd::Close
                }),
            }
        );
        assert_eq!(
            parse(r#"{"op":"lifetime","session":"s","lifetime_ms":null}"#).unwrap(),
            ExecCall::Lifetime {
                session: "s".into(),
                lifetime: None,
            }
        );
        for json in [
            r#"{"op":"lifetime","session":"s"}"#,
            r#"{"op":"lifetime","session":"s","lifetime_ms":null,"then":"close"}"#,
            r#"{"op":"lifetime","lifetime_ms":5}"#,
            r#"{"op":"lifetime","session":"s","lifetime_ms":5,"labels":{}}"#,
        ] {
            assert!(parse(json).is_err(), "{json}");
        }
    }

    #[test]
    fn a_process_op_is_an_exec_call_that_serialises_to_its_own_op() {
        let json = br#"{"op":"signal","session":"sb1","tag":"t","signal":"SIGKILL"}"#;
        let call = ExecCall::parse(json).unwrap();
        assert!(matches!(call, ExecCall::Proc(_)), "{call:?}");
        let again = serde_json::to_vec(&call).unwrap();
        assert_eq!(ExecCall::parse(&again).unwrap(), call);
        let refused = ExecCall::parse(br#"{"op":"start","session":"s","argv":["sh"],"code":"1"}"#);
        assert!(refused.unwrap_err().error.contains("`code`"));
    }
}
