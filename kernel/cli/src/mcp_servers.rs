//! `agentos mcp-servers import FILE`: the `"mcpServers": {...}` JSON block
//! every MCP server's README shows, as the kernel's `[mcp.servers.NAME]`
//! TOML entries. The block's `env` and `headers` often hold keys, so a
//! file written here is the caller's alone (0600), and an existing one is
//! never overwritten.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, clap::Subcommand)]
pub enum McpServersCommand {
    /// Turn an MCP client's `mcpServers` JSON (a file, or - for stdin)
    /// into `[mcp.servers.NAME]` entries for agentosd.toml
    Import {
        /// The JSON: a whole client config, its `"mcpServers": {...}` block
        /// alone, or the servers' object
        file: PathBuf,
        /// Write the entries to this new file (mode 600) instead of stdout
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

/// Why a block cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not an MCP client's `mcpServers` JSON", path.display())]
    NotServers {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("server {name:?} has neither `command` nor `url`")]
    NoProgram { name: String },
    #[error("no name can be made of server {0:?}: give it one of lowercase letters, digits and _")]
    Unnameable(String),
    #[error("two servers would both be named {0:?}")]
    SameName(String),
    #[error("cannot write {} (an existing file is never overwritten)", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the entries as TOML: {0}")]
    Toml(#[from] toml::ser::Error),
}

/// A client config, or the part of it an MCP README shows.
#[derive(Debug, Deserialize)]
struct ClientConfig {
    /// Claude Desktop's, Cursor's and most clients' name; VS Code's is
    /// `servers`.
    #[serde(rename = "mcpServers", alias = "servers")]
    servers: BTreeMap<String, PastedServer>,
}

/// One server as MCP clients write it. Fields only some clients know
/// (`alwaysAllow`, `autoApprove`, ...) are passed over.
#[derive(Debug, Deserialize)]
struct PastedServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(alias = "serverUrl")]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    disabled: bool,
}

#[derive(Debug, Serialize)]
struct Document {
    mcp: Servers,
}

#[derive(Debug, Serialize)]
struct Servers {
    servers: BTreeMap<String, Entry>,
}

/// A `[mcp.servers.NAME]` entry.
#[derive(Debug, Serialize)]
struct Entry {
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    args: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_true")]
    enabled: bool,
}

fn is_true(value: &bool) -> bool {
    *value
}

pub fn mcp_servers(command: McpServersCommand) -> Result<(), ImportError> {
    let McpServersCommand::Import { file, output } = command;
    let text = read_input(&file)?;
    let (toml, renamed) = import(&text, &file)?;
    for (from, to) in renamed {
        eprintln!("agentos: server {from:?} is named {to:?} (the name code imports it by)");
    }
    match output {
        None => print!("{toml}"),
        Some(path) => {
            write_private(&path, &toml).map_err(|source| ImportError::Write {
                path: path.clone(),
                source,
            })?;
            eprintln!(
                "agentos: wrote {} (mode 600: it may hold keys); add its entries to \
                 agentosd.toml",
                path.display()
            );
        }
    }
    Ok(())
}

fn read_input(file: &Path) -> Result<String, ImportError> {
    let read = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(file)
    };
    read.map_err(|source| ImportError::Read {
        path: file.to_path_buf(),
        source,
    })
}

/// The TOML entries for the servers in `text` (read from `file`), and
/// the servers whose names had to change (from, to).
fn import(text: &str, file: &Path) -> Result<(String, Vec<(String, String)>), ImportError> {
    let config = read_servers(text).map_err(|source| ImportError::NotServers {
        path: file.to_path_buf(),
        source,
    })?;
    let mut servers = BTreeMap::new();
    let mut renamed = Vec::new();
    for (name, server) in config.servers {
        let plain = plain_name(&name).ok_or_else(|| ImportError::Unnameable(name.clone()))?;
        if server.command.is_none() && server.url.is_none() {
            return Err(ImportError::NoProgram { name });
        }
        if plain != name {
            renamed.push((name, plain.clone()));
        }
        let entry = Entry {
            command: server.command,
            url: server.url,
            args: server.args,
            env: server.env,
            headers: server.headers,
            enabled: !server.disabled,
        };
        if servers.insert(plain.clone(), entry).is_some() {
            return Err(ImportError::SameName(plain));
        }
    }
    let toml = toml::to_string(&Document {
        mcp: Servers { servers },
    })?;
    Ok((toml, renamed))
}

