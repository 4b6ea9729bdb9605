//! The runtime's side of the seam: [`Runtime`] serves [`Sandboxes`] for
//! its owners, and [`OwnersOf`] gives one kind of owner its own view of a
//! runtime that several kinds share.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use mio::{Interest, Token};

use super::door::{Door, DoorEntry};
use super::launching::LaunchError;
use super::machine::Machine;
use super::seam::{ClaimOrder, Claimed, DoorKey, SandboxKey, Sandboxes};
use super::{LaunchFor, Runtime, Source, POOL_REFILL_DELAY};
use crate::cgroup::{CgroupStats, Freezer};
use crate::fd;
use crate::identity::Identity;
use crate::sandbox::attach::{self, VolumePlace, VolumeRoots};
use crate::sandbox::plan::{self, Shape};
use crate::sandbox::spec::Bind;
use crate::sandbox::view::View;

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

    fn freezer(&self, key: SandboxKey) -> Option<Freezer> {
        self.sandboxes.get(key.0)?.freezer()
    }

    fn open_root(&self, key: SandboxKey) -> io::Result<OwnedFd> {
        let sandbox = self.sandboxes.get(key.0).ok_or(io::ErrorKind::NotFound)?;
        // The init is the kernel's child and is reaped on this thread, so
        // its pid is still its own here.
        let root = if sandbox.shape.sandboxed {
            format!("/proc/{}/root", sandbox.pid)
        } else {
            "/".to_owned()
        };
        Ok(OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(root)?
            .into())
    }

    fn mount_volumes(&self, key: SandboxKey, volumes: &[VolumePlace]) -> io::Result<()> {
        let sandbox = self.sandboxes.get(key.0).ok_or(io::ErrorKind::NotFound)?;
        let owner = self
            .profile
            .user
            .map_or((0, 0), |user| (user.uid, user.gid));
        let roots = VolumeRoots {
            base: self.profile.staging.clone(),
            covered: Vec::new(),
            owner,
        };
        attach::attach(sandbox.pidfd.as_fd(), &[], volumes, &roots)
    }

    fn listen_inside(&self, key: SandboxKey) -> io::Result<std::net::TcpListener> {
        let sandbox = self.sandboxes.get(key.0).ok_or(io::ErrorKind::NotFound)?;
        agentos_egress::endpoint::listen_inside(sandbox.pidfd.as_fd())
    }

    fn open_door(&mut self, name: &str, identity: Identity) -> io::Result<DoorKey> {
        let door = Door::open(&self.doors_dir, name)?;
        let entry = self.doors.vacant_entry();
        let key = entry.key();
        let token = Token(self.token_base + self.sources.insert(Source::Door(key)));
        let listener = door.listener.as_raw_fd();
        if let Err(err) = fd::watch(&self.registry, listener, token, Interest::READABLE) {
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
/// owners are wrapped into the runtime's (an agent's incarnation into the
/// kernel's `SandboxOwner::Agent`, say) on the way in.
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

    fn freezer(&self, sandbox: SandboxKey) -> Option<Freezer> {
        self.runtime.freezer(sandbox)
    }

    fn open_root(&self, sandbox: SandboxKey) -> io::Result<OwnedFd> {
        self.runtime.open_root(sandbox)
    }

    fn mount_volumes(&self, sandbox: SandboxKey, volumes: &[VolumePlace]) -> io::Result<()> {
        self.runtime.mount_volumes(sandbox, volumes)
    }

    fn listen_inside(&self, sandbox: SandboxKey) -> io::Result<std::net::TcpListener> {
        self.runtime.listen_inside(sandbox)
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
