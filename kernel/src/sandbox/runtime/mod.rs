//! The sandbox runtime: everything that keeps sandboxes alive, for any
//! owner: an agent's incarnation or an exec host.
//!
//! Sandboxes are prepared on the launch thread ([`launching`]): ahead of
//! time for the warm pool ([`pool`]), or on demand for a shape the pool
//! does not hold. An owner [`acquire`](Sandboxes::acquire)s one — at once
//! from the pool, or later through a [`SandboxEvent::Ready`] — then
//! *claims* it: the sandbox is told what to run and where its output goes,
//! and its cgroup is renamed after the owner and given the owner's limits.
//! Claiming a warm sandbox costs a few small writes, so a default SPAWN
//! does not wait for namespaces, a root filesystem or a cgroup migration.
//!
//! Everything afterwards arrives as readiness of the runtime's own sources
//! — a sandbox's pidfd (exit), its status pipe, its cgroup's OOM watch, a
//! [`door`] — and leaves as [`SandboxEvent`]s for the owner, which the
//! kernel collects with [`Runtime::take_events`]. The runtime never looks
//! inside an owner: owners are opaque values of type `O`.
//!
//! Everything here runs on the reactor thread and never blocks, except
//! [`Runtime::finish_shutdown`].

pub mod door;
mod handle;
pub mod launching;
pub mod machine;
pub mod owners;
mod pool;
pub mod retire;
mod seam;

use std::collections::HashMap;
use std::fmt::Debug;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token, Waker};
use slab::Slab;

use crate::address::Outbox;
use crate::cgroup::{CgroupLimits, CgroupStats, Cgroups};
use crate::fd;
use crate::process;
use crate::sandbox::confine::Confinement;
use crate::sandbox::plan::{self, Profile, Shape};
use crate::sandbox::view::ViewUser;
use crate::sandbox::{Launcher, SandboxSpec, Status};
use door::DoorEntry;
use handle::Sandbox;
pub use launching::LaunchError;
use launching::{LaunchDone, LaunchJob, LaunchThread};
use machine::Machine;
use pool::Pool;
use retire::Retiring;
pub use seam::{ClaimOrder, Claimed, DoorKey, SandboxEvent, SandboxKey, Sandboxes};

/// How many tokens the runtime's sources may take, from its base.
pub const TOKEN_SPAN: usize = 1 << 40;
/// After a warm sandbox fails, wait this long before preparing another.
const POOL_RETRY: Duration = Duration::from_secs(1);
/// After a claim, wait this long before preparing its replacement: on a
/// small machine, preparing a sandbox competes for the CPU with the
/// workload just started and with the reply going out.
const POOL_REFILL_DELAY: Duration = Duration::from_millis(20);

/// Who a launch is for.
#[derive(Clone, Copy, Debug)]
enum LaunchFor<O> {
    /// The warm pool (or whoever waits for it first).
    Pool,
    /// This owner.
    Owner(O),
}

#[derive(Clone, Copy, Debug)]
enum Source {
    Exit(usize),
    Status(usize),
    Oom(usize),
    Door(usize),
}

#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// Try again to remove the cgroups of ended sandboxes.
    SweepCgroups,
    /// Prepare warm sandboxes (after a claim, or again after a failure).
    RefillPool,
}

/// How the runtime is set up.
#[derive(Debug)]
pub struct RuntimeSetup {
    /// How sandboxes are built.
    pub profile: Profile,
    /// Sandboxes to keep warm.
    pub warm_pool: usize,
    /// Limits of a sandbox's cgroup until its claim sets the owner's.
    pub default_limits: CgroupLimits,
    /// The directory doors are made in.
    pub doors: PathBuf,
    /// The first of the runtime's [`TOKEN_SPAN`] tokens.
    pub token_base: usize,
}

