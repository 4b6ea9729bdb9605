//! The MCP servers the kernel runs: the `[mcp.servers.<name>]` tables of
//! the config file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;

/// Names no server may take: the built-in servers, and what `import tools`
/// itself defines beside the servers.
pub const RESERVED_NAMES: [&str; 4] = ["llm", "kernel", "search", "call"];

/// Longest server name.
const MAX_NAME: usize = 32;

/// The `[mcp]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// The servers, by name (the `server` of a TOOL call and the module
    /// name under `tools` in EXEC).
    pub servers: BTreeMap<String, McpServerConfig>,
}

/// One MCP server, spoken to over its stdio.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program: a path, or a bare name found on the kernel's `PATH`.
    pub command: String,
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
            if server.command.is_empty() {
                return invalid("`command` is required".into());
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
