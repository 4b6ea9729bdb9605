//! The MCP servers the kernel runs or reaches: the `[mcp.servers.<name>]`
//! tables of the config file. A server is a program the kernel starts and
//! speaks to over its stdio (`command`), or a remote one it reaches over
//! Streamable HTTP (`url`, with `headers` such as its credentials).
//!
//! A remote URL is `https://`, or `http://` to the host itself (a loopback
//! address or `localhost`): plain HTTP to another host would carry the
//! server's credentials, and every call, readable by the network, so it is
//! refused rather than warned about — a config that works is one that is
//! safe.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;

/// Names no server may take: the built-in servers, and what `import tools`
/// itself defines beside the servers.
pub const RESERVED_NAMES: [&str; 4] = ["llm", "kernel", "search", "call"];

/// Longest server name.
const MAX_NAME: usize = 32;

/// Headers the kernel sets itself on every request to a remote server: a
/// configured one would contradict them.
const KERNEL_HEADERS: [&str; 9] = [
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-method",
    "mcp-name",
    "mcp-protocol-version",
    "mcp-session-id",
    "transfer-encoding",
];

/// The `[mcp]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// The servers, by name (the `server` of a TOOL call and the module
    /// name under `tools` in EXEC).
    pub servers: BTreeMap<String, McpServerConfig>,
}

/// One MCP server: a program spoken to over its stdio, or a remote one
/// over Streamable HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program: a path, or a bare name found on the kernel's `PATH`.
    pub command: String,
    /// A remote server's MCP endpoint (instead of `command`).
    pub url: Option<String>,
    /// Headers sent with every request to a remote server (its
    /// credentials: secrets like `env`'s values).
    pub headers: BTreeMap<String, String>,
    /// Its arguments.
    pub args: Vec<String>,
    /// The whole environment it gets (its keys stay with it: never in a
    /// sandbox, a reply or a log).
    pub env: BTreeMap<String, String>,
    /// Its working directory (default `/`); visible to it read-only.
    pub cwd: Option<PathBuf>,
    /// Directories it may write to (an existing absolute path among its
    /// arguments is visible to it read-only otherwise).
    pub writable: Vec<PathBuf>,
    /// A call's deadline when the caller gives none, and the bound on the
    /// handshake and on each listing, in milliseconds.
    pub timeout_ms: u64,
    /// Whether it runs at all.
    pub enabled: bool,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        McpServerConfig {
            command: String::new(),
            url: None,
            headers: BTreeMap::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            writable: Vec::new(),
            timeout_ms: 30_000,
            enabled: true,
        }
    }
}

impl McpConfig {
    /// The servers that run.
    pub fn enabled(&self) -> impl Iterator<Item = (&String, &McpServerConfig)> {
        self.servers.iter().filter(|(_, server)| server.enabled)
    }

    /// Checks every server's name and settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, server) in &self.servers {
            let invalid = |reason: String| {
                Err(ConfigError::Invalid {
                    field: "mcp.servers",
                    reason: format!("server {name:?}: {reason}"),
                })
            };
            if let Err(why) = check_name(name) {
                return invalid(why.to_string());
            }
            match (&server.url, server.command.is_empty()) {
                (None, true) => return invalid("`command` or `url` is required".into()),
                (Some(_), false) => {
                    return invalid(
                        "give `command` (a program) or `url` (a remote server), not both".into(),
                    )
                }
                (Some(url), true) => {
                    if let Err(why) = check_remote(url, server) {
                        return invalid(why.to_string());
                    }
                }
                (None, false) if !server.headers.is_empty() => {
                    return invalid(
                        "`headers` are for a remote server (`url`); a program gets `env`".into(),
                    )
                }
                (None, false) => {}
            }
            if !(1..=agentos_proto::payload::MAX_EXEC_TIMEOUT_MS).contains(&server.timeout_ms) {
                return invalid("`timeout_ms` must be 1 ms to one hour".into());
            }
            let relative = server
                .cwd
                .iter()
                .chain(&server.writable)
                .find(|path| !path.is_absolute());
            if let Some(path) = relative {
                return invalid(format!("{} must be an absolute path", path.display()));
            }
        }
        Ok(())
    }
}

impl McpServerConfig {
    /// Whether it is a remote server, reached over HTTP.
    pub fn is_remote(&self) -> bool {
        self.url.is_some()
    }
}