/// The servers of a whole client config, of its `"mcpServers": {...}`
/// member alone (what READMEs show), or of the servers' object itself.
fn read_servers(text: &str) -> Result<ClientConfig, serde_json::Error> {
    let whole = serde_json::from_str::<ClientConfig>(text);
    if whole.is_ok() {
        return whole;
    }
    let member = format!("{{{text}}}");
    if let Ok(config) = serde_json::from_str::<ClientConfig>(&member) {
        return Ok(config);
    }
    if let Ok(servers) = serde_json::from_str::<BTreeMap<String, PastedServer>>(text) {
        return Ok(ClientConfig { servers });
    }
    whole
}

/// The kernel's name for server `name`: lowercase letters, digits and `_`,
/// starting with a letter (`brave-search` becomes `brave_search`).
fn plain_name(name: &str) -> Option<String> {
    let plain: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '_',
        })
        .collect();
    let plain = plain.trim_matches('_').to_owned();
    plain
        .starts_with(|c: char| c.is_ascii_lowercase())
        .then_some(plain)
}

/// Writes `text` to a new file only its owner can read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const README_BLOCK: &str = r#""mcpServers": {
    "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone=UTC"]},
    "brave-search": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-brave-search"],
      "env": {"BRAVE_API_KEY": "secret-key"}
    },
    "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer t"}},
    "off": {"command": "node", "disabled": true, "alwaysAllow": ["x"]}
  }"#;

    #[test]
    fn a_readme_block_becomes_entries_the_kernel_reads() {
        let (toml, renamed) = import(README_BLOCK, Path::new("x.json")).unwrap();
        assert_eq!(
            renamed,
            [("brave-search".to_owned(), "brave_search".to_owned())]
        );
        let read: toml::Table = toml::from_str(&toml).unwrap();
        let servers = read["mcp"]["servers"].as_table().unwrap();
        assert_eq!(servers["time"]["command"].as_str(), Some("uvx"));
        assert_eq!(
            servers["brave_search"]["env"]["BRAVE_API_KEY"].as_str(),
            Some("secret-key")
        );
        assert_eq!(
            servers["remote"]["url"].as_str(),
            Some("https://mcp.example.com/mcp")
        );
        assert_eq!(servers["off"]["enabled"].as_bool(), Some(false));
        assert!(!toml.contains("alwaysAllow"), "{toml}");
    }

    #[test]
    fn a_whole_client_config_and_the_bare_object_read_alike() {
        let whole = format!("{{{README_BLOCK}, \"globalShortcut\": \"\"}}");
        let bare = r#"{"time": {"command": "uvx", "args": ["mcp-server-time"]}}"#;
        for text in [whole.as_str(), bare] {
            let (toml, _) = import(text, Path::new("x.json")).unwrap();
            assert!(toml.contains("[mcp.servers.time]"), "{toml}");
        }
    }

    #[test]
    fn what_cannot_be_a_server_is_refused_by_name() {
        let refused = |text: &str| match import(text, Path::new("x.json")) {
            Err(err) => err.to_string(),
            Ok((toml, _)) => panic!("imported: {toml}"),
        };
        assert!(refused(r#"{"mcpServers": {"x": {"args": []}}}"#).contains("neither `command`"));
        assert!(refused(r#"{"mcpServers": {"9": {"command": "a"}}}"#).contains("no name"));
        assert!(
            refused(r#"{"mcpServers": {"a-b": {"command": "a"}, "a_b": {"command": "b"}}}"#)
                .contains("both be named")
        );
        assert!(refused("[1, 2]").contains("x.json is not an MCP client's"));
    }

    #[test]
    fn the_written_file_is_private_and_never_replaces_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers.toml");
        write_private(&path, "x").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(write_private(&path, "y").is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x");
    }
}
