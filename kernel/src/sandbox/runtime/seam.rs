//! The seam between the runtime and the owners of sandboxes: what an owner
//! may ask ([`Sandboxes`]), what it hears back ([`SandboxEvent`]), and the
//! runtime's side of it. An owner's unit tests implement [`Sandboxes`]
//! with no processes at all.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use mio::Token;

use super::door::{Door, DoorEntry};
use super::launching::LaunchError;
use super::machine::Machine;
use super::{watch, LaunchFor, Runtime, Source, POOL_REFILL_DELAY};
use crate::cgroup::{CgroupLimits, CgroupStats};
use crate::identity::Identity;
use crate::process::ProcessEnd;
use crate::sandbox::plan::{self, Shape, Workload};
use crate::sandbox::spec::Bind;
use crate::sandbox::view::View;
use crate::sandbox::Status;

/// Names a launched sandbox while it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SandboxKey(pub(super) usize);

/// Names an open door.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorKey(pub(super) usize);

#[cfg(test)]
impl SandboxKey {
    /// A key for unit tests of owners, whose fake runtime hands out its own.
    pub fn for_tests(n: usize) -> SandboxKey {
        SandboxKey(n)
    }
}

#[cfg(test)]
impl DoorKey {
    /// A key for unit tests of owners.
    pub fn for_tests(n: usize) -> DoorKey {
        DoorKey(n)
    }
}

/// What happened to an owner's sandbox.
#[derive(Debug)]
pub enum SandboxEvent<O> {
    /// A sandbox the owner acquired is ready: claim it, or discard it.
    Ready {
        /// Whose it is.
        owner: O,
        /// The sandbox.
        sandbox: SandboxKey,
    },
    /// No sandbox could be prepared for the owner.
    Failed {
        /// Whose it was to be.
        owner: O,
        /// Why.
        error: LaunchError,
    },
    /// The claimed sandbox's init reported this.
    Status {
        /// Whose sandbox.
        owner: O,
        /// The report.
        status: Status,
    },
    /// The memory limit killed a process in the claimed sandbox (told once
    /// per claim).
    OomKill {
        /// Whose sandbox.
        owner: O,
    },
    /// The claimed sandbox has ended; its cgroup is being removed.
    Ended {
        /// Whose sandbox.
        owner: O,
        /// How its init ended, if it could be reaped.
        init: Option<ProcessEnd>,
        /// Whether the memory limit killed a process since the claim.
        oom_killed: bool,
        /// What the cgroup counted (nothing current: it is all gone).
        usage: CgroupStats,
    },
}

impl<O> SandboxEvent<O> {
    /// Whose sandbox it is.
    pub fn owner(&self) -> &O {
        match self {
            SandboxEvent::Ready { owner, .. }
            | SandboxEvent::Failed { owner, .. }
            | SandboxEvent::Status { owner, .. }
            | SandboxEvent::OomKill { owner }
            | SandboxEvent::Ended { owner, .. } => owner,
        }
    }

    /// The same event for the owner `owner` maps to.
    pub fn map<P>(self, owner: impl FnOnce(O) -> P) -> SandboxEvent<P> {
        match self {
            SandboxEvent::Ready { owner: o, sandbox } => SandboxEvent::Ready {
                owner: owner(o),
                sandbox,
            },
            SandboxEvent::Failed { owner: o, error } => SandboxEvent::Failed {
                owner: owner(o),
                error,
            },
            SandboxEvent::Status { owner: o, status } => SandboxEvent::Status {
                owner: owner(o),
                status,
            },
            SandboxEvent::OomKill { owner: o } => SandboxEvent::OomKill { owner: owner(o) },
            SandboxEvent::Ended {
                owner: o,
                init,
                oom_killed,
                usage,
            } => SandboxEvent::Ended {
                owner: owner(o),
                init,
                oom_killed,
                usage,
            },
        }
    }
}

/// What a claim gives the sandbox.
#[derive(Debug)]
pub struct ClaimOrder<'a> {
    /// What to run.
    pub workload: &'a Workload,
    /// Where its output goes (opened for appending, created if need be).
    pub log: &'a Path,
    /// The cgroup's new name.
    pub cgroup_name: String,
    /// The cgroup's limits.
    pub limits: CgroupLimits,
    /// The door whose callers must come from this sandbox.
    pub door: Option<DoorKey>,
    /// The workload's channel to its owner, open in the workload at
    /// `fds::CHANNEL` (an exec host's).
    pub channel: Option<BorrowedFd<'a>>,
}