/// Why a remote server's settings cannot be used: its URL (see the
/// module's documentation), its headers, or settings only a program has.
#[derive(Debug, thiserror::Error)]
enum BadRemote {
    /// A setting only a program (`command`) takes.
    #[error("`{key}` is for a program (`command`); a remote server (`url`) takes `headers`")]
    ProgramSetting {
        /// The setting's key.
        key: &'static str,
    },
    /// Its URL.
    #[error(transparent)]
    Url(#[from] BadUrl),
    /// A header whose name is not a header name.
    #[error("header {name:?} is not a valid header name")]
    HeaderName {
        /// The header's name.
        name: String,
    },
    /// A header the kernel sets itself ([`KERNEL_HEADERS`]).
    #[error("header {name:?} is set by the kernel itself")]
    KernelHeader {
        /// The header's name.
        name: String,
    },
    /// A header whose value a header cannot carry; the value is a secret,
    /// so only the name is given.
    #[error(
        "the value of header {name:?} holds a character a header cannot carry \
         (only printable ASCII)"
    )]
    HeaderValue {
        /// The header's name.
        name: String,
    },
}

/// Why a URL is not a remote server's endpoint the kernel will use.
#[derive(Debug, thiserror::Error)]
enum BadUrl {
    /// It does not parse.
    #[error("`url` {url:?} is not a URL ({error})")]
    NotAUrl {
        /// The URL.
        url: String,
        /// Why it does not parse.
        error: ureq::http::uri::InvalidUri,
    },
    /// It names no host.
    #[error("`url` {url:?} names no host (write https://host/path)")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// It holds credentials, which belong in `headers`.
    #[error("`url` {url:?} holds credentials; give them in `headers` (as a secret)")]
    Credentials {
        /// The URL.
        url: String,
    },
    /// Plain HTTP to a host other than this one.
    #[error(
        "`url` {url:?} is plain HTTP to another host, which would send its headers and \
         every call unencrypted; use https:// (plain http:// is for this host only)"
    )]
    PlainHttp {
        /// The URL.
        url: String,
    },
    /// A scheme other than HTTPS or HTTP.
    #[error(
        "`url` {url:?} has the scheme {scheme:?}; a remote server is reached over https:// \
         (or http:// on this host)"
    )]
    Scheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
}

/// Why a remote server's settings cannot be used, if they cannot.
fn check_remote(url: &str, server: &McpServerConfig) -> Result<(), BadRemote> {
    let process_only = [
        ("args", server.args.is_empty()),
        ("env", server.env.is_empty()),
        ("cwd", server.cwd.is_none()),
        ("writable", server.writable.is_empty()),
    ];
    if let Some((key, _)) = process_only.iter().find(|(_, unset)| !unset) {
        return Err(BadRemote::ProgramSetting { key });
    }
    check_url(url)?;
    for (name, value) in &server.headers {
        let lower = name.to_ascii_lowercase();
        if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(BadRemote::HeaderName { name: name.clone() });
        }
        if KERNEL_HEADERS.contains(&lower.as_str()) {
            return Err(BadRemote::KernelHeader { name: name.clone() });
        }
        // The value is a secret: the error does not show it.
        let printable = value
            .bytes()
            .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
        if !printable || ureq::http::HeaderValue::from_str(value).is_err() {
            return Err(BadRemote::HeaderValue { name: name.clone() });
        }
    }
    Ok(())
}

/// Why `url` is not a remote server's endpoint the kernel will use, if it
/// is not.
fn check_url(url: &str) -> Result<(), BadUrl> {
    let uri: ureq::http::Uri = url.parse().map_err(|error| BadUrl::NotAUrl {
        url: url.to_owned(),
        error,
    })?;
    let url = || url.to_owned();
    let scheme = uri.scheme_str().unwrap_or("");
    let Some(authority) = uri.authority() else {
        return Err(BadUrl::NoHost { url: url() });
    };
    if authority.as_str().contains('@') {
        return Err(BadUrl::Credentials { url: url() });
    }
    match scheme {
        "https" => Ok(()),
        "http" if is_loopback(authority.host()) => Ok(()),
        "http" => Err(BadUrl::PlainHttp { url: url() }),
        other => Err(BadUrl::Scheme {
            url: url(),
            scheme: other.to_owned(),
        }),
    }
}

/// Whether `host` (as a URL writes it) is this host.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why a server's name cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum BadName {
    /// It is not a plain lowercase identifier, or it is too long.
    #[error(
        "a name is 1 to {} lowercase letters, digits and `_`, starting with a letter",
        MAX_NAME
    )]
    NotPlain,
    /// It is one of [`RESERVED_NAMES`] or a Python keyword.
    #[error("the name is reserved")]
    Reserved,
}

