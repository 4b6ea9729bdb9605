//! EXEC (0x02): run code in a pooled sandbox, and manage sessions and
//! their snapshots. The request's `op` (default `run`) picks which.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::network::Network;
use super::parse::{bad_request, parse_json, validate_name};
use super::spawn::Limits;
use super::volumes::VolumeMount;
use crate::error::ErrorReply;

/// The longest EXEC timeout a request may ask for (one hour).
pub const MAX_EXEC_TIMEOUT_MS: u64 = 3_600_000;
/// Most files one request may bring in or collect.
pub const MAX_EXEC_FILES: usize = 256;
/// Longest path of a file brought in or collected.
pub const MAX_EXEC_PATH_LEN: usize = 1024;

/// The language of EXEC code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python 3 (the default).
    #[default]
    Python,
    /// A bash script.
    Bash,
}

/// An EXEC `run` request in its canonical form.
///
/// The wire also accepts the Clove SDK's shell form
/// `{"command": "ls -la", "cwd": "...", "timeout": 30, "async": false,
/// "request_id": "..."}`, which [`parse`](Self::parse) turns into
/// `language: bash` with the timeout in milliseconds. Those are the only
/// fields beyond the protocol's that a run accepts; any other unknown field
/// is refused, naming it.
///
/// ```
/// use agentos_proto::payload::{ExecRequest, Language};
/// let request = ExecRequest::parse(br#"{"command":"ls","timeout":2}"#).unwrap();
/// assert_eq!(request.language, Language::Bash);
/// assert_eq!(request.timeout_ms, Some(2000));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecRequest {
    /// The program text.
    pub code: String,
    /// `python` or `bash`.
    #[serde(default)]
    pub language: Language,
    /// Start from this template (a read-only environment built before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Reuse this session's interpreter and `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Volumes mounted into the run (a session's: when its interpreter
    /// starts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Wall-clock limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Extra environment for the code.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Files written under `/workspace` before the run: relative path to
    /// base64 content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Files under `/workspace` returned after the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collect: Vec<String>,
    /// Limits for this run, within the caller's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// What the run's own kernel connection may do beyond TOOL and THINK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<RunPermissions>,
    /// What the run may reach, as SPAWN's `network` (left out: the
    /// kernel's default, within the caller's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// A W3C `traceparent` the run's span joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Python only: a last statement that is a bare expression has its
    /// value printed, as the interactive interpreter does (`None` prints
    /// nothing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub print_last_expression: bool,
    /// Python only: code that does not parse, or only states values (a
    /// literal, a name, an annotation), is not run; the reply's `not_code`
    /// says why.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_if_not_code: bool,
}

/// What a run's own kernel connection may do beyond TOOL and THINK, as an
/// EXEC request asks for it. A field left out is the default: `think` and
/// `tools` as the caller has them, `spawn`, `exec` and `task` not at all,
/// and no token budget of the run's own (it draws on the caller's).
///
/// ```
/// use agentos_proto::payload::ExecRequest;
/// let request = ExecRequest::parse(
///     br#"{"code":"print(1)","permissions":{"spawn":true,"tools":["time.*"]}}"#,
/// ).unwrap();
/// assert_eq!(request.permissions.unwrap().spawn, Some(true));
/// assert!(ExecRequest::parse(br#"{"code":"1","permissions":{"thnk":false}}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunPermissions {
    /// May SPAWN agents (sandboxed, within the run's own limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<bool>,
    /// May EXEC runs of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<bool>,
    /// May dispatch TASKs of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<bool>,
    /// May THINK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think: Option<bool>,
    /// LLM tokens of its own, carved out of the caller's budget (0: none of
    /// its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_tokens: Option<u64>,
    /// The tools it may call (`server.tool` patterns), within the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// Everything a `run` may carry on the wire, before the shell form is
/// resolved.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct ExecWire {
    /// `run`, or left out.
    #[serde(default, rename = "op")]
    _op: Option<RunOp>,
    code: Option<String>,
    language: Option<Language>,
    session: Option<String>,
    template: Option<String>,
    #[serde(default)]
    volumes: Vec<VolumeMount>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    files: BTreeMap<String, String>,
    #[serde(default)]
    collect: Vec<String>,
    limits: Option<Limits>,
    permissions: Option<RunPermissions>,
    network: Option<Network>,
    trace: Option<String>,
    #[serde(default)]
    print_last_expression: bool,
    #[serde(default)]
    skip_if_not_code: bool,
    command: Option<String>,
    cwd: Option<String>,
    /// Seconds, for the shell form.
    timeout: Option<u64>,
    /// Clove's asynchronous mode, which the EXEC syscall reads itself
    /// (`AsyncAsk`): the run is the same.
    #[serde(rename = "async")]
    _asynchronous: Option<bool>,
    /// Clove's id for an asynchronous request (`AsyncAsk`).
    #[serde(default, rename = "request_id")]
    _request_id: Option<serde_json::Value>,
}