/// What a successful claim tells the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The init's pid on the host.
    pub pid: i32,
}

/// What owners ask of the runtime: the seam between an owner's policy and
/// the machinery of sandboxes (unit tests of owners implement it without
/// processes or root).
pub trait Sandboxes<O> {
    /// What the machine supports.
    fn machine(&self) -> &Machine;
    /// What a workload of `shape` with these binds sees (`None`: it is not
    /// sandboxed, so it sees the host).
    fn view(&self, shape: Shape, binds: &[Bind]) -> Option<View>;
    /// A sandbox of `shape` for `owner`: one from the pool at once, or
    /// `None` and a [`SandboxEvent::Ready`] (or `Failed`) later.
    fn acquire(&mut self, owner: O, shape: Shape, now: Instant) -> Option<SandboxKey>;
    /// Takes a waiting owner out of the pool's queue; whether it was there
    /// (if not, a sandbox is being prepared for it, or it has one).
    fn withdraw(&mut self, owner: O) -> bool;
    /// Gives the sandbox to `owner` and starts `order`'s workload in it.
    /// On failure the sandbox is killed, still the owner's: its `Ended`
    /// follows.
    fn claim(
        &mut self,
        sandbox: SandboxKey,
        owner: O,
        order: ClaimOrder<'_>,
    ) -> Result<Claimed, LaunchError>;
    /// Kills a sandbox nobody will use.
    fn discard(&mut self, sandbox: SandboxKey);
    /// Signals a sandbox's init.
    fn signal(&self, sandbox: SandboxKey, signal: i32);
    /// What a sandbox's cgroup counts now.
    fn usage(&self, sandbox: SandboxKey) -> Option<CgroupStats>;
    /// Opens a door named `name` whose callers are `identity`.
    fn open_door(&mut self, name: &str, identity: Identity) -> io::Result<DoorKey>;
    /// Where a door is on the host.
    fn door_path(&self, door: DoorKey) -> Option<&Path>;
    /// Closes a door and removes its socket.
    fn close_door(&mut self, door: DoorKey);
}

impl<O: Copy + PartialEq + Debug> Sandboxes<O> for Runtime<O> {
    fn machine(&self) -> &Machine {
        &self.machine
    }

    fn view(&self, shape: Shape, binds: &[Bind]) -> Option<View> {
        let root = self.shapes.get(&shape)?.root.as_ref()?;
        Some(View::of(root, binds, self.viewer))
    }

    fn acquire(&mut self, owner: O, shape: Shape, now: Instant) -> Option<SandboxKey> {
        if shape != Shape::DEFAULT {
            self.launch(LaunchFor::Owner(owner), shape);
            return None;
        }
        match self.pool.take() {
            Some(key) => {
                self.refill_later(now, POOL_REFILL_DELAY);
                Some(SandboxKey(key))
            }
            None => {
                self.pool.wait(owner);
                self.launch(LaunchFor::Pool, shape);
                None
            }
        }
    }

    fn withdraw(&mut self, owner: O) -> bool {
        self.pool.withdraw(&owner)
    }

    fn claim(
        &mut self,
        key: SandboxKey,
        owner: O,
        order: ClaimOrder<'_>,
    ) -> Result<Claimed, LaunchError> {
        let Some(sandbox) = self.sandboxes.get_mut(key.0) else {
            return Err(LaunchError::Gone);
        };
        sandbox.serving = Some(owner);
        if let Some(door) = order.door.and_then(|door| self.doors.get_mut(door.0)) {
            door.expected = sandbox.pid_namespace;
        }
        // The claim goes first: the init enters its root while the cgroup
        // is named and limited here; it starts the workload only after.
        let sent = open_log(order.log)
            .and_then(|log| {
                sandbox
                    .control
                    .claim_with_channel(
                        &plan::claim(sandbox.shape, order.workload),
                        &log,
                        order.channel,
                    )
                    .map_err(LaunchError::Claim)
            })
            .and_then(|()| match sandbox.cgroup.as_mut() {
                Some(cgroup) => cgroup
                    .rename(&order.cgroup_name)
                    .and_then(|()| cgroup.apply(&order.limits))
                    .map_err(LaunchError::ClaimCgroup),
                None => Ok(()),
            })
            .and_then(|()| sandbox.control.start().map_err(LaunchError::Go));
        sandbox.oom_baseline = sandbox.cgroup.as_ref().map_or(0, |c| c.oom_kills());
        if let Err(error) = sent {
            sandbox.signal(libc::SIGKILL);
            return Err(error);
        }
        let claimed = Claimed { pid: sandbox.pid };
        self.watch_oom(key.0);
        Ok(claimed)
    }

