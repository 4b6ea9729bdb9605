//! TASK's settings: the `[tasks]` table of the config file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::common::{user_state_dir, ConfigError};

/// How background tasks are kept and run.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Where the task store lives (`AGENTOS_STATE_DIR`); default
    /// `/var/lib/agentos` as root, else `$XDG_STATE_HOME/agentos`.
    pub state_dir: Option<PathBuf>,
    /// How long a finished task and its result are kept, in seconds.
    pub retention_secs: u64,
    /// Tasks one owner may have running at once; the rest wait, queued.
    pub max_running_per_owner: usize,
    /// Tasks one owner may have queued.
    pub max_queued_per_owner: usize,
    /// Tasks kept in all: past it, a new task makes room by dropping its
    /// owner's oldest finished one (never another owner's).
    pub max_retained: usize,
    /// Tasks one owner may have kept (the same way).
    pub max_retained_per_owner: usize,
    /// Bytes of finished results kept in memory; older ones are read back
    /// from the store when asked for.
    pub result_cache_bytes: usize,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            state_dir: None,
            retention_secs: 86_400,
            max_running_per_owner: 8,
            max_queued_per_owner: 1024,
            max_retained: 100_000,
            max_retained_per_owner: 20_000,
            result_cache_bytes: 64 << 20,
        }
    }
}

impl TasksConfig {
    /// The state directory of the kernel serving `socket`: the configured
    /// one; else the default (by who runs the daemon) for the default
    /// socket, and a directory of its own under it for any other socket, so
    /// that kernels on different sockets never share a task store. "The
    /// default socket" is the one nothing names: a socket given by
    /// `AGENTOS_SOCKET` is another kernel's as much as one given by
    /// `--socket`.
    pub fn state_dir(&self, socket: &Path) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        let base = Self::default_base();
        if socket == agentos_proto::socket_path::default_socket_path() {
            return base;
        }
        let name: String = socket
            .to_string_lossy()
            .trim_start_matches('/')
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        base.join("sockets").join(name)
    }

    /// Where the kernel serving `socket` starts keeping the way to its
    /// state directory private (each directory 0700 and its own): the
    /// default base when the state directory is a socket's own under it,
    /// so `sockets/` and the socket's directory are private too; else the
    /// state directory itself — a configured one's parents are the
    /// operator's, never changed.
    pub fn private_from(&self, socket: &Path) -> PathBuf {
        if self.state_dir.is_some() {
            return self.state_dir(socket);
        }
        Self::default_base()
    }

    fn default_base() -> PathBuf {
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/lib/agentos");
        }
        user_state_dir()
    }

    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.state_dir.as_ref().is_some_and(|d| !d.is_absolute()) {
            return invalid("tasks.state_dir", "must be an absolute path");
        }
        if self.retention_secs == 0 {
            return invalid("tasks.retention_secs", "must be at least 1");
        }
        if self.max_running_per_owner == 0 || self.max_queued_per_owner == 0 {
            return invalid("tasks.max_running_per_owner", "limits must be at least 1");
        }
        if self.max_retained < 100 || self.max_retained_per_owner < 100 {
            return invalid("tasks.max_retained", "limits must be at least 100");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sockets_own_store_is_private_from_the_default_base_and_a_configured_one_alone() {
        let config = TasksConfig::default();
        let socket = Path::new("/tmp/some test/agentos.sock");
        let dir = config.state_dir(socket);
        let from = config.private_from(socket);
        assert_eq!(
            dir.strip_prefix(&from).unwrap(),
            Path::new("sockets/tmp_some_test_agentos.sock")
        );
        let configured = TasksConfig {
            state_dir: Some(PathBuf::from("/srv/agentos/state")),
            ..TasksConfig::default()
        };
        assert_eq!(
            configured.private_from(socket),
            Path::new("/srv/agentos/state")
        );
        assert_eq!(
            configured.state_dir(socket),
            configured.private_from(socket)
        );
    }
}
