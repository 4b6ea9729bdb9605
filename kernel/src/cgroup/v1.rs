//! cgroup v1: one hierarchy per controller, each mounted on its own
//! (`/sys/fs/cgroup/memory`, `/sys/fs/cgroup/cpu`, …). This is what hybrid
//! hosts use for limits, their unified tree having no controllers.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use cgroups_rs::cgroup::Cgroup;
use cgroups_rs::cpu::CpuController;
use cgroups_rs::cpuacct::CpuAcctController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Hierarchy, Subsystem};

use agentos_proto::payload::CgroupVersion;

use super::backend::{keyed_value, number_in, Backend, CgroupStats, DetectError};
use super::freezer::Freezer;

/// Where each controller's hierarchy is mounted.
#[derive(Clone, Debug)]
pub struct Legacy {
    memory: PathBuf,
    cpu: PathBuf,
    cpuacct: PathBuf,
    pids: PathBuf,
    /// The freezer's hierarchy, if the host mounts one (PAUSE needs it).
    freezer: Option<PathBuf>,
}

impl Legacy {
    /// Finds the memory, cpu, cpuacct and pids hierarchies in
    /// `/proc/self/mountinfo`; `Err` names what is missing.
    pub fn detect() -> Result<Legacy, DetectError> {
        const MOUNTINFO: &str = "/proc/self/mountinfo";
        let mountinfo =
            fs::read_to_string(MOUNTINFO).map_err(|source| DetectError::Unreadable {
                path: MOUNTINFO.into(),
                source,
            })?;
        let find = |controller: &'static str| {
            mountpoint_of(&mountinfo, controller)
                .ok_or(DetectError::MissingV1Hierarchy { controller })
        };
        Ok(Legacy {
            memory: find("memory")?,
            cpu: find("cpu")?,
            cpuacct: find("cpuacct")?,
            pids: find("pids")?,
            freezer: mountpoint_of(&mountinfo, "freezer"),
        })
    }

    /// Hierarchies in `root/memory`, `root/cpu`, `root/cpuacct`,
    /// `root/pids` (for tests against a fake cgroupfs).
    #[cfg(test)]
    pub fn at(root: &Path) -> Legacy {
        Legacy {
            memory: root.join("memory"),
            cpu: root.join("cpu"),
            cpuacct: root.join("cpuacct"),
            pids: root.join("pids"),
            freezer: None,
        }
    }
}

