//! EXEC (0x02): run code in a pooled sandbox.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{bad_request, check_range, parse_json, validate_name};
use crate::ErrorReply;

/// The longest EXEC timeout a request may ask for (one hour).
pub const MAX_EXEC_TIMEOUT_MS: u64 = 3_600_000;

/// The language of EXEC code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python 3 (the default).
    #[default]
    Python,
    /// A bash script.
    Bash,
}

/// An EXEC request in its canonical form.
///
/// The wire also accepts the shell shorthand
/// `{"command": "ls -la", "cwd": "...", "timeout": 30}`, which [`parse`](Self::parse)
/// turns into `language: bash` with the timeout in milliseconds.
///
/// ```
/// use agentos_proto::payload::{ExecRequest, Language};
/// let request = ExecRequest::parse(br#"{"command":"ls","timeout":2}"#).unwrap();
/// assert_eq!(request.language, Language::Bash);
/// assert_eq!(request.timeout_ms, Some(2000));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The program text.
    pub code: String,
    /// `python` or `bash`.
    #[serde(default)]
    pub language: Language,
    /// Reuse this session's interpreter and `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Wall-clock limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Extra environment for the code.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// Everything the wire may carry, before the shorthand is resolved.
#[derive(Deserialize)]
struct ExecWire {
    code: Option<String>,
    language: Option<Language>,
    session: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    command: Option<String>,
    cwd: Option<String>,
    /// Seconds, for the `command` shorthand.
    timeout: Option<u64>,
}

impl ExecRequest {
    /// Parses and validates an EXEC payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let wire: ExecWire = parse_json("EXEC", payload)?;
        let (code, language) = match (wire.code, wire.command) {
            (Some(_), Some(_)) => {
                return Err(bad_request(
                    "EXEC takes either `code` or `command`, not both",
                ))
            }
            (None, None) => {
                return Err(bad_request(
                    "EXEC needs `code` (with `language`) or a shell `command`",
                ))
            }
            (Some(code), None) => (code, wire.language.unwrap_or_default()),
            (None, Some(command)) => (command, Language::Bash),
        };
        let request = ExecRequest {
            code,
            language,
            session: wire.session,
            timeout_ms: wire
                .timeout_ms
                .or(wire.timeout.map(|secs| secs.saturating_mul(1000))),
            env: wire.env,
            cwd: wire.cwd,
        };
        request.validate()?;
        Ok(request)
    }

    /// Checks the protocol's rules for an EXEC request.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        if let Some(session) = &self.session {
            validate_name("session", session)?;
        }
        check_range("timeout_ms", self.timeout_ms, 1, MAX_EXEC_TIMEOUT_MS)?;
        if let Some(key) = self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(bad_request(format!(
                "EXEC field `env`: {key:?} is not a valid variable name"
            )));
        }
        Ok(())
    }
}

/// How many bytes of output were cut from the middle of each stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    /// Bytes dropped from stdout.
    pub stdout: u64,
    /// Bytes dropped from stderr.
    pub stderr: u64,
}

/// The reply to EXEC; `success` is `exit_code == 0`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecReply {
    /// Whether the code exited with status 0.
    pub success: bool,
    /// Captured standard output (head and tail kept when capped).
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// The exit status, if the code ran.
    pub exit_code: Option<i32>,
    /// Wall-clock run time.
    pub duration_ms: u64,
    /// Whether the timeout stopped it.
    pub timed_out: bool,
    /// Bytes cut from each stream.
    pub truncated: Truncated,
    /// Tool calls the code made.
    pub tool_calls: u64,
    /// Bytes those tool calls returned into the sandbox.
    pub tool_bytes: u64,
    /// Why the request failed before or outside the code, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The machine word of such a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::ErrorCode>,
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
        assert!(ExecRequest::parse(br#"{"session":"s"}"#).is_err());
    }

    #[test]
    fn out_of_range_timeout_and_bad_session_are_refused() {
        let err = ExecRequest::parse(br#"{"code":"x","timeout_ms":0}"#).unwrap_err();
        assert!(err.error.contains("timeout_ms"), "{}", err.error);
        assert!(ExecRequest::parse(br#"{"code":"x","session":"../s"}"#).is_err());
    }
}
