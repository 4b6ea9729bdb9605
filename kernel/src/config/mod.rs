//! Kernel configuration.
//!
//! Layers, later ones winning: built-in defaults, the config file (TOML),
//! `AGENTOS_*` environment variables, command-line flags. The file is the
//! one named by `--config` or `AGENTOS_CONFIG`, else
//! `/etc/agentos/agentosd.toml` if it exists, else none: `agentosd --socket
//! PATH` needs nothing else to run.

pub mod audit;
pub mod boot;
mod common;
pub mod exec;
pub mod fleet;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod network;
pub mod python_env;
pub mod state;
pub mod tasks;
pub mod tracing;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_proto::{socket_path, Opcode, MAX_REPLY_BYTES};
use serde::Deserialize;

use self::tracing::TracingConfig;
use audit::AuditSettings;
use common::parse_env;
pub use common::{user_state_dir, ConfigError};
use exec::ExecConfig;
use fleet::FleetConfig;
use llm::LlmConfig;
use mcp::McpConfig;
use metrics::MetricsConfig;
use network::NetworkConfig;
use state::StateConfig;
use tasks::TasksConfig;

/// The file by which an environment holds the `agentos` SDK, relative to
/// its site directory.
pub const SDK_PACKAGE: &str = "agentos/__init__.py";

/// The service's config file, read when present and nothing else is named.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/agentos/agentosd.toml";

/// Everything the daemon can be told.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The file this configuration was read from, if any.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// Socket path; resolved by the protocol's rule when absent.
    pub socket: Option<PathBuf>,
    /// Group owning the socket (name or numeric gid); its members are
    /// operators. Default: the daemon's own group.
    pub socket_group: Option<String>,
    /// Serve a socket in a directory other users may write in (`/tmp`),
    /// where they could plant its `.lock` or `.d` first. Default false.
    pub allow_shared_socket_dir: bool,
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or an
    /// `env_logger` filter). Default `info`, or `RUST_LOG` if set.
    pub log_level: Option<String>,
    /// Largest request payload accepted, in bytes (1 MiB).
    pub max_request_bytes: u64,
    /// Requests a connection may have awaiting replies before the kernel
    /// stops reading from it (backpressure, nothing dropped).
    pub max_in_flight: u32,
    /// Connections served at once; more are told `busy` and closed.
    pub max_connections: usize,
    /// Of those, how many agents can never take: agents together hold at
    /// most `max_connections` minus this (minus at most half), so operators
    /// are always served.
    pub reserved_operator_connections: usize,
    /// Reply bytes held for a connection (unsent, or completed and waiting
    /// for an earlier reply) above which the kernel stops reading from it.
    pub write_high_water: usize,
    /// A connection with unsent replies must accept at least 64 KiB of them
    /// (or all of them) within this time, or it is dropped: a client that
    /// does not read its replies cannot hold kernel memory.
    pub write_stall_timeout_ms: u64,
    /// A request frame, once begun, must arrive complete within this time,
    /// or the connection is dropped: a half-sent frame cannot hold its
    /// buffer forever.
    pub frame_timeout_ms: u64,
    /// On SIGTERM, how long connections get to receive replies to requests
    /// already accepted.
    pub shutdown_grace_ms: u64,
    /// Worker threads for blocking work.
    pub workers: usize,
    /// Jobs that may wait for a worker; beyond this requests get `busy`.
    pub max_queued_jobs: usize,
    /// Agents: defaults, users, logs and retention.
    pub agents: AgentsConfig,
    /// THINK: the provider, its limits, fair queueing.
    pub llm: LlmConfig,
    /// EXEC: exec hosts, output caps, sessions.
    pub exec: ExecConfig,
    /// `[mcp]`: the MCP servers whose tools TOOL and EXEC offer.
    pub mcp: McpConfig,
    /// `[network]`: egress policies and the proxy that enforces them.
    pub network: NetworkConfig,
    /// `[metrics]`: where the Prometheus metrics are served.
    pub metrics: MetricsConfig,
    /// `[tracing]`: where spans are exported.
    pub tracing: TracingConfig,
    /// TASK: the task store, caps, retention.
    pub tasks: TasksConfig,
    /// `[state]`: what one owner may keep in the state store.
    pub state: StateConfig,
    /// `[audit]`: how much the audit log keeps, and what it records.
    pub audit: AuditSettings,
    /// `[fleet]`: the PostgreSQL database this node shares with others.
    pub fleet: FleetConfig,
    /// Diagnostics for tests; never needed in production.
    pub debug: DebugConfig,
}

