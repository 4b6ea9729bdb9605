//! EXEC (0x02) `run`: the code to run in a pooled sandbox, with what it
//! is given and may take back, checked as it is parsed.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::network::Network;
use super::parse::{bad_request, parse_json, validate_name};
use super::sessions::SessionSetup;
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

/// The one `op` a run's payload may name.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
enum RunOp {
    Run,
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
    /// Set by `open` (never on the wire): the run of no code that opens
    /// its session, and what the session is given besides.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub opens: Option<Box<SessionSetup>>,
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
pub(super) struct ExecWire {
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

    pub(super) fn from_wire(wire: ExecWire) -> Result<Self, ErrorReply> {
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
            opens: None,
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

/// Checks a run's or a build's `timeout_ms`.
pub(super) fn check_timeout(timeout_ms: Option<u64>) -> Result<(), ErrorReply> {
    match timeout_ms {
        Some(timeout) if !(1..=MAX_EXEC_TIMEOUT_MS).contains(&timeout) => Err(bad_request(
            format!("EXEC field `timeout_ms` is {timeout}, outside 1..={MAX_EXEC_TIMEOUT_MS}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
