//! The seam between the runtime and the owners of sandboxes: what an owner
//! may ask ([`Sandboxes`]) and what it hears back ([`SandboxEvent`]). The
//! runtime's side of it is in `owners.rs`; an owner's unit tests implement
//! [`Sandboxes`] with no processes at all.

use std::fmt::Debug;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use super::launching::LaunchError;
use super::machine::Machine;
use crate::cgroup::{CgroupLimits, CgroupStats, Freezer};
use crate::identity::Identity;
use crate::process::ProcessEnd;
use crate::sandbox::attach::VolumePlace;
use crate::sandbox::plan::{Shape, Workload};
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
    /// A sandbox's freezer (`None`: no cgroup, or no freezer on this host).
    fn freezer(&self, sandbox: SandboxKey) -> Option<Freezer>;
    /// The root of what a sandbox's workload sees (`/` for one that is
    /// not sandboxed), as a directory descriptor.
    fn open_root(&self, sandbox: SandboxKey) -> io::Result<OwnedFd>;
    /// Mounts `volumes` into a sandbox not yet claimed, beneath the root
    /// its workload will enter.
    fn mount_volumes(&self, sandbox: SandboxKey, volumes: &[VolumePlace]) -> io::Result<()>;
    /// A socket listening on the egress proxy's address inside the
    /// sandbox's own network namespace.
    fn listen_inside(&self, sandbox: SandboxKey) -> io::Result<std::net::TcpListener>;
    /// Opens a door named `name` whose callers are `identity`.
    fn open_door(&mut self, name: &str, identity: Identity) -> io::Result<DoorKey>;
    /// Where a door is on the host.
    fn door_path(&self, door: DoorKey) -> Option<&Path>;
    /// Closes a door and removes its socket.
    fn close_door(&mut self, door: DoorKey);
}
