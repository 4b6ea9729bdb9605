//! Launched sandboxes: parked in the warm pool, or serving one run of an
//! agent. Each is an init process with a pidfd (exit), a status pipe (what
//! it reports) and a control socket (its claim).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use mio::Token;

use crate::cgroup::AgentCgroup;
use crate::sandbox::plan::Shape;
use crate::sandbox::{Control, StatusReader};

/// One launched sandbox.
#[derive(Debug)]
pub struct Sandbox {
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
    /// Its cgroup while parked (a claimed sandbox's cgroup is its agent's).
    pub cgroup: Option<AgentCgroup>,
    /// Its shape.
    pub shape: Shape,
    /// The agent and run it serves; `None` while parked.
    pub serving: Option<(u32, u32)>,
    /// Its pid namespace (inode), when it has one.
    pub pid_namespace: Option<u64>,
}

impl Sandbox {
    /// Sends a signal to the init. SIGTERM is passed on to the whole
    /// workload; SIGKILL of the init ends its PID namespace and all in it.
    pub fn signal(&self, signal: i32) {
        // SAFETY: pidfd_send_signal on a pidfd we own.
        unsafe { pidfd_signal(self.pidfd.as_raw_fd(), signal) };
    }
}

/// How an init process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitEnd {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
}

/// Reaps the process behind `pidfd` (waiting for it if `block`).
pub fn wait_pidfd(pidfd: &OwnedFd, block: bool) -> Option<InitEnd> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    // SAFETY: waitid on a pidfd we own, with a valid siginfo pointer.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            flags,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: waitid filled in a SIGCHLD siginfo; these accessors read it.
    let (code, status) = unsafe { (info.si_code, info.si_status()) };
    match code {
        libc::CLD_EXITED => Some(InitEnd::Exited(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => Some(InitEnd::Signaled(status)),
        _ => None,
    }
}

/// pidfd_send_signal(2).
///
/// # Safety
/// `pidfd` must be a pidfd.
pub unsafe fn pidfd_signal(pidfd: RawFd, signal: i32) {
    // SAFETY: the caller passes a pidfd; the info pointer may be NULL.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// The inode of a process's pid namespace.
pub fn pid_namespace_of(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}
