//! `agentos://` URIs: what each names, reading one a client sent (and
//! refusing any that could reach outside what it names), and writing one.

use agentos_proto::payload::{validate_name, MAX_EXEC_PATH_LEN};
use agentos_proto::ErrorReply;

const SCHEME: &str = "agentos://";

/// The longest URI read: a session name and the longest path the kernel
/// collects, percent-encoded, fit well within it.
const MAX_URI_BYTES: usize = 4096;

pub const LOG_TEMPLATE: &str = "agentos://agents/{name}/log";
pub const FILE_TEMPLATE: &str = "agentos://sessions/{session}/{+path}";
pub const RESULT_TEMPLATE: &str = "agentos://tasks/{task_id}/result";

/// What an `agentos://` URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceUri {
    /// `agentos://agents/{name}/log`
    AgentLog { name: String },
    /// `agentos://sessions/{session}/{path}`: `path` under `/workspace`.
    SessionFile { session: String, path: String },
    /// `agentos://tasks/{task_id}/result`
    TaskResult { task_id: String },
}

/// Why a URI names no resource of this server. A URI or path in a
/// message is its start only (see [`quoted_start`]), quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("the URI is {0} bytes; at most {MAX_URI_BYTES}")]
    TooLong(usize),
    /// Not an `agentos://` URI.
    #[error(
        "unknown resource {0}: this server's resources are {LOG_TEMPLATE}, {FILE_TEMPLATE} and \
         {RESULT_TEMPLATE}"
    )]
    OtherScheme(String),
    #[error("a resource URI here has no query or fragment")]
    QueryOrFragment,
    /// An `agentos://` URI of none of the templates.
    #[error("unknown resource {0}: expected {LOG_TEMPLATE}, {FILE_TEMPLATE} or {RESULT_TEMPLATE}")]
    Unknown(String),
    /// A name that is not one the kernel gives.
    #[error("in the URI: {}", .0.error)]
    BadName(ErrorReply),
    #[error(
        "the path {0:?} is not a file under /workspace (relative, without `.` or `..`, at most \
         {MAX_EXEC_PATH_LEN} bytes)"
    )]
    OutsideWorkspace(String),
    #[error("the URI has a `%` that is not followed by two hex digits")]
    BadEscape,
    #[error("the URI's path is not UTF-8")]
    NotUtf8,
}

impl ResourceUri {
    /// Reads and checks a URI a client sent: the names are the kernel's
    /// names and the path stays under `/workspace`, so nothing a client
    /// writes here reaches the kernel unless it names a resource.
    pub fn parse(uri: &str) -> Result<ResourceUri, UriError> {
        if uri.len() > MAX_URI_BYTES {
            return Err(UriError::TooLong(uri.len()));
        }
        let Some(rest) = uri.strip_prefix(SCHEME) else {
            return Err(UriError::OtherScheme(quoted_start(uri)));
        };
        if rest.contains(['?', '#']) {
            return Err(UriError::QueryOrFragment);
        }
        let unknown = || UriError::Unknown(quoted_start(uri));
        let (kind, rest) = rest.split_once('/').ok_or_else(unknown)?;
        match kind {
            "agents" => {
                let name = rest.strip_suffix("/log").ok_or_else(unknown)?;
                check_name("agent name", name)?;
                Ok(ResourceUri::AgentLog {
                    name: name.to_owned(),
                })
            }
            "sessions" => {
                let (session, path) = rest.split_once('/').ok_or_else(unknown)?;
                check_name("session", session)?;
                let path = percent_decode(path)?;
                check_workspace_path(&path)?;
                Ok(ResourceUri::SessionFile {
                    session: session.to_owned(),
                    path,
                })
            }
            "tasks" => {
                let task_id = rest.strip_suffix("/result").ok_or_else(unknown)?;
                check_name("task id", task_id)?;
                Ok(ResourceUri::TaskResult {
                    task_id: task_id.to_owned(),
                })
            }
            _ => Err(unknown()),
        }
    }

    /// The URI, with a file's path percent-encoded (a path may hold
    /// characters a URI may not).
    pub fn uri(&self) -> String {
        match self {
            ResourceUri::AgentLog { name } => format!("{SCHEME}agents/{name}/log"),
            ResourceUri::SessionFile { session, path } => {
                format!("{SCHEME}sessions/{session}/{}", percent_encode(path))
            }
            ResourceUri::TaskResult { task_id } => format!("{SCHEME}tasks/{task_id}/result"),
        }
    }
}