/// How agents are run.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentsConfig {
    /// The interpreter for SPAWN's `script` when the request names none.
    /// Default: the project's `.venv` when it holds the `agentos` SDK (see
    /// [`AgentsConfig::python`]), else `/usr/bin/python3`.
    pub python: Option<PathBuf>,
    /// The user sandboxed workloads run as when the daemon is root.
    pub uid: u32,
    /// Their group.
    pub gid: u32,
    /// Where agent logs go (`<name>-<id>.log`). Default: /var/log/agentos
    /// as root, else `$XDG_STATE_HOME/agentos/logs` (or
    /// `~/.local/state/agentos/logs`).
    pub log_dir: Option<PathBuf>,
    /// Each agent's log is kept under this many bytes.
    pub log_bytes: u64,
    /// Memory limit when SPAWN gives none, in bytes.
    pub default_memory: u64,
    /// CPU quota when SPAWN gives none, in microseconds per period (0: none).
    pub default_cpu_quota: u64,
    /// CPU period when SPAWN gives none, in microseconds.
    pub default_cpu_period: u64,
    /// Process limit when SPAWN gives none.
    pub default_max_pids: u64,
    /// Size of each sandbox's /tmp (and /dev/shm), in bytes.
    pub tmp_bytes: u64,
    /// Size of each sandbox's /workspace, in bytes.
    pub workspace_bytes: u64,
    /// Open files per workload.
    pub nofile: u64,
    /// Largest file a workload may write, in bytes.
    pub max_file_bytes: u64,
    /// How long ended agents stay in LIST, in seconds (at least 60).
    pub retention_secs: u64,
    /// Agents alive at once.
    pub max_agents: usize,
    /// Sandboxes kept prepared for SPAWNs of the default shape (sandboxed,
    /// no host network), so those skip namespace and root setup; 0 turns
    /// the pool off.
    pub warm_pool: usize,
    /// On shutdown, time agents get between SIGTERM and SIGKILL.
    pub stop_grace_ms: u64,
    /// Connections one agent may hold on its socket at once.
    pub max_connections: usize,
    /// Agents started with the kernel (`[[agents.boot]]`).
    #[serde(deserialize_with = "boot::deserialize")]
    pub boot: Vec<agentos_proto::payload::SpawnRequest>,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            python: None,
            uid: 65534,
            gid: 65534,
            log_dir: None,
            log_bytes: 8 << 20,
            default_memory: 512 << 20,
            default_cpu_quota: 100_000,
            default_cpu_period: 100_000,
            default_max_pids: 256,
            tmp_bytes: 64 << 20,
            workspace_bytes: 256 << 20,
            nofile: 1024,
            max_file_bytes: 1 << 30,
            retention_secs: 300,
            max_agents: 1024,
            warm_pool: 2,
            stop_grace_ms: 5_000,
            max_connections: 64,
            boot: Vec::new(),
        }
    }
}

impl AgentsConfig {
    /// The interpreter agents' scripts run with when SPAWN names none: the
    /// configured one, else the project's `.venv` when it holds the
    /// `agentos` SDK (as the local model's is found), else the system's.
    pub fn python(&self) -> PathBuf {
        self.python
            .clone()
            .or_else(|| python_env::project_python_with(SDK_PACKAGE))
            .unwrap_or_else(|| PathBuf::from(python_env::SYSTEM_PYTHON))
    }