/// The sandbox runtime.
#[derive(Debug)]
pub struct Runtime<O> {
    registry: Registry,
    token_base: usize,
    sources: Slab<Source>,
    sandboxes: Slab<Sandbox<O>>,
    pool: Pool<O>,
    refill_pending: bool,
    launches: LaunchThread,
    pending: HashMap<u64, (LaunchFor<O>, Shape)>,
    next_launch: u64,
    deadlines: Timers<Deadline>,
    retiring: Retiring,
    doors: Slab<DoorEntry>,
    doors_dir: PathBuf,
    machine: Machine,
    profile: Profile,
    /// The spec of each shape, built once: the profile never changes, and
    /// building it probes the host's system directories.
    shapes: HashMap<Shape, SandboxSpec>,
    /// Whose permissions a sandboxed workload has on the host's files.
    viewer: ViewUser,
    default_limits: CgroupLimits,
    events: Vec<SandboxEvent<O>>,
    shutting_down: bool,
}

impl<O: Copy + PartialEq + Debug> Runtime<O> {
    /// A sandbox's cgroup, relative to each hierarchy's root, if it has one.
    pub fn cgroup_of(&self, key: SandboxKey) -> Option<&Path> {
        self.sandboxes
            .get(key.0)?
            .cgroup
            .as_ref()
            .map(|cgroup| cgroup.rel())
    }

    /// The cgroup of a sandbox whose workload is not sandboxed (an
    /// unsandboxed agent's), as [`Runtime::cgroup_of`]; `None` for any
    /// other.
    pub fn unsandboxed_cgroup_of(&self, key: SandboxKey) -> Option<&Path> {
        let sandbox = self.sandboxes.get(key.0)?;
        if sandbox.shape.sandboxed {
            return None;
        }
        sandbox.cgroup.as_ref().map(|cgroup| cgroup.rel())
    }

    /// Starts the launch thread (finished launches wake `waker`) and the
    /// first warm sandboxes. `registry` is the reactor's, for the
    /// runtime's own sources.
    pub fn new(
        setup: RuntimeSetup,
        machine: Machine,
        registry: &Registry,
        waker: Arc<Waker>,
    ) -> io::Result<Runtime<O>> {
        let launcher = Launcher::new(Path::new("/proc/self/exe"))?;
        let viewer = match setup.profile.user {
            Some(user) => ViewUser {
                uid: user.uid,
                gid: user.gid,
            },
            None => ViewUser {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
            },
        };
        // Without namespaces there is nothing worth preparing ahead.
        let warm = if machine.has_namespaces() {
            setup.warm_pool
        } else {
            0
        };
        let mut runtime = Runtime {
            registry: registry.try_clone()?,
            token_base: setup.token_base,
            sources: Slab::new(),
            sandboxes: Slab::new(),
            pool: Pool::new(warm),
            refill_pending: false,
            launches: LaunchThread::start(launcher, machine.cgroups.clone(), waker)?,
            pending: HashMap::new(),
            next_launch: 0,
            deadlines: Timers::default(),
            retiring: Retiring::default(),
            doors: Slab::new(),
            doors_dir: setup.doors,
            shapes: Shape::ALL
                .iter()
                .map(|shape| (*shape, plan::sandbox(&setup.profile, *shape)))
                .collect(),
            profile: setup.profile,
            machine,
            viewer,
            default_limits: setup.default_limits,
            events: Vec::new(),
            shutting_down: false,
        };
        runtime.fill_pool();
        Ok(runtime)
    }

