//! Small helpers for the kernel's own child processes: signalling and
//! reaping them through pidfds, finding their PID namespace, and handing
//! them data in anonymous memory files.
//!
//! A pidfd names one process for as long as the descriptor is open, so a
//! signal sent or a wait made through it can never reach a process that
//! merely inherited the pid. This module imports nothing from the rest of
//! the kernel, so any subsystem may use it.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEnd {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
}

/// Sends `signal` to the process behind `pidfd` (pidfd_send_signal(2)).
/// Signal 0 sends nothing and only checks that the process still exists:
/// ESRCH means it has ended.
pub fn signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: the descriptor is borrowed, so it stays open for the call; the
    // siginfo pointer may be NULL (the kernel then fills it in as kill(2)
    // would), and the flags must be 0.
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

/// Reaps the child process behind `pidfd`, waiting for it to end if
/// `block`. `None`: it has not ended yet (without `block`), or it cannot be
/// waited for (not our child, or already reaped).
pub fn wait(pidfd: BorrowedFd<'_>, block: bool) -> Option<ProcessEnd> {
    // Not nix's `waitid`: it reaps first and then fails on a signal it has
    // no name for (a real-time one), and the ending would be lost.
    let flags = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: siginfo_t is plain old data; all-zero is a valid value,
        // and stays so when WNOHANG finds the process still running.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on a borrowed (so open) pidfd, with a valid
        // siginfo pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                flags,
            )
        };
        if rc != 0 {
            // A signal handler interrupted a blocking wait: the process
            // has not been reaped, so wait again.
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
        // SAFETY: waitid filled in a SIGCHLD siginfo (or left it zeroed);
        // these accessors read its fields.
        let (code, status) = unsafe { (info.si_code, info.si_status()) };
        return match code {
            libc::CLD_EXITED => Some(ProcessEnd::Exited(status)),
            libc::CLD_KILLED | libc::CLD_DUMPED => Some(ProcessEnd::Signaled(status)),
            _ => None,
        };
    }
}

/// The inode of the PID namespace process `pid` lives in, when it can be
/// read (the process exists and we may look at it).
pub fn pid_namespace_of(pid: i32) -> Option<u64> {
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
    file.seek(SeekFrom::Start(0))?;
    Ok(OwnedFd::from(file))
}

/// The pid (in the caller's namespace) of the process behind `pidfd`,
/// from its fdinfo; `None` once it has been reaped.
pub fn pid_of(pidfd: BorrowedFd<'_>) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|pid: &i32| *pid > 0)
}

/// The nice value of work done ahead of need (preparing runs, making their
/// cgroups): it leaves most of the CPU to runs and requests, yet is never
/// starved. On a busy host a request that waits for such work is served
/// late, not never — as it would be in the idle scheduling class, which
/// runs only when nothing else wants the CPU.
pub const BACKGROUND_NICE: i32 = 10;

/// Gives the process behind `pidfd` normal priority (nice 0), from the
/// background priority its preparation ran at. Needs `CAP_SYS_NICE`.
pub fn normal_priority(pidfd: BorrowedFd<'_>) -> io::Result<()> {
    let pid = pid_of(pidfd).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    // The pid is that of a live process we hold a pidfd to, so it cannot
    // have been reused.
    set_nice(pid, 0)
}

/// Moves the calling thread to the background priority (`BACKGROUND_NICE`).
pub fn background_priority_for_this_thread() -> io::Result<()> {
    // On Linux a nice value is a thread's: 0 names the calling thread.
    set_nice(0, BACKGROUND_NICE)
}

fn set_nice(pid: i32, nice: i32) -> io::Result<()> {
    let who =
        libc::id_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsFd, FromRawFd};
    use std::process::Command;

    /// Starts `program` with `args` and returns its pid and a pidfd
    /// (pidfd_open(2)) through which the test reaps it.
    fn spawn(program: &str, args: &[&str]) -> (i32, OwnedFd) {
        let pid = Command::new(program)
            .args(args)
            .spawn()
            .expect("the program starts")
            .id() as libc::pid_t;
        // SAFETY: pidfd_open takes a pid and flags and returns a new
        // descriptor or -1. The child is not reaped until the test waits
        // through the pidfd, so the pid is still its own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open: {}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor nothing else owns.
        (pid, unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn sleeper() -> (i32, OwnedFd) {
        spawn("sleep", &["30"])
    }

    #[test]
    fn a_signalled_process_is_reaped_as_signaled() {
        let (_, pidfd) = sleeper();
        signal(pidfd.as_fd(), libc::SIGTERM).expect("the signal is sent");
        assert_eq!(
            wait(pidfd.as_fd(), true),
            Some(ProcessEnd::Signaled(libc::SIGTERM))
        );
    }

    #[test]
    fn a_pidfd_names_its_process_until_it_is_reaped() {
        let (pid, pidfd) = sleeper();
        assert_eq!(pid_of(pidfd.as_fd()), Some(pid));
        signal(pidfd.as_fd(), libc::SIGKILL).expect("the signal is sent");
        wait(pidfd.as_fd(), true);
        assert_eq!(pid_of(pidfd.as_fd()), None);
    }

    #[test]
    fn an_exiting_process_is_reaped_with_its_code() {
        let (_, pidfd) = spawn("/bin/sh", &["-c", "exit 3"]);
        assert_eq!(wait(pidfd.as_fd(), true), Some(ProcessEnd::Exited(3)));
    }

    #[test]
    fn a_running_process_is_not_reaped_without_blocking() {
        let (_, pidfd) = sleeper();
        assert_eq!(wait(pidfd.as_fd(), false), None);
        signal(pidfd.as_fd(), libc::SIGKILL).expect("the signal is sent");
        assert_eq!(
            wait(pidfd.as_fd(), true),
            Some(ProcessEnd::Signaled(libc::SIGKILL))
        );
        // Once reaped there is nothing left to wait for.
        assert_eq!(wait(pidfd.as_fd(), false), None);
    }

    #[test]
    fn signal_zero_tells_whether_the_process_still_exists() {
        let (_, pidfd) = sleeper();
        assert!(signal(pidfd.as_fd(), 0).is_ok());
        signal(pidfd.as_fd(), libc::SIGKILL).expect("the signal is sent");
        wait(pidfd.as_fd(), true);
        let gone = signal(pidfd.as_fd(), 0).expect_err("the process has ended");
        assert_eq!(gone.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn a_child_shares_our_pid_namespace() {
        let own = pid_namespace_of(std::process::id() as i32);
        assert!(own.is_some());
        let (pid, pidfd) = sleeper();
        assert_eq!(pid_namespace_of(pid), own);
        signal(pidfd.as_fd(), libc::SIGKILL).expect("the signal is sent");
        wait(pidfd.as_fd(), true);
    }

    #[test]
    fn a_memfd_reads_back_its_bytes_from_the_start() {
        let fd = memfd_with(c"agentos-test", b"hello, memfd").expect("memfd");
        let mut text = String::new();
        File::from(fd).read_to_string(&mut text).expect("readable");
        assert_eq!(text, "hello, memfd");
    }
}