    /// The log directory, defaulted by who runs the daemon.
    pub fn log_dir(&self) -> PathBuf {
        if let Some(dir) = &self.log_dir {
            return dir.clone();
        }
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/log/agentos");
        }
        user_state_dir().join("logs")
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if self.retention_secs < 60 {
            return invalid("agents.retention_secs", "must be at least 60".into());
        }
        if self.max_agents == 0 {
            return invalid("agents.max_agents", "must be at least 1".into());
        }
        if self.max_connections == 0 {
            return invalid("agents.max_connections", "must be at least 1".into());
        }
        if self.python.as_ref().is_some_and(|p| !p.is_absolute()) {
            return invalid("agents.python", "must be an absolute path".into());
        }
        let defaults = agentos_proto::payload::Limits {
            memory: Some(self.default_memory),
            cpu_quota: (self.default_cpu_quota > 0).then_some(self.default_cpu_quota),
            cpu_period: Some(self.default_cpu_period),
            max_pids: Some(self.default_max_pids),
        };
        if let Err(err) = defaults.validate() {
            return invalid("agents.default_*", err.error);
        }
        Ok(())
    }
}

/// Diagnostic switches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DebugConfig {
    /// Opcodes (by name) whose replies are produced on a worker thread and
    /// delivered through the reactor's waker, as THINK/EXEC/SPAWN replies
    /// are. Lets tests drive the out-of-order completion path with NOOP and
    /// HELLO.
    pub defer_opcodes: Vec<String>,
    /// Extra time a deferred reply spends on its worker.
    pub defer_delay_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            file: None,
            socket: None,
            socket_group: None,
            allow_shared_socket_dir: false,
            log_level: None,
            max_request_bytes: agentos_proto::DEFAULT_MAX_REQUEST_BYTES,
            max_in_flight: 128,
            max_connections: 8192,
            reserved_operator_connections: 64,
            write_high_water: 4 << 20,
            write_stall_timeout_ms: 30_000,
            frame_timeout_ms: 30_000,
            shutdown_grace_ms: 5_000,
            workers: 4,
            max_queued_jobs: 1024,
            agents: AgentsConfig::default(),
            llm: LlmConfig::default(),
            exec: ExecConfig::default(),
            mcp: McpConfig::default(),
            network: NetworkConfig::default(),
            metrics: MetricsConfig::default(),
            tracing: TracingConfig::default(),
            tasks: TasksConfig::default(),
            state: StateConfig::default(),
            audit: AuditSettings::default(),
            fleet: FleetConfig::default(),
            debug: DebugConfig::default(),
        }
    }
}

/// Values given on the command line; they override everything else.
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// `--config`
    pub config: Option<PathBuf>,
    /// `--socket`
    pub socket: Option<PathBuf>,
    /// `--socket-group`
    pub socket_group: Option<String>,
    /// `--allow-shared-socket-dir`
    pub allow_shared_socket_dir: bool,
    /// `--log-level`
    pub log_level: Option<String>,
    /// `--max-request-bytes`
    pub max_request_bytes: Option<u64>,
    /// `--workers`
    pub workers: Option<usize>,
    /// `--python`
    pub python: Option<PathBuf>,
}

impl Config {
    /// Builds the configuration from the file, the process environment and
    /// the flags, and validates it.
    pub fn load(flags: &Flags) -> Result<Config, ConfigError> {
        Config::load_with(flags, &|name| std::env::var(name).ok())
    }