impl ExecRequest {
    /// Parses and validates an EXEC `run` payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let wire: ExecWire = parse_json("EXEC", payload)?;
        Self::from_wire(wire)
    }

    fn from_wire(wire: ExecWire) -> Result<Self, ErrorReply> {
        let (code, language) = match (wire.code, wire.command) {
            (Some(_), Some(_)) => {
                return Err(bad_request(
                    "EXEC takes either `code` or `command`, not both",
                ))
            }
            (None, None) => {
                return Err(bad_request(
                    "EXEC field `code` is missing: give `code` (with `language`) or a shell \
                     `command`",
                ))
            }
            (Some(code), None) => (code, wire.language.unwrap_or_default()),
            (None, Some(command)) => (command, Language::Bash),
        };
        let request = ExecRequest {
            code,
            language,
            session: wire.session,
            template: wire.template,
            volumes: wire.volumes,
            timeout_ms: wire
                .timeout_ms
                .or(wire.timeout.map(|secs| secs.saturating_mul(1000))),
            env: wire.env,
            cwd: wire.cwd,
            files: wire.files,
            collect: wire.collect,
            limits: wire.limits,
            permissions: wire.permissions,
            network: wire.network,
            trace: wire.trace,
            print_last_expression: wire.print_last_expression,
            skip_if_not_code: wire.skip_if_not_code,
        };
        request.validate()?;
        Ok(request)
    }

    /// Checks the protocol's rules for an EXEC `run` request.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        if let Some(session) = &self.session {
            validate_name("session", session)?;
        }
        if let Some(template) = &self.template {
            validate_name("template", template)?;
        }
        super::volumes::check_mounts("EXEC", "volumes", &self.volumes)?;
        check_timeout(self.timeout_ms)?;
        if let Some(key) = self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(bad_request(format!(
                "EXEC field `env`: {key:?} is not a valid variable name"
            )));
        }
        if let Some(key) = self
            .env
            .iter()
            .find(|(_, v)| v.contains('\0'))
            .map(|(k, _)| k)
        {
            return Err(bad_request(format!(
                "EXEC field `env`: the value of {key:?} contains a NUL byte"
            )));
        }
        if self.language == Language::Bash {
            let python_only = [
                ("print_last_expression", self.print_last_expression),
                ("skip_if_not_code", self.skip_if_not_code),
            ];
            if let Some((field, _)) = python_only.iter().find(|(_, set)| *set) {
                return Err(bad_request(format!(
                    "EXEC field `{field}` is for Python code, and this run is bash"
                )));
            }
        }
        if let Some(cwd) = &self.cwd {
            if cwd.contains('\0') {
                return Err(bad_request("EXEC field `cwd` contains a NUL byte"));
            }
        }
        check_paths("files", self.files.keys().map(String::as_str))?;
        check_paths("collect", self.collect.iter().map(String::as_str))?;
        if let Some(limits) = &self.limits {
            if limits.cpu_period.is_some() {
                return Err(bad_request(
                    "EXEC field `limits.cpu_period`: a run's CPU limit is `cpu_quota` per the \
                     kernel's period",
                ));
            }
            limits.validate()?;
        }
        if let Some(tools) = self.permissions.as_ref().and_then(|p| p.tools.as_ref()) {
            super::spawn::check_tool_patterns("EXEC field `permissions.tools`", tools)?;
        }
        Ok(())
    }
}

/// Checks the paths of `files` or `collect`: relative to `/workspace`,
/// plain names only — no `..`, no absolute path, nothing empty.
fn check_paths<'a>(
    field: &str,
    paths: impl ExactSizeIterator<Item = &'a str>,
) -> Result<(), ErrorReply> {
    if paths.len() > MAX_EXEC_FILES {
        return Err(bad_request(format!(
            "EXEC field `{field}` names {} files; at most {MAX_EXEC_FILES}",
            paths.len()
        )));
    }
    for path in paths {
        let plain = !path.is_empty()
            && path.len() <= MAX_EXEC_PATH_LEN
            && !path.contains('\0')
            && Path::new(path)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(bad_request(format!(
                "EXEC field `{field}`: {path:?} is not a path under /workspace (relative, \
                 without `..`, at most {MAX_EXEC_PATH_LEN} bytes)"
            )));
        }
    }
    Ok(())
}

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
    /// List the caller's sessions.
    Sessions,
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
}

/// The operations of EXEC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
enum ExecOp {
    #[default]
    Run,
    Sessions,
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
}

impl ExecOp {
    /// The fields it takes beside `op` (a run's are its own struct's).
    fn fields(self) -> &'static [&'static str] {
        match self {
            ExecOp::Run | ExecOp::Sessions | ExecOp::Templates | ExecOp::Volumes => &[],
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

/// The one `op` a run's payload may name.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
enum RunOp {
    Run,
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
            ExecOp::Sessions => {
                fields(value)?;
                ExecCall::Sessions
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
        })
    }
}

/// Checks a run's or a build's `timeout_ms`.
fn check_timeout(timeout_ms: Option<u64>) -> Result<(), ErrorReply> {
    match timeout_ms {
        Some(timeout) if !(1..=MAX_EXEC_TIMEOUT_MS).contains(&timeout) => Err(bad_request(
            format!("EXEC field `timeout_ms` is {timeout}, outside 1..={MAX_EXEC_TIMEOUT_MS}"),
        )),
        _ => Ok(()),
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
    use crate::payload::exec_reply::ExecReply;

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
    fn code_defaults_to_python() {
        let request = ExecRequest::parse(br#"{"code":"print(1)"}"#).unwrap();
        assert_eq!(request.language, Language::Python);
        assert_eq!(request.code, "print(1)");
    }

    #[test]
    fn code_and_command_together_or_neither_are_refused() {
        assert!(ExecRequest::parse(br#"{"code":"x","command":"y"}"#).is_err());
        let err = ExecRequest::parse(br#"{"session":"s"}"#).unwrap_err();
        assert!(err.error.contains("`code`"), "{}", err.error);
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
            ExecCall::Sessions
        );
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
}
