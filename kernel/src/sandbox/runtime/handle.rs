//! A launched sandbox: parked in the warm pool, or serving its owner. It
//! is an init process with a pidfd (exit), a status pipe (what it reports),
//! a control socket (its claim), and usually a cgroup.

use std::os::fd::{AsFd, OwnedFd};

use mio::Token;

use crate::cgroup::AgentCgroup;
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
}

impl<O> Sandbox<O> {
    /// Sends a signal to the init. SIGTERM is passed on to the whole
    /// workload; SIGKILL of the init ends its PID namespace and all in it.
    pub fn signal(&self, signal: i32) {
        // Fails only once the init is gone, when there is nothing to do.
        let _ = process::signal(self.pidfd.as_fd(), signal);
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