    /// [`load`](Self::load) with the environment passed in.
    pub fn load_with(
        flags: &Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let file = flags
            .config
            .clone()
            .or_else(|| {
                env("AGENTOS_CONFIG")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(|| {
                let default = Path::new(DEFAULT_CONFIG_PATH);
                default.exists().then(|| default.to_path_buf())
            });
        let mut config = match &file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        config.apply_env(env)?;
        config.apply_flags(flags);
        config.validate()?;
        Ok(config)
    }

    /// Reads a config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|source| {
            let (path, source) = (path.to_path_buf(), Box::new(source));
            // A block pasted from an MCP server's README: say what to do
            // with it rather than where the TOML parser stumbled.
            if text.contains("\"mcpServers\"") {
                ConfigError::PastedMcpJson { path, source }
            } else {
                ConfigError::Parse { path, source }
            }
        })?;
        config.file = Some(path.to_path_buf());
        Ok(config)
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let get = |name: &'static str| env(name).filter(|v| !v.is_empty());
        if let Some(v) = get(socket_path::SOCKET_ENV) {
            self.socket = Some(PathBuf::from(v));
        }
        if let Some(v) = get("AGENTOS_SOCKET_GROUP") {
            self.socket_group = Some(v);
        }
        if let Some(v) = get("AGENTOS_LOG_LEVEL") {
            self.log_level = Some(v);
        }
        if let Some(v) = get("AGENTOS_PYTHON") {
            self.agents.python = Some(PathBuf::from(v));
        }
        if let Some(v) = get("AGENTOS_AGENT_LOG_DIR") {
            self.agents.log_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = get("AGENTOS_FLEET_DATABASE") {
            self.fleet.database = Some(v.into());
        }
        if let Some(v) = get("AGENTOS_STATE_DIR") {
            self.tasks.state_dir = Some(PathBuf::from(v));
        }
        parse_env(
            &get,
            "AGENTOS_MAX_REQUEST_BYTES",
            &mut self.max_request_bytes,
        )?;
        parse_env(&get, "AGENTOS_MAX_IN_FLIGHT", &mut self.max_in_flight)?;
        parse_env(
            &get,
            "AGENTOS_SESSION_DISK_BYTES",
            &mut self.exec.session_disk_bytes,
        )?;
        parse_env(
            &get,
            "AGENTOS_ALLOW_SHARED_SOCKET_DIR",
            &mut self.allow_shared_socket_dir,
        )?;
        parse_env(&get, "AGENTOS_MAX_CONNECTIONS", &mut self.max_connections)?;
        parse_env(&get, "AGENTOS_WORKERS", &mut self.workers)?;
        self.llm.apply_env(&get)?;
        Ok(())
    }

    fn apply_flags(&mut self, flags: &Flags) {
        if let Some(v) = &flags.socket {
            self.socket = Some(v.clone());
        }
        if let Some(v) = &flags.socket_group {
            self.socket_group = Some(v.clone());
        }
        if flags.allow_shared_socket_dir {
            self.allow_shared_socket_dir = true;
        }
        if let Some(v) = &flags.log_level {
            self.log_level = Some(v.clone());
        }
        if let Some(v) = flags.max_request_bytes {
            self.max_request_bytes = v;
        }
        if let Some(v) = flags.workers {
            self.workers = v;
        }
        if let Some(v) = &flags.python {
            self.agents.python = Some(v.clone());
        }
    }

    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if !(1..=MAX_REPLY_BYTES).contains(&self.max_request_bytes) {
            // A NOOP echoes its request, so a request may not exceed the
            // largest reply clients are required to accept.
            return invalid(
                "max_request_bytes",
                format!(
                    "{} is outside 1..={MAX_REPLY_BYTES}",
                    self.max_request_bytes
                ),
            );
        }
        if !(1..=65_536).contains(&self.max_in_flight) {
            return invalid(
                "max_in_flight",
                format!("{} is outside 1..=65536", self.max_in_flight),
            );
        }
        if self.max_connections == 0 {
            return invalid("max_connections", "must be at least 1".into());
        }

