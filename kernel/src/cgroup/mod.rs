//! cgroups: one parent `agentos/`, one child per daemon instance, one
//! grandchild per agent — `agentos/agentosd-<pid>/<agent>` — in every
//! hierarchy that carries a controller we use (memory, cpu, cpuacct and pids
//! on v1; the single unified tree on v2).
//!
//! The version-specific parts — where the controllers live, how a parent
//! hands controllers to its children, which files hold the figures, how an
//! OOM kill is signalled — sit behind `Backend`, with `v1.rs` and `v2.rs`
//! implementations. Limits are written through `cgroups-rs`, over
//! hierarchies rooted where our backends say (so tests can point them at a
//! fake cgroupfs in a temporary directory); the figures LIST needs are read
//! straight from their three or four files rather than through its
//! whole-controller readers, which read a dozen.
//!
//! Several daemons may share a host: each works only inside its own
//! instance directory. One that died without cleaning up (kill -9) leaves an
//! instance whose pid is no longer an agentosd; the next daemon to start
//! kills what is left in it and removes it.

mod backend;
mod freezer;
mod v1;
mod v2;

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use agentos_proto::payload::CgroupVersion;
use backend::Backend;
pub use backend::{CgroupStats, DetectError};
pub use freezer::Freezer;

use agentos_proto::payload::Limits;
use cgroups_rs::{Cgroup, MaxValue, Resources};

/// Name of the directory holding every daemon's cgroups.
pub const BASE: &str = "agentos";
const INSTANCE_PREFIX: &str = "agentosd-";

/// Limits for one agent, with defaults already applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Hard memory limit in bytes; swap is not allowed on top.
    pub memory: u64,
    /// CPU time per period in microseconds; `None` for no quota.
    pub cpu_quota: Option<u64>,
    /// The CPU period in microseconds.
    pub cpu_period: u64,
    /// Most processes and threads at once.
    pub max_pids: u64,
}

impl CgroupLimits {
    /// No limit at all.
    pub const NONE: CgroupLimits = CgroupLimits {
        memory: u64::MAX,
        cpu_quota: None,
        cpu_period: 100_000,
        max_pids: u64::MAX,
    };

    /// The limits as the protocol states them: none where there is none.
    pub fn stated(&self) -> Limits {
        Limits {
            memory: (self.memory != u64::MAX).then_some(self.memory),
            cpu_quota: self.cpu_quota,
            cpu_period: Some(self.cpu_period),
            max_pids: (self.max_pids != u64::MAX).then_some(self.max_pids),
        }
    }
}

/// What went wrong with a cgroup operation.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// cgroups-rs refused to apply a limit.
    #[error("cannot apply limits to {}: {message}", path.display())]
    Limits {
        /// The cgroup.
        path: PathBuf,
        /// What cgroups-rs said.
        message: String,
    },
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// This daemon's cgroups.
#[derive(Debug)]
pub struct Cgroups {
    backend: Arc<dyn Backend>,
    /// `agentos/agentosd-<pid>`, relative to each hierarchy.
    instance: PathBuf,
}

