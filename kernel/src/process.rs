//! Process helpers on pidfds and memory files, shared by sandboxes and the
//! kernel's supervised children.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
}

/// pidfd_send_signal(2). Signal 0 checks that the process exists.
pub fn signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal on a borrowed descriptor; the info
    // pointer may be NULL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reaps the process behind `pidfd` (waiting for it if `block`).
pub fn wait(pidfd: BorrowedFd<'_>, block: bool) -> Option<ProcessEnd> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    // SAFETY: waitid on a pidfd, with a valid siginfo pointer.
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
        libc::CLD_EXITED => Some(ProcessEnd::Exited(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => Some(ProcessEnd::Signaled(status)),
        _ => None,
    }
}

/// The inode of a process's pid namespace.
pub fn pid_namespace_of(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// An anonymous memory file (close-on-exec) holding `bytes`, positioned at
/// its start: nothing touches the disk, and whoever inherits it reads it
/// from the beginning.
pub fn memfd_with(name: &CStr, bytes: &[u8]) -> io::Result<OwnedFd> {
    let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}
