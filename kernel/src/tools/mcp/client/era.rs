//! Which revision of MCP a server is spoken to in, from what it answers:
//! the versions its `server/discover` result or its refusals list, and the
//! version its `initialize` result agrees on. The kernel speaks 2026-07-28
//! ([`MODERN`]) and, after the handshake, the versions in [`ACCEPTED`].

use serde_json::Value;

use crate::tools::mcp::jsonrpc::RpcError;

/// The protocol version offered in the `initialize` handshake.
pub const PROTOCOL: &str = "2025-11-25";
/// Versions accepted from a server in the `initialize` handshake.
pub const ACCEPTED: [&str; 2] = ["2025-11-25", "2025-06-18"];
/// The handshake-free protocol revision, probed for first.
pub const MODERN: &str = "2026-07-28";
/// JSON-RPC errors by which a 2026-07-28 server refuses a request: it
/// does not speak the version asked for, lacks a capability of the
/// client's, or finds the HTTP headers do not match the body.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
const HEADER_MISMATCH: i64 = -32020;

/// Which revision of the protocol the server is spoken to in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Era {
    /// `server/discover` is under way.
    Probing,
    /// The `initialize` handshake is under way.
    Initializing,
    /// After the `initialize` handshake, in the version it agreed.
    Handshake(String),
    /// Protocol 2026-07-28: no handshake, `_meta` on every request.
    Modern,
}

/// What the server's answer on versions leads to.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It speaks 2026-07-28.
    Modern,
    /// The `initialize` handshake is to be tried.
    Initialize,
    /// It speaks no version the kernel does: the server fails, for this.
    Fail(String),
}

/// A `DiscoverResult`, in era `era`: the server speaks 2026-07-28, or
/// names the versions it does speak.
pub fn discovered(era: &Era, result: &Value) -> Verdict {
    let versions = string_list(result.get("supportedVersions"));
    if versions.iter().any(|v| v == MODERN) {
        return Verdict::Modern;
    }
    pick_handshake(era, &versions)
}

/// An error to the probe, from the server `server`: one of 2026-07-28's
/// own refusals is a modern server's answer; any other error is the
/// earlier era's way of saying it does not know the method.
pub fn discover_refused(era: &Era, error: &RpcError, server: &str) -> Verdict {
    match error.code {
        UNSUPPORTED_PROTOCOL_VERSION => unsupported_version(era, error),
        MISSING_REQUIRED_CLIENT_CAPABILITY | HEADER_MISMATCH => {
            Verdict::Fail(format!("server/discover was refused: {}", error.message))
        }
        _ => {
            log::debug!(
                "MCP server {server} does not know server/discover ({}); trying initialize",
                error.message
            );
            Verdict::Initialize
        }
    }
}

/// The server does not speak the version asked for; its error lists
/// those it does.
pub fn unsupported_version(era: &Era, error: &RpcError) -> Verdict {
    let versions = string_list(error.data.as_ref().and_then(|d| d.get("supported")));
    if versions.iter().any(|v| v == MODERN) && *era != Era::Probing {
        // It speaks 2026-07-28 after all: it took a probe it answered too
        // late for its era, or refuses the handshake outright.
        return Verdict::Modern;
    }
    pick_handshake(era, &versions)
}

/// An `initialize` result agreed on a version the kernel does not speak.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("speaks MCP protocol {version}; the kernel speaks {}", ACCEPTED.join(" and "))]
pub struct Unspoken {
    /// The version it agreed on, or `(none)`.
    pub version: String,
}

/// An `initialize` result: the version it agrees on, if the kernel speaks
/// it.
pub fn agreed(result: &Value) -> Result<String, Unspoken> {
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("(none)");
    if !ACCEPTED.contains(&version) {
        return Err(Unspoken {
            version: version.to_owned(),
        });
    }
    Ok(version.to_owned())
}

/// The handshake, if the server (still being probed) lists a version of
/// it the kernel speaks; otherwise the server fails, saying which it
/// lists.
fn pick_handshake(era: &Era, versions: &[String]) -> Verdict {
    if *era == Era::Probing && versions.iter().any(|v| ACCEPTED.contains(&v.as_str())) {
        return Verdict::Initialize;
    }
    let listed = if versions.is_empty() {
        "(none)".to_owned()
    } else {
        versions.join(", ")
    };
    Verdict::Fail(format!(
        "speaks MCP protocol {listed}; the kernel speaks {MODERN}, {}",
        ACCEPTED.join(" and ")
    ))
}

/// The strings of a JSON array (none when it is not one).
fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}