        if !(1..=256).contains(&self.workers) {
            return invalid("workers", format!("{} is outside 1..=256", self.workers));
        }
        if self.write_high_water == 0 {
            return invalid("write_high_water", "must be at least 1".into());
        }
        if self.write_stall_timeout_ms == 0 {
            return invalid("write_stall_timeout_ms", "must be at least 1".into());
        }
        if self.frame_timeout_ms == 0 {
            return invalid("frame_timeout_ms", "must be at least 1".into());
        }
        if self.max_queued_jobs == 0 {
            return invalid("max_queued_jobs", "must be at least 1".into());
        }
        if let Some(group) = &self.socket_group {
            if group.is_empty() {
                return invalid("socket_group", "must not be empty".into());
            }
        }
        self.agents.validate()?;
        self.llm.validate()?;
        self.exec.validate()?;
        self.mcp.validate()?;
        self.network.validate()?;
        self.metrics.validate()?;
        self.tracing.validate()?;
        self.tasks.validate()?;
        self.state.validate()?;
        self.fleet.validate()?;
        self.audit.validate()?;
        if let Some(name) = self
            .debug
            .defer_opcodes
            .iter()
            .find(|name| Opcode::from_name(name).is_none())
        {
            return invalid(
                "debug.defer_opcodes",
                format!("{name:?} is not an opcode name"),
            );
        }
        Ok(())
    }

    /// The socket path, resolved by the protocol's rule.
    pub fn socket_path(&self) -> PathBuf {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        socket_path::resolve_socket_path_with(
            self.socket.as_deref(),
            None,
            euid,
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        )
    }

    /// Opcodes whose replies go through the worker pool (diagnostics).
    pub fn deferred_opcodes(&self) -> Vec<Opcode> {
        self.debug
            .defer_opcodes
            .iter()
            .filter_map(|name| Opcode::from_name(name))
            .collect()
    }

    /// [`write_stall_timeout_ms`](Self::write_stall_timeout_ms) as a duration.
    pub fn write_stall_timeout(&self) -> Duration {
        Duration::from_millis(self.write_stall_timeout_ms)
    }

    /// [`frame_timeout_ms`](Self::frame_timeout_ms) as a duration.
    pub fn frame_timeout(&self) -> Duration {
        Duration::from_millis(self.frame_timeout_ms)
    }

    /// Connections all agents together may hold: `max_connections` less
    /// the operators' reserve, which is at most half of it.
    pub fn agents_connection_share(&self) -> usize {
        let reserve = self
            .reserved_operator_connections
            .min(self.max_connections / 2);
        self.max_connections - reserve
    }

    /// [`shutdown_grace_ms`](Self::shutdown_grace_ms) as a duration.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn write_config(text: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn flags_beat_environment_beats_file() {
        let file = write_config("socket = \"/file.sock\"\nmax_request_bytes = 1000\nworkers = 2\n");
        let env = env_of(&[
            ("AGENTOS_SOCKET", "/env.sock"),
            ("AGENTOS_MAX_REQUEST_BYTES", "2000"),
        ]);
        let flags = Flags {
            config: Some(file.path().to_path_buf()),
            socket: Some("/flag.sock".into()),
            ..Flags::default()
        };
        let config = Config::load_with(&flags, &env).unwrap();
        assert_eq!(config.socket.as_deref(), Some(Path::new("/flag.sock")));
        assert_eq!(config.max_request_bytes, 2000);
        assert_eq!(config.workers, 2);
    }

    #[test]
    fn unknown_keys_in_the_file_are_refused_by_name() {
        let file = write_config("max_reqest_bytes = 5\n");
        let err = Config::from_file(file.path()).unwrap_err();
        assert!(err.to_string().contains("max_reqest_bytes"), "{err}");
    }

    #[test]
    fn a_pasted_mcp_servers_block_is_named_with_the_command_that_imports_it() {
        let pasted = "\"mcpServers\": {\n  \"time\": {\"command\": \"uvx\", \"args\": [\"mcp-server-time\"]}\n}\n";
        let file = write_config(pasted);
        let err = Config::from_file(file.path()).unwrap_err();
        assert!(matches!(err, ConfigError::PastedMcpJson { .. }), "{err}");
        assert!(
            err.to_string().contains("agentos mcp-servers import FILE"),
            "{err}"
        );
    }

    #[test]
    fn bad_environment_values_name_the_variable() {
        let env = env_of(&[("AGENTOS_WORKERS", "many")]);
        let flags = Flags {
            config: Some("/dev/null".into()),
            ..Flags::default()
        };
        let err = Config::load_with(&flags, &env).unwrap_err();
        assert!(err.to_string().contains("AGENTOS_WORKERS"), "{err}");
    }

    #[test]
    fn request_limit_cannot_exceed_the_reply_limit() {
        let config = Config {
            max_request_bytes: MAX_REPLY_BYTES + 1,
            ..Config::default()
        };
        assert!(config.validate().is_err());
    }

    #[test]
    fn defer_opcodes_must_be_opcode_names() {
        let mut config = Config::default();
        config.debug.defer_opcodes = vec!["hello".into(), "noop".into()];
        assert!(config.validate().is_ok());
        assert_eq!(config.deferred_opcodes(), vec![Opcode::HELLO, Opcode::NOOP]);
        config.debug.defer_opcodes.push("warp".into());
        assert!(config.validate().is_err());
    }
}
