//! The error model: every failed JSON reply carries a human sentence and a
//! stable machine word.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The stable machine word of a failed reply (`"code"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The payload is not valid for the opcode; the message names the field.
    BadRequest,
    /// The opcode is not one this kernel serves.
    UnknownOpcode,
    /// No such agent, task or session.
    NotFound,
    /// A live agent already has that name.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// A quota or limit was hit, or a requested limit is out of range.
    LimitExceeded,
    /// A queue is full; retry later.
    Busy,
    /// The work did not finish in time.
    Timeout,
    /// A subsystem is not configured, not built, or down.
    Unavailable,
    /// A kernel fault; the message says what failed.
    Internal,
    /// A tool reported an error of its own (TOOL); the message is its text.
    ToolError,
    /// Framing: the frame did not start with the magic. The connection closes.
    BadMagic,
    /// Framing: `payload_len` is over the limit. The connection closes.
    PayloadTooLarge,
    /// A task's result: the task was cancelled — by its owner, by an
    /// operator, or because its owner ended — before its work answered.
    Cancelled,
    /// A task's result: the task could not go on — it was running when the
    /// kernel stopped, or its agent ended with an earlier kernel.
    Interrupted,
    /// A code this version does not know (from a newer kernel).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// The wire word, e.g. `"bad_request"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownOpcode => "unknown_opcode",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::ToolError => "tool_error",
            ErrorCode::BadMagic => "bad_magic",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Interrupted => "interrupted",
            ErrorCode::Other => "other",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed JSON reply: `{"success":false,"error":"...","code":"..."}`.
///
/// ```
/// use agentos_proto::{ErrorCode, ErrorReply};
/// let reply = ErrorReply::new(ErrorCode::NotFound, "no agent named \"w1\"");
/// let json = serde_json::to_string(&reply).unwrap();
/// assert_eq!(json, r#"{"success":false,"error":"no agent named \"w1\"","code":"not_found"}"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorReply {
    /// Always `false`.
    pub success: bool,
    /// What was wrong and, where possible, how to fix it.
    pub error: String,
    /// The stable machine word.
    pub code: ErrorCode,
}

impl ErrorReply {
    /// A failure with the given code and message.
    pub fn new(code: ErrorCode, error: impl Into<String>) -> Self {
        ErrorReply {
            success: false,
            error: error.into(),
            code,
        }
    }

    /// The reply as JSON bytes, ready to be a frame payload.
    pub fn to_json(&self) -> Vec<u8> {
        to_json(self)
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.error, self.code)
    }
}

impl std::error::Error for ErrorReply {}

/// Serialises a reply to JSON bytes.
///
/// Serialising the protocol's own reply types cannot fail (string keys, no
/// non-finite floats reach them); should it ever, the result is an `internal`
/// error reply rather than a panic.
pub fn to_json<T: Serialize>(reply: &T) -> Vec<u8> {
    serde_json::to_vec(reply).unwrap_or_else(|err| {
        let fallback = ErrorReply::new(
            ErrorCode::Internal,
            format!("kernel could not encode its reply: {err}"),
        );
        serde_json::to_vec(&fallback).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_wire_words() {
        let all = [
            ErrorCode::BadRequest,
            ErrorCode::UnknownOpcode,
            ErrorCode::NotFound,
            ErrorCode::AlreadyExists,
            ErrorCode::PermissionDenied,
            ErrorCode::LimitExceeded,
            ErrorCode::Busy,
            ErrorCode::Timeout,
            ErrorCode::Unavailable,
            ErrorCode::Internal,
            ErrorCode::BadMagic,
            ErrorCode::PayloadTooLarge,
            ErrorCode::Cancelled,
            ErrorCode::Interrupted,
        ];
        for code in all {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
    }

    #[test]
    fn codes_from_newer_kernels_are_read_as_other() {
        let code: ErrorCode = serde_json::from_str("\"quota_melted\"").unwrap();
        assert_eq!(code, ErrorCode::Other);
    }
}
