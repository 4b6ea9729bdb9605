//! What differs between cgroup v1 and v2 — where the controllers live, how
//! a parent hands controllers to its children, which files hold the
//! figures, how an OOM kill is signalled — as one trait both versions
//! implement, with the figures and errors they share.

use std::fmt;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use agentos_proto::payload::CgroupVersion;

use super::freezer::Freezer;

/// Figures read from an agent's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Memory in use now, in bytes.
    pub memory_current: u64,
    /// Highest memory use seen, in bytes (0 where the kernel keeps no peak).
    pub memory_peak: u64,
    /// CPU time used, in microseconds.
    pub cpu_usage_usec: u64,
    /// Periods in which the quota stopped the group.
    pub nr_throttled: u64,
    /// Time the quota kept the group stopped, in microseconds.
    pub throttled_usec: u64,
    /// Processes the memory controller has killed.
    pub oom_kills: u64,
    /// Processes and threads in the group now.
    pub pids_current: u64,
    /// Whether the freezer has stopped the group (PAUSE).
    pub frozen: bool,
}

/// The version-specific parts of cgroup management.
pub trait Backend: fmt::Debug + Send + Sync {
    fn version(&self) -> CgroupVersion;
    /// A cgroups-rs hierarchy whose controllers live where this backend's do.
    fn hierarchy(&self) -> Box<dyn cgroups_rs::Hierarchy>;
    /// The directories that make up the cgroup `rel`: one per hierarchy.
    fn dirs(&self, rel: &Path) -> Vec<PathBuf>;
    /// Lets the children of `rel` use our controllers (v2's subtree_control).
    fn delegate(&self, rel: &Path) -> io::Result<()>;
    /// The swap limit that means "no swap beyond the memory limit", if the
    /// kernel accounts swap at all.
    fn no_swap_limit(&self, rel: &Path, memory: u64) -> Option<i64>;
    /// The figures LIST shows.
    fn stats(&self, rel: &Path) -> CgroupStats;
    /// Processes the memory controller has killed in `rel`.
    fn oom_kills(&self, rel: &Path) -> u64;
    /// The memory limit in force in `rel`, in bytes (`None`: unreadable or
    /// unlimited).
    fn memory_limit(&self, rel: &Path) -> Option<u64>;
    /// Memory `rel` (and what is below it) is charged for now, in bytes.
    fn memory_in_use(&self, rel: &Path) -> u64;
    /// Of that, page cache (and shared memory), in bytes.
    fn memory_cache(&self, rel: &Path) -> u64;
    /// CPU time `rel` has used, in microseconds.
    fn cpu_usage_usec(&self, rel: &Path) -> u64;
    /// Asks the kernel to reclaim what it can of the memory `rel` is
    /// charged for (page cache; not the pages of live processes or of files
    /// still open). May take a moment: never on the reactor.
    fn reclaim(&self, rel: &Path) -> io::Result<()>;
    /// Whether a cgroup made below `rel` while processes live in `rel` can
    /// carry limits of its own (v1: always; v2: never — a cgroup with
    /// processes hands no controllers down).
    fn limits_beside_processes(&self) -> bool;
    /// A descriptor that becomes readable when `rel` sees an OOM kill.
    fn watch_oom(&self, rel: &Path) -> io::Result<OwnedFd>;
    /// Consumes the readiness of a [`watch_oom`](Self::watch_oom) descriptor.
    fn drain_watch(&self, fd: &OwnedFd);
    /// The freezer of `rel`, if this host has one.
    fn freezer(&self, rel: &Path) -> Option<Freezer>;
    /// The file a process writes "0" to in order to join `rel`, per hierarchy.
    fn procs_files(&self, rel: &Path) -> Vec<PathBuf> {
        self.dirs(rel)
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }
}

/// Why this host offers no usable cgroups, in the sentence a SPAWN reply
/// and LIST show in `degraded_reason`.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// Creating cgroups needs root.
    #[error(
        "agentosd is not running as root, so it cannot create cgroups: \
         memory, cpu and pids limits are not enforced"
    )]
    NotRoot,
    /// A file that says which controllers exist could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        /// `/proc/self/mountinfo` (v1) or `cgroup.controllers` (v2).
        path: PathBuf,
        /// Why it could not be read.
        source: io::Error,
    },
    /// The unified tree lacks controllers agents need.
    #[error(
        "cgroup v2 at {} does not offer the {} controller(s): limits cannot be enforced",
        mount.display(),
        missing.join(", ")
    )]
    MissingV2Controllers {
        /// Where the unified tree is mounted.
        mount: PathBuf,
        /// The controllers it lacks.
        missing: Vec<&'static str>,
    },
    /// No v1 hierarchy carries a controller agents need (and the host is
    /// not v2).
    #[error(
        "no cgroup v1 hierarchy with the {controller} controller is mounted, and \
         /sys/fs/cgroup is not cgroup v2: limits cannot be enforced"
    )]
    MissingV1Hierarchy {
        /// The first controller found missing.
        controller: &'static str,
    },
}

/// Reads a file of `key value` lines (cpu.stat, memory.events) into the
/// value of `key`, 0 when absent.
pub fn keyed_value(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(key))
                .then(|| words.next().and_then(|v| v.parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

/// Reads a file holding one number, 0 when absent or unreadable.
pub fn number_in(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}