/// The mount point of the v1 hierarchy carrying `controller`.
fn mountpoint_of(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "<id> <parent> <dev> <root> <mountpoint> <opts> [tags] - <fstype> <source> <superopts>"
        let (before, after) = line.split_once(" - ")?;
        let mut fields = after.split_whitespace();
        if fields.next()? != "cgroup" {
            return None;
        }
        let super_opts = fields.nth(1)?;
        super_opts
            .split(',')
            .any(|opt| opt == controller)
            .then(|| before.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

impl Backend for Legacy {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn hierarchy(&self) -> Box<dyn Hierarchy> {
        Box::new(LegacyHierarchy(self.clone()))
    }

    fn dirs(&self, rel: &Path) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = [&self.memory, &self.cpu, &self.cpuacct, &self.pids]
            .into_iter()
            .chain(&self.freezer)
            .map(|root| root.join(rel))
            .collect();
        // cpu and cpuacct are often mounted together ("cpu,cpuacct").
        dirs.dedup();
        dirs
    }

    fn delegate(&self, _rel: &Path) -> io::Result<()> {
        // v1 children get every controller of their hierarchy by default.
        Ok(())
    }

    fn no_swap_limit(&self, rel: &Path, memory: u64) -> Option<i64> {
        // memory+swap equal to memory: no swap on top. The file exists only
        // where the kernel accounts swap.
        self.memory
            .join(rel)
            .join("memory.memsw.limit_in_bytes")
            .exists()
            .then(|| i64::try_from(memory).unwrap_or(i64::MAX))
    }

    fn stats(&self, rel: &Path) -> CgroupStats {
        let memory = self.memory.join(rel);
        let cpu_stat = fs::read_to_string(self.cpu.join(rel).join("cpu.stat")).unwrap_or_default();
        CgroupStats {
            memory_current: number_in(&memory.join("memory.usage_in_bytes")),
            memory_peak: number_in(&memory.join("memory.max_usage_in_bytes")),
            cpu_usage_usec: self.cpu_usage_usec(rel),
            nr_throttled: keyed_value(&cpu_stat, "nr_throttled"),
            throttled_usec: keyed_value(&cpu_stat, "throttled_time") / 1000,
            oom_kills: self.oom_kills(rel),
            pids_current: number_in(&self.pids.join(rel).join("pids.current")),
            // The freezer's state is read with it (`AgentCgroup::stats`).
            frozen: false,
        }
    }

    fn oom_kills(&self, rel: &Path) -> u64 {
        let control = fs::read_to_string(self.memory.join(rel).join("memory.oom_control"))
            .unwrap_or_default();
        keyed_value(&control, "oom_kill")
    }

    fn memory_limit(&self, rel: &Path) -> Option<u64> {
        fs::read_to_string(self.memory.join(rel).join("memory.limit_in_bytes"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn memory_in_use(&self, rel: &Path) -> u64 {
        number_in(&self.memory.join(rel).join("memory.usage_in_bytes"))
    }

    fn cpu_usage_usec(&self, rel: &Path) -> u64 {
        number_in(&self.cpuacct.join(rel).join("cpuacct.usage")) / 1000
    }

    fn memory_cache(&self, rel: &Path) -> u64 {
        let stat = fs::read_to_string(self.memory.join(rel).join("memory.stat"));
        keyed_value(&stat.unwrap_or_default(), "total_cache")
    }

    fn reclaim(&self, rel: &Path) -> io::Result<()> {
        // Reclaims all it can of the cgroup's charges (it has no processes
        // by then: those of a live process stay).
        fs::write(self.memory.join(rel).join("memory.force_empty"), "0")
    }

    fn limits_beside_processes(&self) -> bool {
        true
    }

    fn watch_oom(&self, rel: &Path) -> io::Result<OwnedFd> {
        // v1 reports OOM through an eventfd registered on memory.oom_control
        // via cgroup.event_control: "<eventfd> <oom_control fd>".
        // SAFETY: eventfd has no memory-safety preconditions; the result is
        // checked and owned at once.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let event = unsafe { OwnedFd::from_raw_fd(raw) };
        let dir = self.memory.join(rel);
        let control = fs::File::open(dir.join("memory.oom_control"))?;
        let mut register = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.event_control"))?;
        // One write: cgroupfs parses each write(2) on its own.
        let request = format!("{} {}", event.as_raw_fd(), control.as_raw_fd());
        register.write_all(request.as_bytes())?;
        Ok(event)
    }

    fn freezer(&self, rel: &Path) -> Option<Freezer> {
        let root = self.freezer.as_ref()?;
        Some(Freezer::new(CgroupVersion::V1, root.join(rel)))
    }

    fn drain_watch(&self, fd: &OwnedFd) {
        let mut counter = [0u8; 8];
        // SAFETY: reading 8 bytes into an 8-byte buffer from our eventfd.
        unsafe {
            libc::read(fd.as_raw_fd(), counter.as_mut_ptr().cast(), counter.len());
        }
    }
}

/// The same hierarchies in the shape cgroups-rs expects.
#[derive(Clone, Debug)]
struct LegacyHierarchy(Legacy);

impl Hierarchy for LegacyHierarchy {
    fn subsystems(&self) -> Vec<Subsystem> {
        vec![
            Subsystem::Mem(MemController::new(self.0.memory.clone(), false)),
            Subsystem::Cpu(CpuController::new(self.0.cpu.clone(), false)),
            Subsystem::CpuAcct(CpuAcctController::new(self.0.cpuacct.clone())),
            Subsystem::Pid(PidController::new(self.0.pids.clone(), false)),
        ]
    }

    fn root(&self) -> PathBuf {
        self.0
            .memory
            .parent()
            .map_or_else(|| self.0.memory.clone(), Path::to_path_buf)
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        let parent = Path::new(path).parent().unwrap_or(Path::new(""));
        Cgroup::load(Box::new(self.clone()), parent)
    }

    fn v2(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_is_searched_by_controller() {
        let mountinfo = "\
35 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 / /sys/fs/cgroup/unified rw,relatime shared:16 - cgroup2 cgroup2 rw
";
        assert_eq!(
            mountpoint_of(mountinfo, "memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            mountpoint_of(mountinfo, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(mountpoint_of(mountinfo, "pids"), None);
    }

    #[test]
    fn co_mounted_controllers_share_one_directory() {
        let legacy = Legacy {
            memory: "/m".into(),
            cpu: "/c".into(),
            cpuacct: "/c".into(),
            pids: "/p".into(),
            freezer: Some("/f".into()),
        };
        assert_eq!(
            legacy.dirs(Path::new("agentos")),
            vec![
                PathBuf::from("/m/agentos"),
                PathBuf::from("/c/agentos"),
                PathBuf::from("/p/agentos"),
                PathBuf::from("/f/agentos")
            ]
        );
    }
}