/// The start of a long URI, for an error message that does not echo a
/// megabyte back.
fn quoted_start(uri: &str) -> String {
    const SHOWN: usize = 80;
    match uri.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{:?}...", &uri[..end]),
        None => format!("{uri:?}"),
    }
}

/// A name as the kernel's names are: `[A-Za-z0-9_.-]{1,64}`, no `..`.
fn check_name(what: &str, name: &str) -> Result<(), UriError> {
    validate_name(what, name).map_err(UriError::BadName)
}

/// A path the kernel collects: relative to `/workspace`, plain names
/// only. Stricter than the kernel, which lets `a/./b` through: a resource
/// has one URI.
pub fn check_workspace_path(path: &str) -> Result<(), UriError> {
    let plain = path.len() <= MAX_EXEC_PATH_LEN
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if plain {
        Ok(())
    } else {
        Err(UriError::OutsideWorkspace(quoted_start(path)))
    }
}

/// `%XX` escapes decoded; the result must be UTF-8, as the kernel's paths
/// are.
fn percent_decode(text: &str) -> Result<String, UriError> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(UriError::BadEscape)?;
            decoded.push(hex);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| UriError::NotUtf8)
}

/// Every byte but the URI's unreserved characters and `/` as `%XX`.
fn percent_encode(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_log_a_file_or_a_result() {
        assert_eq!(
            ResourceUri::parse("agentos://agents/worker-1/log"),
            Ok(ResourceUri::AgentLog {
                name: "worker-1".into()
            })
        );
        assert_eq!(
            ResourceUri::parse("agentos://sessions/s1/out/data%20file.csv"),
            Ok(ResourceUri::SessionFile {
                session: "s1".into(),
                path: "out/data file.csv".into()
            })
        );
        assert_eq!(
            ResourceUri::parse("agentos://tasks/t-00ff/result"),
            Ok(ResourceUri::TaskResult {
                task_id: "t-00ff".into()
            })
        );
    }

    #[test]
    fn a_uri_round_trips_through_its_encoding() {
        for path in ["a.txt", "dir/with space/ü.json", "odd%name#1?.bin"] {
            let resource = ResourceUri::SessionFile {
                session: "s".into(),
                path: path.into(),
            };
            assert_eq!(ResourceUri::parse(&resource.uri()), Ok(resource));
        }
    }

    #[test]
    fn paths_that_leave_the_workspace_are_refused() {
        for uri in [
            "agentos://sessions/s/../../etc/passwd",
            "agentos://sessions/s/%2E%2E/%2e%2e/etc/passwd",
            "agentos://sessions/s//etc/passwd",
            "agentos://sessions/s/a/./b",
            "agentos://sessions/s/",
            "agentos://sessions/s/a%00b",
            "agentos://sessions/s/a%2",
            "agentos://sessions/s/%FF",
        ] {
            assert!(ResourceUri::parse(uri).is_err(), "{uri}");
        }
        // The path is quoted as a URI is, and that again in the message.
        let outside = ResourceUri::parse("agentos://sessions/s/a/../b").unwrap_err();
        assert_eq!(
            outside,
            UriError::OutsideWorkspace(r#""a/../b""#.to_owned())
        );
        let said = outside.to_string();
        assert!(
            said.starts_with(r#"the path "\"a/../b\"" is not a file under /workspace"#),
            "{said}"
        );
    }

    #[test]
    fn other_uris_are_refused_with_what_is_served() {
        for uri in [
            "file:///etc/passwd",
            "agentos://agents/../log",
            "agentos://agents/a/b/log",
            "agentos://agents/a",
            "agentos://tasks/t-1",
            "agentos://tasks/t-1/result?x=1",
            "agentos://elsewhere/x",
            "agentos://sessions/../x",
            "",
        ] {
            let err = ResourceUri::parse(uri).unwrap_err().to_string();
            assert!(!err.is_empty(), "{uri}");
        }
        let err = ResourceUri::parse("https://example.com/")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "unknown resource \"https://example.com/\": this server's resources are \
             agentos://agents/{name}/log, agentos://sessions/{session}/{+path} and \
             agentos://tasks/{task_id}/result"
        );
        let huge = format!("agentos://sessions/s/{}", "a".repeat(1 << 20));
        let err = ResourceUri::parse(&huge).unwrap_err().to_string();
        assert!(err.contains("at most 4096"), "{err}");
        assert!(err.len() < 200, "{err}");
        let bad_name = ResourceUri::parse("agentos://agents/a b/log")
            .unwrap_err()
            .to_string();
        assert!(
            bad_name.starts_with("in the URI: `agent name` "),
            "{bad_name}"
        );
    }
}