impl Cgroups {
    /// Finds usable controllers on this host. `Err` says why there are none
    /// (not root, controllers missing); its sentence is for `degraded_reason`.
    pub fn detect() -> Result<Cgroups, DetectError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(DetectError::NotRoot);
        }
        let backend: Arc<dyn Backend> = match v2::Unified::detect() {
            Ok(Some(unified)) => Arc::new(unified),
            Ok(None) => Arc::new(v1::Legacy::detect()?),
            Err(reason) => return Err(reason),
        };
        Ok(Cgroups::with_backend(backend, std::process::id()))
    }

    fn with_backend(backend: Arc<dyn Backend>, pid: u32) -> Cgroups {
        Cgroups {
            backend,
            instance: Path::new(BASE).join(format!("{INSTANCE_PREFIX}{pid}")),
        }
    }

    /// A v1 manager over controller directories named by `roots` (for tests
    /// against a fake cgroupfs).
    #[cfg(test)]
    fn fake_v1(root: &Path, pid: u32) -> Cgroups {
        Cgroups::with_backend(Arc::new(v1::Legacy::at(root)), pid)
    }

    /// A v2 manager over a unified tree at `root` (for tests).
    #[cfg(test)]
    fn fake_v2(root: &Path, pid: u32) -> Cgroups {
        Cgroups::with_backend(Arc::new(v2::Unified::at(root)), pid)
    }

    /// Which cgroup version is in use.
    pub fn version(&self) -> CgroupVersion {
        self.backend.version()
    }

    /// Whether agents' cgroups can be frozen (v2; v1 with a freezer
    /// hierarchy).
    pub fn can_freeze(&self) -> bool {
        self.backend.freezer(Path::new(BASE)).is_some()
    }

    /// Creates `agentos/` and this instance's directory, and removes what
    /// dead instances left behind.
    pub fn start(&self) -> Result<(), CgroupError> {
        self.backend.delegate(Path::new("")).map_err(io_error(
            "cannot delegate controllers below",
            Path::new("/"),
        ))?;
        self.make_dirs(Path::new(BASE))?;
        self.backend
            .delegate(Path::new(BASE))
            .map_err(io_error("cannot delegate controllers to", Path::new(BASE)))?;
        self.remove_stale_instances();
        // Another daemon that is stopping removes `agentos/` when it looks
        // empty, which it may just before our instance is in it: make both
        // again then.
        let mut attempts = 0;
        while let Err(err) = self.make_dirs(&self.instance) {
            attempts += 1;
            let parent_gone = matches!(
                &err,
                CgroupError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound
            );
            if attempts == 5 || !parent_gone {
                return Err(err);
            }
            self.make_dirs(Path::new(BASE))?;
        }
        self.backend
            .delegate(&self.instance)
            .map_err(io_error("cannot delegate controllers to", &self.instance))
    }

    /// Creates the cgroup for one agent and applies its limits. An existing
    /// cgroup of that name (from an earlier run of the agent) is reused.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<AgentCgroup, CgroupError> {
        let cgroup = self.make_agent_dirs(name)?;
        cgroup.apply(limits)?;
        Ok(cgroup)
    }

    /// Creates a cgroup inside `parent` (an agent's, whose processes live
    /// in it): what its processes use counts against `parent`'s limits too.
    /// Returns whether it carries `limits` of its own: on v2 it cannot,
    /// and shares `parent`'s.
    pub fn create_inside(
        &self,
        parent: &Path,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<(AgentCgroup, bool), CgroupError> {
        let rel = parent.join(name);
        self.make_dirs(&rel)?;
        let cgroup = AgentCgroup {
            backend: Arc::clone(&self.backend),
            rel,
        };
        let own_limits = self.backend.limits_beside_processes();
        if own_limits {
            if let Err(err) = cgroup.apply(limits) {
                let _ = cgroup.remove();
                return Err(err);
            }
        }
        Ok((cgroup, own_limits))
    }

    fn make_agent_dirs(&self, name: &str) -> Result<AgentCgroup, CgroupError> {
        let rel = self.instance.join(name);
        self.make_dirs(&rel)?;
        Ok(AgentCgroup {
            backend: Arc::clone(&self.backend),
            rel,
        })
    }

    fn make_dirs(&self, rel: &Path) -> Result<(), CgroupError> {
        for dir in self.backend.dirs(rel) {
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(io_error("cannot create cgroup", &dir)(err)),
            }
        }
        Ok(())
    }

    /// Removes this instance's directory, and `agentos/` too if no other
    /// daemon uses it. Agent cgroups must be gone already.
    pub fn shutdown(&self) {
        for dir in self.backend.dirs(&self.instance) {
            if let Err(err) = fs::remove_dir(&dir) {
                if err.kind() != io::ErrorKind::NotFound {
                    log::warn!("cannot remove cgroup {}: {err}", dir.display());
                }
            }
        }
        for dir in self.backend.dirs(Path::new(BASE)) {
            // Busy when another daemon still has its instance there.
            let _ = fs::remove_dir(&dir);
        }
    }

    /// Kills and removes the cgroups of daemons that are gone.
    fn remove_stale_instances(&self) {
        let Some(base) = self.backend.dirs(Path::new(BASE)).into_iter().next() else {
            return;
        };
        let Ok(entries) = fs::read_dir(&base) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(INSTANCE_PREFIX))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(BASE).join(&name) == self.instance || process_exists(pid) {
                continue;
            }
            log::info!("removing cgroups left by agentosd pid {pid}, which is gone");
            let stale = Path::new(BASE).join(&name);
            self.remove_tree(&stale);
        }
    }

    /// Kills every process under `rel` and removes its directories, deepest
    /// first. Used at start-up only, so it may wait a little.
    fn remove_tree(&self, rel: &Path) {
        let children: Vec<PathBuf> = self
            .backend
            .dirs(rel)
            .into_iter()
            .next()
            .and_then(|dir| fs::read_dir(dir).ok())
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| rel.join(e.file_name()))
                    .collect()
            })
            .unwrap_or_default();
        for child in children {
            self.remove_tree(&child);
        }
        let group = AgentCgroup {
            backend: Arc::clone(&self.backend),
            rel: rel.to_path_buf(),
        };
        if let Err(err) = group.remove_within(Duration::from_secs(2)) {
            log::warn!("cannot remove stale cgroup {}: {err}", rel.display());
        }
    }
}

