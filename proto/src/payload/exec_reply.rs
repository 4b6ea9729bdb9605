//! The reply to an EXEC run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::network::NetTotals;
use crate::error::ErrorReply;

/// How many bytes of output were cut from the middle of each stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Truncated {
    /// Bytes dropped from stdout.
    pub stdout: u64,
    /// Bytes dropped from stderr.
    pub stderr: u64,
}

/// The reply to an EXEC run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecReply {
    /// The code exited with status 0 and was not timed out.
    pub success: bool,
    /// Captured standard output (head and tail kept when capped).
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// The exit status, if the code ended by exiting.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// An uncaught exception's `Type: message`, or why the run failed.
    pub error: Option<String>,
    /// Wall-clock run time.
    pub duration_ms: u64,
    /// Whether the timeout stopped it.
    pub timed_out: bool,
    /// Whether the memory limit killed one of its processes.
    pub oom_killed: bool,
    /// Bytes cut from each stream.
    pub truncated: Truncated,
    /// Tool calls the code made.
    pub tool_calls: u64,
    /// Bytes those tool calls returned into the sandbox.
    pub tool_bytes: u64,
    /// The collected files: path to base64 content.
    pub files: BTreeMap<String, String>,
    /// The session the run used, if any.
    pub session: Option<String>,
    /// Its connections through the egress proxy, when a policy applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetTotals>,
    /// With `skip_if_not_code`: why the code was not run (it is not
    /// Python, or only states values). Absent when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_code: Option<String>,
    /// The machine word, when the run could not happen at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::error::ErrorCode>,
    /// A `build_template`'s template, once built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<super::templates::TemplateInfo>,
    /// The session was there (its files and packages on its disk), but
    /// its interpreter had ended (idle, a timeout, a restart of the
    /// kernel): this run started a fresh one, without the variables of
    /// earlier runs. Absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_interpreter: bool,
}

impl From<ErrorReply> for ExecReply {
    /// A refusal with EXEC's reply fields: no output, no exit code.
    fn from(refusal: ErrorReply) -> ExecReply {
        ExecReply {
            error: Some(refusal.error),
            code: Some(refusal.code),
            ..ExecReply::default()
        }
    }
}
