//! What every part of the configuration shares: its error, reading an
//! environment variable into a setting, and where a user's state lives.

use std::path::PathBuf;
use std::str::FromStr;

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for this schema.
    #[error("config file {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said (names the key).
        source: Box<toml::de::Error>,
    },
    /// The config file holds an MCP client's JSON (`"mcpServers": {...}`,
    /// the form MCP servers' READMEs show) where TOML belongs.
    #[error(
        "config file {}: this is an MCP client's JSON `mcpServers` block, not TOML; \
         `agentos mcp-servers import FILE` turns it into `[mcp.servers.NAME]` entries \
         ({source})",
        path.display()
    )]
    PastedMcpJson {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said.
        source: Box<toml::de::Error>,
    },
    /// An environment variable has a value that cannot be used.
    #[error("environment variable {name}={value:?}: {reason}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A setting is out of its allowed range.
    #[error("setting `{field}`: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
}

/// Reads the environment variable `name`, if set, into `target`.
pub fn parse_env<T: FromStr>(
    get: &dyn Fn(&'static str) -> Option<String>,
    name: &'static str,
    target: &mut T,
) -> Result<(), ConfigError>
where
    T::Err: std::fmt::Display,
{
    if let Some(value) = get(name) {
        *target = value
            .trim()
            .parse()
            .map_err(|err: T::Err| ConfigError::Env {
                name,
                value: value.clone(),
                reason: err.to_string(),
            })?;
    }
    Ok(())
}

/// A user's own state directory for the kernel: `$XDG_STATE_HOME/agentos`,
/// or `~/.local/state/agentos` (the temporary directory without a home).
pub fn user_state_dir() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("agentos")
}
