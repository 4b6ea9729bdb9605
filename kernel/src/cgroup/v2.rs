//! cgroup v2: one unified tree at `/sys/fs/cgroup`. A parent must hand its
//! controllers down (`cgroup.subtree_control`) before its children get them.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use cgroups_rs::cgroup::Cgroup;
use cgroups_rs::cpu::CpuController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Hierarchy, Subsystem};

use agentos_proto::payload::CgroupVersion;

use super::backend::{keyed_value, number_in, Backend, CgroupStats, DetectError};
use super::freezer::Freezer;

const MOUNT: &str = "/sys/fs/cgroup";
/// Controllers agents need, in the order they are delegated.
const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// The unified hierarchy.
#[derive(Clone, Debug)]
pub struct Unified {
    root: PathBuf,
}

impl Unified {
    /// `Ok(None)` when `/sys/fs/cgroup` is not cgroup v2 (v1 or hybrid);
    /// `Err` when it is, but lacks a controller agents need.
    pub fn detect() -> Result<Option<Unified>, DetectError> {
        let Ok(fs) = nix::sys::statfs::statfs(MOUNT) else {
            return Ok(None);
        };
        if fs.filesystem_type() != nix::sys::statfs::CGROUP2_SUPER_MAGIC {
            return Ok(None);
        }
        let unified = Unified { root: MOUNT.into() };
        let listing = unified.root.join("cgroup.controllers");
        let available = fs::read_to_string(&listing).map_err(|source| DetectError::Unreadable {
            path: listing.clone(),
            source,
        })?;
        let missing: Vec<&str> = CONTROLLERS
            .into_iter()
            .filter(|c| !available.split_whitespace().any(|a| a == *c))
            .collect();
        if !missing.is_empty() {
            return Err(DetectError::MissingV2Controllers {
                mount: unified.root,
                missing,
            });
        }
        Ok(Some(unified))
    }

    /// A unified tree at `root` (for tests against a fake cgroupfs).
    #[cfg(test)]
    pub fn at(root: &Path) -> Unified {
        Unified {
            root: root.to_path_buf(),
        }
    }
}

impl Backend for Unified {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn hierarchy(&self) -> Box<dyn Hierarchy> {
        Box::new(UnifiedHierarchy(self.clone()))
    }

    fn dirs(&self, rel: &Path) -> Vec<PathBuf> {
        vec![self.root.join(rel)]
    }

    fn delegate(&self, rel: &Path) -> io::Result<()> {
        // One write for all: cgroupfs takes a space-separated list and
        // applies it whole or not at all.
        let request: Vec<String> = CONTROLLERS.iter().map(|c| format!("+{c}")).collect();
        fs::OpenOptions::new()
            .write(true)
            .open(self.root.join(rel).join("cgroup.subtree_control"))?
            .write_all(request.join(" ").as_bytes())
    }

    fn no_swap_limit(&self, rel: &Path, _memory: u64) -> Option<i64> {
        // memory.swap.max is swap on top of memory.max: none at all.
        self.root
            .join(rel)
            .join("memory.swap.max")
            .exists()
            .then_some(0)
    }

    fn stats(&self, rel: &Path) -> CgroupStats {
        let dir = self.root.join(rel);
        let cpu_stat = fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
        CgroupStats {
            memory_current: number_in(&dir.join("memory.current")),
            memory_peak: number_in(&dir.join("memory.peak")),
            cpu_usage_usec: keyed_value(&cpu_stat, "usage_usec"),
            nr_throttled: keyed_value(&cpu_stat, "nr_throttled"),
            throttled_usec: keyed_value(&cpu_stat, "throttled_usec"),
            oom_kills: self.oom_kills(rel),
            pids_current: number_in(&dir.join("pids.current")),
            // The freezer's state is read with it (`AgentCgroup::stats`).
            frozen: false,
        }
    }

    fn memory_limit(&self, rel: &Path) -> Option<u64> {
        // "max" (no limit) parses as nothing.
        fs::read_to_string(self.root.join(rel).join("memory.max"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn oom_kills(&self, rel: &Path) -> u64 {
        // `oom_kill` counts kills; `oom` counts OOM events, kills or not.
        let events =
            fs::read_to_string(self.root.join(rel).join("memory.events")).unwrap_or_default();
        keyed_value(&events, "oom_kill")
    }

    fn memory_in_use(&self, rel: &Path) -> u64 {
        number_in(&self.root.join(rel).join("memory.current"))
    }

    fn cpu_usage_usec(&self, rel: &Path) -> u64 {
        let stat = fs::read_to_string(self.root.join(rel).join("cpu.stat"));
        keyed_value(&stat.unwrap_or_default(), "usage_usec")
    }

    fn memory_cache(&self, rel: &Path) -> u64 {
        let stat = fs::read_to_string(self.root.join(rel).join("memory.stat"));
        keyed_value(&stat.unwrap_or_default(), "file")
    }

    fn reclaim(&self, rel: &Path) -> io::Result<()> {
        // Asks for as much as it holds; the kernel reclaims what it can and
        // answers EAGAIN if that was less.
        let dir = self.root.join(rel);
        let held = number_in(&dir.join("memory.current"));
        match fs::write(dir.join("memory.reclaim"), held.to_string()) {
            Err(err) if err.raw_os_error() == Some(libc::EAGAIN) => Ok(()),
            done => done,
        }
    }

    fn limits_beside_processes(&self) -> bool {
        false
    }

    fn watch_oom(&self, rel: &Path) -> io::Result<OwnedFd> {
        // memory.events is modified whenever one of its counters changes.
        // SAFETY: inotify_init1 has no memory-safety preconditions; the
        // result is checked and owned at once.
        let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let inotify = unsafe { OwnedFd::from_raw_fd(raw) };
        let path = std::ffi::CString::new(
            self.root
                .join(rel)
                .join("memory.events")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid inotify descriptor and NUL-terminated path.
        let watch =
            unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) };
        if watch < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(inotify)
    }

    fn freezer(&self, rel: &Path) -> Option<Freezer> {
        Some(Freezer::new(CgroupVersion::V2, self.root.join(rel)))
    }

    fn drain_watch(&self, fd: &OwnedFd) {
        let mut events = [0u8; 4096];
        // SAFETY: reading into a buffer of the given length from our
        // non-blocking inotify descriptor, until it is empty.
        while unsafe { libc::read(fd.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) } > 0 {}
    }
}

/// The unified tree in the shape cgroups-rs expects.
#[derive(Clone, Debug)]
struct UnifiedHierarchy(Unified);

impl Hierarchy for UnifiedHierarchy {
    fn subsystems(&self) -> Vec<Subsystem> {
        let root = self.0.root.clone();
        vec![
            Subsystem::Mem(MemController::new(root.clone(), true)),
            Subsystem::Cpu(CpuController::new(root.clone(), true)),
            Subsystem::Pid(PidController::new(root, true)),
        ]
    }

    fn root(&self) -> PathBuf {
        self.0.root.clone()
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        let parent = Path::new(path).parent().unwrap_or(Path::new(""));
        Cgroup::load(Box::new(self.clone()), parent)
    }

    fn v2(&self) -> bool {
        true
    }
}