/// How a process tree enters its cgroup.
#[derive(Debug)]
pub enum CgroupJoin<T> {
    /// cgroup v2: clone straight into this cgroup directory
    /// (`CLONE_INTO_CGROUP`), with no migration at all.
    Into(T),
    /// cgroup v1: the child writes `0` (itself) into these `tasks` files
    /// before it executes the init. Moving a single thread that is the
    /// writer itself spares the kernel the global threadgroup lock that
    /// moving a process by pid takes — tens of microseconds instead of
    /// tens of milliseconds, during which every fork on the host waits.
    JoinSelf(Vec<T>),
}

/// Whether `pid` is running, so its instance must be left alone. Any
/// process counts, not just an agentosd: a reused pid only delays the
/// clean-up, while a wrong guess would kill a live daemon's agents.
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// One agent's cgroup.
#[derive(Debug)]
pub struct AgentCgroup {
    backend: Arc<dyn Backend>,
    rel: PathBuf,
}

impl AgentCgroup {
    /// The cgroup's path below each hierarchy's root.
    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// Which cgroup version it belongs to.
    pub fn version(&self) -> CgroupVersion {
        self.backend.version()
    }

    /// Gives the cgroup a new name within its parent (a warm sandbox's
    /// cgroup becomes its agent's when claimed). The processes in it stay.
    pub fn rename(&mut self, name: &str) -> Result<(), CgroupError> {
        let renamed = self.rel.with_file_name(name);
        for (from, to) in self
            .backend
            .dirs(&self.rel)
            .into_iter()
            .zip(self.backend.dirs(&renamed))
        {
            fs::rename(&from, &to).map_err(io_error("cannot rename cgroup", &from))?;
        }
        self.rel = renamed;
        Ok(())
    }

    /// Writes the limits into the cgroup (again, if they change).
    pub fn apply(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        let mut resources = Resources::default();
        resources.memory.memory_hard_limit = Some(clamp_i64(limits.memory));
        resources.memory.memory_swap_limit = self.backend.no_swap_limit(&self.rel, limits.memory);
        resources.cpu.quota = Some(limits.cpu_quota.map_or(-1, clamp_i64));
        resources.cpu.period = Some(limits.cpu_period);
        resources.pid.maximum_number_of_processes = Some(if limits.max_pids == u64::MAX {
            MaxValue::Max
        } else {
            MaxValue::Value(clamp_i64(limits.max_pids))
        });
        let cgroup = Cgroup::load(self.backend.hierarchy(), &self.rel);
        let write = || {
            cgroup.apply(&resources).map_err(|err| CgroupError::Limits {
                path: self.rel.clone(),
                message: err.to_string(),
            })
        };
        write()?;
        // v1 takes a memory limit only up to the memory+swap one, and
        // cgroups-rs ignores a refused write: a raised limit needs the
        // second write, after memory+swap was raised by the first.
        if !self.memory_limit_is(limits.memory) {
            write()?;
            if !self.memory_limit_is(limits.memory) {
                return Err(CgroupError::Limits {
                    path: self.rel.clone(),
                    message: format!(
                        "the memory limit in force is {:?} bytes, not {}",
                        self.backend.memory_limit(&self.rel),
                        limits.memory
                    ),
                });
            }
        }
        Ok(())
    }

    /// Whether the memory limit in force is `memory` (to the page; an
    /// unreadable one counts as right).
    fn memory_limit_is(&self, memory: u64) -> bool {
        let page = 4096;
        self.backend
            .memory_limit(&self.rel)
            .is_none_or(|in_force| in_force / page == memory.min(i64::MAX as u64) / page)
    }

    /// How a new sandbox enters this cgroup: v2 clones straight into its
    /// directory; on v1 the new process writes itself into each
    /// hierarchy's `tasks`.
    pub fn join(&self) -> CgroupJoin<PathBuf> {
        match self.backend.version() {
            CgroupVersion::V2 => CgroupJoin::Into(self.backend.dirs(&self.rel).swap_remove(0)),
            CgroupVersion::V1 => CgroupJoin::JoinSelf(self.self_join_files()),
        }
    }