/// A server's name must be a plain Python identifier (it is a module name
/// inside EXEC) of lowercase letters, digits and `_`, and not reserved.
fn check_name(name: &str) -> Result<(), BadName> {
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain || name.len() > MAX_NAME {
        return Err(BadName::NotPlain);
    }
    if RESERVED_NAMES.contains(&name) || crate::python_names::is_keyword(name) {
        return Err(BadName::Reserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, server: McpServerConfig) -> McpConfig {
        McpConfig {
            servers: BTreeMap::from([(name.to_owned(), server)]),
        }
    }

    fn server(command: &str) -> McpServerConfig {
        McpServerConfig {
            command: command.into(),
            ..McpServerConfig::default()
        }
    }

    #[test]
    fn names_are_plain_identifiers_and_not_reserved() {
        assert!(with("everything", server("x")).validate().is_ok());
        assert!(with("fs_2", server("x")).validate().is_ok());
        for bad in [
            "",
            "Fs",
            "2fs",
            "my-server",
            "a.b",
            "llm",
            "kernel",
            "search",
            "if",
        ] {
            let Err(ConfigError::Invalid { reason, .. }) = with(bad, server("x")).validate() else {
                panic!("{bad:?} was accepted as a server name");
            };
            assert!(reason.contains(&format!("{bad:?}")), "{reason}");
        }
    }

    fn remote(url: &str) -> McpServerConfig {
        McpServerConfig {
            url: Some(url.into()),
            ..McpServerConfig::default()
        }
    }

    fn refusal(server: McpServerConfig) -> String {
        match with("remote", server).validate() {
            Err(ConfigError::Invalid { reason, .. }) => reason,
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    #[test]
    fn a_remote_server_is_https_or_plain_http_on_this_host_only() {
        for good in [
            "https://mcp.example.com/mcp",
            "https://mcp.example.com:8443/v1/mcp?tenant=a",
            "http://127.0.0.1:3001/mcp",
            "http://localhost:8000/mcp",
            "http://[::1]:8000/mcp",
        ] {
            let checked = with("remote", remote(good)).validate();
            assert!(checked.is_ok(), "{good}: {checked:?}");
        }
        for (bad, says) in [
            ("http://mcp.example.com/mcp", "plain HTTP to another host"),
            ("http://10.0.0.5/mcp", "plain HTTP to another host"),
            ("ftp://example.com/mcp", "scheme \"ftp\""),
            ("not a url", "is not a URL"),
            ("/mcp", "names no host"),
            ("https://user:pw@example.com/mcp", "holds credentials"),
        ] {
            let reason = refusal(remote(bad));
            assert!(reason.contains(says), "{bad}: {reason}");
        }
    }

    #[test]
    fn a_server_is_a_program_or_a_remote_one_never_both() {
        let both = McpServerConfig {
            command: "x".into(),
            ..remote("https://example.com/mcp")
        };
        assert!(refusal(both).contains("not both"));
        assert!(refusal(McpServerConfig::default()).contains("`command` or `url`"));
        let headers_for_a_program = McpServerConfig {
            headers: BTreeMap::from([("Authorization".into(), "Bearer abc".into())]),
            ..server("x")
        };
        assert!(refusal(headers_for_a_program).contains("`headers` are for a remote server"));
        let env_for_a_remote = McpServerConfig {
            env: BTreeMap::from([("KEY".into(), "v".into())]),
            ..remote("https://example.com/mcp")
        };
        assert!(refusal(env_for_a_remote).contains("`env` is for a program"));
    }

    #[test]
    fn headers_are_valid_not_the_kernels_own_and_their_values_never_shown() {
        let with_header = |name: &str, value: &str| McpServerConfig {
            headers: BTreeMap::from([(name.into(), value.into())]),
            ..remote("https://example.com/mcp")
        };
        let bearer = with_header("Authorization", "Bearer s3cret-token");
        assert!(with("remote", bearer).validate().is_ok());
        assert!(refusal(with_header("Mcp-Session-Id", "x")).contains("set by the kernel"));
        assert!(refusal(with_header("bad name", "x")).contains("not a valid header name"));
        let reason = refusal(with_header("X-Key", "s3cret\nline"));
        assert!(reason.contains("printable ASCII"), "{reason}");
        assert!(!reason.contains("s3cret"), "{reason}");
    }

    #[test]
    fn a_server_needs_a_command_a_sane_timeout_and_absolute_paths() {
        assert!(with("a", server("")).validate().is_err());
        let slow = McpServerConfig {
            timeout_ms: 0,
            ..server("x")
        };
        assert!(with("a", slow).validate().is_err());
        let relative = McpServerConfig {
            cwd: Some("data".into()),
            ..server("x")
        };
        assert!(with("a", relative).validate().is_err());
    }
}