    fn discard(&mut self, key: SandboxKey) {
        if let Some(sandbox) = self.sandboxes.get_mut(key.0) {
            sandbox.serving = None;
            sandbox.signal(libc::SIGKILL);
        }
        self.pool.remove(key.0);
    }

    fn signal(&self, key: SandboxKey, signal: i32) {
        if let Some(sandbox) = self.sandboxes.get(key.0) {
            sandbox.signal(signal);
        }
    }

    fn usage(&self, key: SandboxKey) -> Option<CgroupStats> {
        self.sandboxes
            .get(key.0)?
            .cgroup
            .as_ref()
            .map(|c| c.stats())
    }

    fn open_door(&mut self, name: &str, identity: Identity) -> io::Result<DoorKey> {
        let door = Door::open(&self.doors_dir, name)?;
        let entry = self.doors.vacant_entry();
        let key = entry.key();
        let token = Token(self.token_base + self.sources.insert(Source::Door(key)));
        if let Err(err) = watch(&self.registry, door.listener.as_raw_fd(), token) {
            self.sources.try_remove(token.0 - self.token_base);
            return Err(err);
        }
        entry.insert(DoorEntry {
            door,
            token,
            identity,
            expected: None,
        });
        Ok(DoorKey(key))
    }

    fn door_path(&self, door: DoorKey) -> Option<&Path> {
        self.doors.get(door.0).map(|entry| entry.door.path())
    }

    fn close_door(&mut self, door: DoorKey) {
        if let Some(entry) = self.doors.try_remove(door.0) {
            self.forget_source(entry.door.listener.as_raw_fd(), entry.token);
        }
    }
}

/// Opens a workload's log for the sandbox to write.
fn open_log(path: &Path) -> Result<File, LaunchError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| LaunchError::Log {
            path: path.to_path_buf(),
            source,
        })
}

/// One kind of owner's share of a runtime that several kinds share: its
/// owners are wrapped into the runtime's (an agent's run into the kernel's
/// `Owner::Agent`, say) on the way in.
#[derive(Debug)]
pub struct OwnersOf<'a, O, P> {
    runtime: &'a mut Runtime<O>,
    wrap: fn(P) -> O,
}

impl<'a, O, P> OwnersOf<'a, O, P> {
    /// `runtime`, as seen by owners that `wrap` turns into its own.
    pub fn new(runtime: &'a mut Runtime<O>, wrap: fn(P) -> O) -> Self {
        OwnersOf { runtime, wrap }
    }
}

impl<O: Copy + PartialEq + Debug, P> Sandboxes<P> for OwnersOf<'_, O, P> {
    fn machine(&self) -> &Machine {
        self.runtime.machine()
    }

    fn view(&self, shape: Shape, binds: &[Bind]) -> Option<View> {
        self.runtime.view(shape, binds)
    }

    fn acquire(&mut self, owner: P, shape: Shape, now: Instant) -> Option<SandboxKey> {
        self.runtime.acquire((self.wrap)(owner), shape, now)
    }

    fn withdraw(&mut self, owner: P) -> bool {
        self.runtime.withdraw((self.wrap)(owner))
    }

    fn claim(
        &mut self,
        sandbox: SandboxKey,
        owner: P,
        order: ClaimOrder<'_>,
    ) -> Result<Claimed, LaunchError> {
        self.runtime.claim(sandbox, (self.wrap)(owner), order)
    }

    fn discard(&mut self, sandbox: SandboxKey) {
        self.runtime.discard(sandbox)
    }

    fn signal(&self, sandbox: SandboxKey, signal: i32) {
        self.runtime.signal(sandbox, signal)
    }

    fn usage(&self, sandbox: SandboxKey) -> Option<CgroupStats> {
        self.runtime.usage(sandbox)
    }

    fn open_door(&mut self, name: &str, identity: Identity) -> io::Result<DoorKey> {
        self.runtime.open_door(name, identity)
    }

    fn door_path(&self, door: DoorKey) -> Option<&Path> {
        self.runtime.door_path(door)
    }

    fn close_door(&mut self, door: DoorKey) {
        self.runtime.close_door(door)
    }
}
