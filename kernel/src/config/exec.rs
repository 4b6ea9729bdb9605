//! EXEC's settings: the `[exec]` table of the config file.

use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;

/// The smallest session disk: an ext4 filesystem with room for files
/// beside its journal and tables.
pub const MIN_SESSION_DISK: u64 = 16 << 20;

/// How EXEC runs code.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// The Python that exec hosts run (and runs use).
    pub python: PathBuf,
    /// Exec hosts kept running: each a sandbox holding one interpreter that
    /// prepares runs.
    pub hosts: usize,
    /// Runs each host keeps prepared and waiting for code.
    pub ready_runs: usize,
    /// Of the prepared runs in all, how many have a shell started for a
    /// bash run (a shell costs a process start, wasted on a Python run).
    pub ready_shells: usize,
    /// Runs one owner (an agent with its whole tree, or an operator's uid)
    /// may hold at once; the rest wait their turn. Default: half of
    /// `hosts × ready_runs`, at least 1. Agents together always leave one
    /// of those for operators.
    pub max_running_per_owner: Option<usize>,
    /// Bytes each of a run's streams keeps (its head and its tail).
    pub output_bytes: usize,
    /// A run's timeout when it gives none, in milliseconds.
    pub default_timeout_ms: u64,
    /// A session unused this long has its interpreter ended, in seconds
    /// (its disk stays, and its next run starts a fresh interpreter).
    pub session_idle_secs: u64,
    /// A session unused this long is hibernated instead, in seconds: its
    /// globals saved and its interpreter ended, its next run or a RESUME
    /// bringing it back with them (0: never; sessions need disks).
    pub idle_hibernate_secs: u64,
    /// Each session's disk (its `/workspace`, home and `/tmp`), in bytes:
    /// allocated on the host when the session opens, and full at this.
    pub session_disk_bytes: u64,
    /// The disks of one owner's sessions and volumes together, in bytes.
    pub owner_disk_bytes: u64,
    /// A volume's size when `create_volume` gives none, in bytes.
    pub volume_bytes: u64,
    /// An operator's session unused this long is removed, disk and all, in
    /// seconds (0: kept until closed).
    pub session_retention_secs: u64,
    /// Sessions one owner (an agent, or an operator's uid) may hold.
    pub max_sessions: usize,
    /// Sessions all owners together may hold: each keeps an interpreter.
    pub max_sessions_total: usize,
    /// Largest file a run may bring in or collect, in bytes.
    pub max_file_bytes: u64,
    /// A run's memory limit when it gives none, in bytes (never more than
    /// the caller's own).
    pub default_memory: u64,
    /// A run's process limit when it gives none.
    pub default_max_pids: u64,
    /// Bytes of session snapshots one owner's store may keep on disk, each
    /// distinct file counted once.
    pub snapshot_bytes: u64,
    /// Bytes of session snapshots all owners' stores together may keep on
    /// disk.
    pub snapshot_bytes_total: u64,
    /// A template's disk while it is built, in bytes (shrunk to what it
    /// holds once built).
    pub template_disk_bytes: u64,
    /// The package index templates are built from (pip's index URL).
    pub template_index_url: String,
    /// Where a template's build may connect: the index's hosts (network
    /// policy entries), and nothing else.
    pub template_index_hosts: Vec<String>,
    /// A template build's time limit when it gives none, in milliseconds.
    pub template_build_timeout_ms: u64,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            python: PathBuf::from("/usr/bin/python3"),
            hosts: 1,
            ready_runs: 4,
            ready_shells: 1,
            max_running_per_owner: None,
            output_bytes: 64 << 10,
            default_timeout_ms: 30_000,
            session_idle_secs: 900,
            idle_hibernate_secs: 0,
            session_disk_bytes: 1 << 30,
            owner_disk_bytes: 8 << 30,
            volume_bytes: 1 << 30,
            session_retention_secs: 30 * 24 * 3600,
            max_sessions: 8,
            max_sessions_total: 256,
            max_file_bytes: 8 << 20,
            default_memory: 256 << 20,
            default_max_pids: 64,
            snapshot_bytes: 512 << 20,
            snapshot_bytes_total: 2 << 30,
            template_disk_bytes: 4 << 30,
            template_index_url: "https://pypi.org/simple/".into(),
            template_index_hosts: vec!["pypi.org:443".into(), "files.pythonhosted.org:443".into()],
            template_build_timeout_ms: 1_800_000,
        }
    }
}

impl ExecConfig {
    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if !self.python.is_absolute() {
            return invalid("exec.python", "must be an absolute path");
        }
        if self.ready_runs == 0 {
            return invalid("exec.ready_runs", "must be at least 1");
        }
        if self.max_running_per_owner == Some(0) {
            return invalid("exec.max_running_per_owner", "must be at least 1");
        }
        // The marker line between head and tail needs room of its own.
        if !(256..=16 << 20).contains(&self.output_bytes) {
            return invalid("exec.output_bytes", "must be 256 bytes to 16 MiB");
        }
        if !(1..=agentos_proto::payload::MAX_EXEC_TIMEOUT_MS).contains(&self.default_timeout_ms) {
            return invalid("exec.default_timeout_ms", "must be 1 ms to one hour");
        }
        if self.session_idle_secs == 0 {
            return invalid("exec.session_idle_secs", "must be at least 1");
        }
        if self.session_disk_bytes < MIN_SESSION_DISK {
            return invalid("exec.session_disk_bytes", "must be at least 16 MiB");
        }
        if self.volume_bytes < MIN_SESSION_DISK {
            return invalid("exec.volume_bytes", "must be at least 16 MiB");
        }
        if self.template_disk_bytes < MIN_SESSION_DISK {
            return invalid("exec.template_disk_bytes", "must be at least 16 MiB");
        }
        let url = &self.template_index_url;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return invalid("exec.template_index_url", "must be an http(s) URL");
        }
        if !(1..=agentos_proto::payload::MAX_EXEC_TIMEOUT_MS)
            .contains(&self.template_build_timeout_ms)
        {
            return invalid("exec.template_build_timeout_ms", "must be 1 ms to one hour");
        }
        if self.owner_disk_bytes < self.session_disk_bytes {
            return invalid(
                "exec.owner_disk_bytes",
                "must be at least exec.session_disk_bytes",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_nonsense_is_named() {
        assert!(ExecConfig::default().validate().is_ok());
        let tiny = ExecConfig {
            output_bytes: 10,
            ..ExecConfig::default()
        };
        let Err(ConfigError::Invalid { field, .. }) = tiny.validate() else {
            panic!("a 10-byte output cap was accepted");
        };
        assert_eq!(field, "exec.output_bytes");
    }
}