    /// Whether a token is one of the runtime's.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKEN_SPAN).contains(&token.0)
    }

    /// The daemon's cgroups, when this host gives it any.
    pub fn cgroups(&self) -> Option<Arc<Cgroups>> {
        self.machine.cgroups.clone()
    }

    /// How the kernel's own children are confined (`None`: this host gives
    /// the daemon no namespaces, so they run as the daemon does).
    pub fn confinement(&self) -> Option<Confinement> {
        if !self.machine.has_namespaces() {
            return None;
        }
        Confinement::for_kernel_children(&self.profile)
    }

    /// Whether a process in these PID namespaces (its own first, then its
    /// ancestors) lives inside one of the runtime's sandboxes.
    pub fn is_inside_a_sandbox(&self, pid_namespaces: &[u64]) -> bool {
        self.sandboxes
            .iter()
            .filter_map(|(_, sandbox)| sandbox.pid_namespace)
            .any(|namespace| pid_namespaces.contains(&namespace))
    }

    /// What happened since the last call, in order.
    pub fn take_events(&mut self) -> Vec<SandboxEvent<O>> {
        std::mem::take(&mut self.events)
    }

    /// Handles readiness of one of the runtime's tokens. Connections
    /// accepted on doors go to `out`.
    pub fn on_event(&mut self, token: Token, out: &mut Outbox) {
        let now = Instant::now();
        let Some(source) = self.sources.get(token.0 - self.token_base).copied() else {
            return;
        };
        match source {
            Source::Door(key) => {
                if let Some(door) = self.doors.get(key) {
                    door.accept_all(out);
                }
            }
            Source::Status(key) => self.read_status(key),
            Source::Exit(key) => self.exited(key, now),
            Source::Oom(key) => self.oom_event(key),
        }
    }

    /// Takes in the launches the launch thread has finished (after a
    /// wake-up).
    pub fn on_wake(&mut self) {
        let now = Instant::now();
        let finished: Vec<LaunchDone> = self.launches.completed().collect();
        for done in finished {
            self.launched(done, now);
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.deadlines.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(&mut self, now: Instant) {
        while let Some(deadline) = self.deadlines.pop_due(now) {
            match deadline {
                Deadline::SweepCgroups => {
                    if self.retiring.sweep() {
                        self.schedule_sweep(now);
                    }
                }
                Deadline::RefillPool => {
                    self.refill_pending = false;
                    self.fill_pool();
                }
            }
        }
    }

    /// Stops preparing sandboxes and kills the parked ones.
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        for key in self.pool.drain() {
            if let Some(sandbox) = self.sandboxes.get(key) {
                sandbox.signal(libc::SIGKILL);
            }
        }
    }

    /// No sandbox process and no launch remains.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.sandboxes.is_empty()
    }

    /// Last step of shutdown (may block briefly): kills what remains and
    /// removes cgroups and doors.
    pub fn finish_shutdown(&mut self) {
        // Launches still in flight come back and are killed at once.
        while !self.pending.is_empty() {
            let Some(done) = self.launches.wait_completed(Duration::from_secs(2)) else {
                break;
            };
            self.pending.remove(&done.seq);
            if let Ok((launched, cgroup)) = done.result {
                let _ = process::signal(launched.pidfd.as_fd(), libc::SIGKILL);
                process::wait(launched.pidfd.as_fd(), true);
                if let Some(cgroup) = cgroup {
                    retire::remove_now(&cgroup);
                }
            }
        }
        for mut sandbox in self.sandboxes.drain() {
            sandbox.signal(libc::SIGKILL);
            process::wait(sandbox.pidfd.as_fd(), true);
            let _ = self
                .registry
                .deregister(&mut SourceFd(&sandbox.pidfd.as_raw_fd()));
            if let Some(cgroup) = sandbox.cgroup.take() {
                retire::remove_now(&cgroup);
            }
        }
        self.retiring.remove_all();
        self.doors.clear();
        if let Some(cgroups) = &self.machine.cgroups {
            cgroups.shutdown();
        }
    }

    // ---- launches and the pool -----------------------------------------

    /// Asks the launch thread for a sandbox of `shape`.
    fn launch(&mut self, for_whom: LaunchFor<O>, shape: Shape) {
        let seq = self.next_launch;
        self.next_launch += 1;
        // An unsandboxed agent has a cgroup too, without limits: it is how
        // the kernel knows its processes, freezes and ends them all.
        let cgroup = self
            .machine
            .cgroups
            .is_some()
            .then(|| (format!("sandbox-{seq}"), self.default_limits));
        self.pending.insert(seq, (for_whom, shape));
        self.launches.submit(LaunchJob {
            seq,
            spec: self.shapes[&shape].clone(),
            cgroup,
            map_to: if shape.sandboxed {
                self.machine.map_to
            } else {
                None
            },
        });
    }

    /// Keeps the warm pool at its size.
    fn fill_pool(&mut self) {
        if self.shutting_down || self.refill_pending {
            return;
        }
        let coming = self
            .pending
            .values()
            .filter(|(f, _)| matches!(f, LaunchFor::Pool))
            .count();
        for _ in 0..self.pool.shortfall(coming) {
            self.launch(LaunchFor::Pool, Shape::DEFAULT);
        }
    }

    /// Refills the pool after `delay` (unless a refill is already due).
    fn refill_later(&mut self, now: Instant, delay: Duration) {
        if !self.refill_pending {
            self.refill_pending = true;
            self.deadlines.schedule(now + delay, Deadline::RefillPool);
        }
    }

    fn schedule_sweep(&mut self, now: Instant) {
        self.deadlines
            .schedule(now + retire::RETRY_EVERY, Deadline::SweepCgroups);
    }

    /// A sandbox came back from the launch thread.
    fn launched(&mut self, done: LaunchDone, now: Instant) {
        let Some((for_whom, shape)) = self.pending.remove(&done.seq) else {
            return;
        };
        let (launched, cgroup) = match done.result {
            Ok(result) => result,
            Err(error) => {
                log::error!("{error}");
                let owner = match for_whom {
                    LaunchFor::Pool => {
                        self.refill_later(now, POOL_RETRY);
                        self.pool.next_waiting()
                    }
                    LaunchFor::Owner(owner) => Some(owner),
                };
                if let Some(owner) = owner {
                    self.events.push(SandboxEvent::Failed { owner, error });
                }
                return;
            }
        };
        let pid_namespace = shape
            .sandboxed
            .then(|| process::pid_namespace_of(launched.pid))
            .flatten();
        let key = self.sandboxes.vacant_entry().key();
        let exit_token = self.token(Source::Exit(key));
        let status_token = self.token(Source::Status(key));
        let registered = fd::watch(
            &self.registry,
            launched.pidfd.as_raw_fd(),
            exit_token,
            Interest::READABLE,
        )
        .and_then(|()| {
            fd::watch(
                &self.registry,
                launched.status.fd().as_raw_fd(),
                status_token,
                Interest::READABLE,
            )
        });
        self.sandboxes.insert(Sandbox {
            pid: launched.pid,
            pidfd: launched.pidfd,
            exit_token,
            status: Some((launched.status, status_token)),
            control: launched.control,
            cgroup,
            shape,
            serving: None,
            pid_namespace,
            oom_watch: None,
            oom_baseline: 0,
            oom_reported: false,
            workload_group: None,
        });
        if let Err(err) = registered {
            log::error!("cannot watch a new sandbox: {err}");
            self.discard(SandboxKey(key));
            if let LaunchFor::Owner(owner) = for_whom {
                let error = LaunchError::Watch(err);
                self.events.push(SandboxEvent::Failed { owner, error });
            }
            return;
        }
        let owner = match for_whom {
            LaunchFor::Owner(owner) => owner,
            LaunchFor::Pool => match self.pool.next_waiting() {
                Some(owner) => {
                    self.refill_later(now, POOL_REFILL_DELAY);
                    owner
                }
                None if self.shutting_down => return self.discard(SandboxKey(key)),
                None => return self.pool.park(key),
            },
        };
        self.events.push(SandboxEvent::Ready {
            owner,
            sandbox: SandboxKey(key),
        });
    }

    // ---- events from sandboxes -----------------------------------------

    /// Status lines from a sandbox's init.
    fn read_status(&mut self, key: usize) {
        let Some(sandbox) = self.sandboxes.get_mut(key) else {
            return;
        };
        let Some((reader, token)) = sandbox.status.as_mut() else {
            return;
        };
        let token = *token;
        let (statuses, closed) = reader.read_available();
        if closed {
            if let Some((reader, _)) = sandbox.status.take() {
                let _ = self
                    .registry
                    .deregister(&mut SourceFd(&reader.fd().as_raw_fd()));
            }
            self.sources.try_remove(token.0 - self.token_base);
        }
        if sandbox.pid_namespace.is_none() {
            // Its pid is the host's: the workload leads its own group.
            for status in &statuses {
                // Never 0 or 1: kill(-0) and kill(-1) reach far more.
                if let Status::Ready { pid } = status {
                    sandbox.workload_group = (*pid > 1).then_some(*pid);
                }
            }
        }
        match sandbox.serving {
            Some(owner) => self.events.extend(
                statuses
                    .into_iter()
                    .map(|status| SandboxEvent::Status { owner, status }),
            ),
            None => {
                for status in statuses {
                    if let Status::Error { message, .. } = status {
                        log::error!("warm sandbox (pid {}) failed: {message}", sandbox.pid);
                    }
                }
            }
        }
    }

    /// A sandbox's init exited.
    fn exited(&mut self, key: usize, now: Instant) {
        // Take in what the status pipe still holds: how the workload ended.
        self.read_status(key);
        if !self.sandboxes.contains(key) {
            return;
        }
        let mut sandbox = self.sandboxes.remove(key);
        let init = process::wait(sandbox.pidfd.as_fd(), false);
        self.forget_source(sandbox.pidfd.as_raw_fd(), sandbox.exit_token);
        if let Some((reader, token)) = sandbox.status.take() {
            self.forget_source(reader.fd().as_raw_fd(), token);
        }
        if let Some((watch, token)) = sandbox.oom_watch.take() {
            self.forget_source(watch.as_raw_fd(), token);
        }
        let oom_killed = sandbox.oom_killed();
        let usage = sandbox
            .cgroup
            .as_ref()
            .map_or_else(CgroupStats::default, |c| CgroupStats {
                memory_current: 0,
                pids_current: 0,
                ..c.stats()
            });
        if let Some(cgroup) = sandbox.cgroup.take() {
            if self.retiring.retire(cgroup) {
                self.schedule_sweep(now);
            }
        }
        if self.pool.remove(key) {
            log::warn!("a warm sandbox (pid {}) ended: {init:?}", sandbox.pid);
            self.refill_later(now, POOL_RETRY);
        }
        if let Some(owner) = sandbox.serving {
            self.events.push(SandboxEvent::Ended {
                owner,
                init,
                oom_killed,
                usage,
            });
        }
    }

    fn oom_event(&mut self, key: usize) {
        let Some(sandbox) = self.sandboxes.get_mut(key) else {
            return;
        };
        let (Some(cgroup), Some((watch, _))) = (&sandbox.cgroup, &sandbox.oom_watch) else {
            return;
        };
        cgroup.drain_watch(watch);
        if cgroup.oom_kills() > sandbox.oom_baseline && !sandbox.oom_reported {
            sandbox.oom_reported = true;
            if let Some(owner) = sandbox.serving {
                self.events.push(SandboxEvent::OomKill { owner });
            }
        }
    }

    // ---- sources -------------------------------------------------------

    /// A token for a new source.
    fn token(&mut self, source: Source) -> Token {
        Token(self.token_base + self.sources.insert(source))
    }

    /// Stops watching a descriptor and frees its token.
    fn forget_source(&mut self, fd: RawFd, token: Token) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
        self.sources.try_remove(token.0 - self.token_base);
    }

    /// Watches the claimed sandbox's cgroup for OOM kills.
    fn watch_oom(&mut self, key: usize) {
        let Some(fd) = self
            .sandboxes
            .get(key)
            .and_then(|s| s.cgroup.as_ref())
            .and_then(|c| {
                c.watch_oom()
                    .map_err(|err| log::warn!("sandbox {key}: no OOM watch: {err}"))
                    .ok()
            })
        else {
            return;
        };
        let token = self.token(Source::Oom(key));
        if fd::watch(&self.registry, fd.as_raw_fd(), token, Interest::READABLE).is_err() {
            self.sources.try_remove(token.0 - self.token_base);
            return;
        }
        if let Some(sandbox) = self.sandboxes.get_mut(key) {
            sandbox.oom_watch = Some((fd, token));
        }
    }
}