    /// The files a process writes `0` into, one per hierarchy, to move
    /// itself in: v1's `tasks` (moving only the writing thread spares the
    /// global lock that moving a whole process takes), v2's `cgroup.procs`.
    pub fn self_join_files(&self) -> Vec<PathBuf> {
        let file = match self.backend.version() {
            CgroupVersion::V1 => "tasks",
            CgroupVersion::V2 => "cgroup.procs",
        };
        self.backend
            .dirs(&self.rel)
            .into_iter()
            .map(|dir| dir.join(file))
            .collect()
    }

    /// The `cgroup.procs` file of each hierarchy.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.backend.procs_files(&self.rel)
    }

    /// The figures LIST shows.
    pub fn stats(&self) -> CgroupStats {
        CgroupStats {
            frozen: self.freezer().is_some_and(|freezer| freezer.is_frozen()),
            ..self.backend.stats(&self.rel)
        }
    }

    /// The cgroup's freezer, if the host has one.
    pub fn freezer(&self) -> Option<Freezer> {
        self.backend.freezer(&self.rel)
    }

    /// Processes the memory controller has killed so far.
    pub fn oom_kills(&self) -> u64 {
        self.backend.oom_kills(&self.rel)
    }

    /// Memory the cgroup is charged for now, in bytes.
    pub fn memory_in_use(&self) -> u64 {
        self.backend.memory_in_use(&self.rel)
    }

    /// Of that, page cache (and shared memory), in bytes.
    pub fn memory_cache(&self) -> u64 {
        self.backend.memory_cache(&self.rel)
    }

    /// CPU time the cgroup has used, in microseconds.
    pub fn cpu_usage_usec(&self) -> u64 {
        self.backend.cpu_usage_usec(&self.rel)
    }

    /// Reclaims what can be of the memory it is charged for (may take a
    /// moment: never on the reactor). A failure is logged: what is left
    /// shows in [`memory_in_use`](Self::memory_in_use).
    pub fn reclaim(&self) {
        if let Err(err) = self.backend.reclaim(&self.rel) {
            log::debug!("cannot reclaim the memory of {}: {err}", self.rel.display());
        }
    }

    /// A descriptor that becomes readable on each OOM kill in this cgroup.
    pub fn watch_oom(&self) -> io::Result<OwnedFd> {
        self.backend.watch_oom(&self.rel)
    }

    /// Consumes the readiness of a [`watch_oom`](Self::watch_oom) descriptor.
    pub fn drain_watch(&self, fd: &OwnedFd) {
        self.backend.drain_watch(fd)
    }

    /// Processes in the cgroup now.
    pub fn pids(&self) -> Vec<u32> {
        self.backend
            .procs_files(&self.rel)
            .first()
            .and_then(|file| fs::read_to_string(file).ok())
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Sends SIGKILL to every process in the cgroup, and in the cgroups
    /// made inside it.
    pub fn kill_all(&self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let Some(dir) = self.backend.dirs(&self.rel).into_iter().next() else {
            return;
        };
        let mut dirs = vec![dir];
        while let Some(dir) = dirs.pop() {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // A pid that has gone meanwhile gives ESRCH, which is fine.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            if let Ok(entries) = fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        // A frozen process holds SIGKILL until it is thawed (cgroup v1).
        if let Some(freezer) = self.freezer().filter(Freezer::is_freezing) {
            if let Err(err) = freezer.set(false) {
                log::warn!("cannot thaw cgroup {}: {err}", self.rel.display());
            }
        }
    }

    /// Kills what is in the cgroup and removes it, retrying for up to
    /// `patience` while its processes die (shutdown and start-up only: it
    /// sleeps between tries).
    pub fn remove_within(&self, patience: Duration) -> Result<(), CgroupError> {
        let deadline = Instant::now() + patience;
        loop {
            self.kill_all();
            match self.remove() {
                Ok(()) => return Ok(()),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Removes the cgroup's directories, and first those of cgroups made
    /// inside it (an agent's runs'), which are empty by then or make this
    /// fail too. Fails (EBUSY) while processes remain; never waits.
    pub fn remove(&self) -> Result<(), CgroupError> {
        for dir in self.backend.dirs(&self.rel) {
            remove_dir_and_inner(&dir)?;
        }
        Ok(())
    }
}

/// Removes a cgroup directory and the cgroup directories inside it,
/// deepest first (a cgroup's own files go with it).
fn remove_dir_and_inner(dir: &Path) -> Result<(), CgroupError> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dir_and_inner(&entry.path())?;
            }
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_error("cannot remove cgroup", dir)(err)),
    }
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
