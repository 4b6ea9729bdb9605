//! A launched sandbox: parked in the warm pool, or serving its owner. It
//! is an init process with a pidfd (exit), a status pipe (what it reports),
//! a control socket (its claim), and usually a cgroup.

use std::os::fd::{AsFd, OwnedFd};

use mio::Token;

use crate::cgroup::{AgentCgroup, Freezer};
use crate::process;
use crate::sandbox::plan::Shape;
use crate::sandbox::{Control, StatusReader};

/// One launched sandbox, serving owners of type `O`.
#[derive(Debug)]
pub struct Sandbox<O> {
    /// The init's pid on the host.
    pub pid: i32,
    /// Readable when the init exits.
    pub pidfd: OwnedFd,
    /// The pidfd's token.
    pub exit_token: Token,
    /// The status pipe and its token, until the pipe closes.
    pub status: Option<(StatusReader, Token)>,
    /// The control socket: the claim goes here.
    pub control: Control,
    /// Its cgroup, named after its owner once claimed.
    pub cgroup: Option<AgentCgroup>,
    /// Its shape.
    pub shape: Shape,
    /// Who it serves; `None` while parked or on its way out.
    pub serving: Option<O>,
    /// Its pid namespace (inode), when it has one.
    pub pid_namespace: Option<u64>,
    /// The cgroup's OOM watch and its token, once claimed.
    pub oom_watch: Option<(OwnedFd, Token)>,
    /// The cgroup's OOM-kill count at the claim: a warm sandbox's cgroup
    /// is reused, so only kills after it count.
    pub oom_baseline: u64,
    /// An OOM kill has been reported to the owner.
    pub oom_reported: bool,
    /// The workload's process group, on the host, when there is no PID
    /// namespace to end with the init (an unsandboxed agent).
    pub workload_group: Option<i32>,
}

impl<O> Sandbox<O> {
    /// Sends a signal to the init. SIGTERM is passed on to the whole
    /// workload; SIGKILL of the init ends its PID namespace and all in it.
    /// Without a PID namespace, SIGKILL goes to the workload's process
    /// group too: the init cannot pass on a signal that kills it.
    pub fn signal(&self, signal: i32) {
        // Fails only once the init is gone, when there is nothing to do.
        let init_alive = process::signal(self.pidfd.as_fd(), 0).is_ok();
        if let (true, libc::SIGKILL, Some(group)) = (init_alive, signal, self.workload_group) {
            // While the init lives it has not reaped the group's leader,
            // so the group id cannot belong to anyone else yet.
            // SAFETY: kill(2) with a negative pid signals that process
            // group; it touches no memory.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
        let _ = process::signal(self.pidfd.as_fd(), signal);
        // A paused sandbox holds signals until it is thawed: thawed after
        // the signal, it handles that first (a KILL of a paused agent).
        if let Some(freezer) = self.freezer().filter(Freezer::is_freezing) {
            if let Err(err) = freezer.set(false) {
                log::warn!("cannot thaw sandbox {} to signal it: {err}", self.pid);
            }
        }
    }

    /// Its cgroup's freezer, if it has a cgroup and the host a freezer.
    pub fn freezer(&self) -> Option<Freezer> {
        self.cgroup.as_ref()?.freezer()
    }

    /// Whether the memory controller killed a process since the claim.
    pub fn oom_killed(&self) -> bool {
        self.oom_reported
            || self
                .cgroup
                .as_ref()
                .is_some_and(|c| c.oom_kills() > self.oom_baseline)
    }
}
