//! READ (0x03) and WRITE (0x04): a file in the caller's own view of the
//! filesystem, as the Clove SDK's `read_file` and `write_file` send them.
//! Text only: what is read must be UTF-8, as what is written is.

use serde::{Deserialize, Serialize};

use super::exec_run::MAX_EXEC_PATH_LEN;
use super::parse::{bad_request, parse_json};
use crate::error::ErrorReply;

/// A READ request: `{"path": "/abs/path"}`.
///
/// ```
/// use agentos_proto::payload::ReadRequest;
/// assert!(ReadRequest::parse(br#"{"path":"/tmp/a.txt"}"#).is_ok());
/// assert!(ReadRequest::parse(br#"{"path":"a.txt"}"#).is_err());
/// assert!(ReadRequest::parse(br#"{"path":"/tmp/a","offset":3}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    /// The file, by absolute path in the caller's view.
    pub path: String,
}

impl ReadRequest {
    /// Parses a READ payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: ReadRequest = parse_json("READ", payload)?;
        check_path("READ", &request.path)?;
        Ok(request)
    }
}

/// How WRITE treats a file that exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Replace what it holds (the default).
    #[default]
    Write,
    /// Add to its end.
    Append,
}

/// A WRITE request: `{"path": "/abs/path", "content": "...", "mode":
/// "write"|"append"}`. Missing parent directories are made.
///
/// ```
/// use agentos_proto::payload::{WriteMode, WriteRequest};
/// let append = WriteRequest::parse(br#"{"path":"/tmp/a","content":"x","mode":"append"}"#).unwrap();
/// assert_eq!(append.mode, WriteMode::Append);
/// assert!(WriteRequest::parse(br#"{"path":"/tmp/a","content":"x","mode":"w+"}"#).is_err());
/// assert!(WriteRequest::parse(br#"{"path":"/tmp/a/","content":"x"}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    /// The file, by absolute path in the caller's view.
    pub path: String,
    /// What to write.
    pub content: String,
    /// `write` (the default) or `append`.
    #[serde(default)]
    pub mode: WriteMode,
}

impl WriteRequest {
    /// Parses a WRITE payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: WriteRequest = parse_json("WRITE", payload)?;
        check_path("WRITE", &request.path)?;
        if request.path.ends_with('/') {
            return Err(bad_request(
                "WRITE field `path`: it names a directory; name a file",
            ));
        }
        Ok(request)
    }
}

/// An absolute path without NUL, of a bounded length.
fn check_path(what: &str, path: &str) -> Result<(), ErrorReply> {
    if !path.starts_with('/') {
        return Err(bad_request(format!(
            "{what} field `path`: {path:?} is not absolute"
        )));
    }
    if path.len() > MAX_EXEC_PATH_LEN || path.contains('\0') {
        return Err(bad_request(format!(
            "{what} field `path`: at most {MAX_EXEC_PATH_LEN} bytes, without NUL"
        )));
    }
    Ok(())
}

/// READ's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReadReply {
    /// Always true.
    pub success: bool,
    /// The file's text.
    pub content: String,
    /// Its size in bytes.
    pub size: u64,
}

/// WRITE's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WriteReply {
    /// Always true.
    pub success: bool,
    /// Bytes written.
    pub bytes_written: u64,
}
