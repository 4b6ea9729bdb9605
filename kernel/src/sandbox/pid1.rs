//! The init's second half: the workload's parent for as long as it runs.
//! In a PID namespace the init is PID 1, so it also reaps every orphan and,
//! when the workload ends, takes down whatever it left behind (ending the
//! namespace). Signals sent to the init are passed on to the workload's
//! processes; the workload's stdout and stderr are copied into the log with
//! a size cap; the lifeline tells it when the daemon is gone.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::uio::{pread, pwrite};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ftruncate, lseek, read, write, ForkResult, Pid, Whence};

use super::error::WorkloadError;
use super::spec::{fds, Claim, SandboxSpec};
use super::status::report;
use super::status::Status;
use crate::fd;

/// Signals passed on to the workload.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// After the workload ends outside a PID namespace, how long to wait for
/// processes it left behind to close their copy of its output.
const OUTPUT_LINGER: Duration = Duration::from_secs(1);

/// The signals the init handles: the workload's end, and those it passes on.
fn handled_signals() -> SigSet {
    let mut handled = SigSet::empty();
    handled.add(Signal::SIGCHLD);
    for signal in FORWARDED {
        handled.add(signal);
    }
    handled
}

/// Blocks the signals the init handles, first thing. The init is PID 1 of
/// its namespace, and the kernel discards a signal sent to a PID 1 that
/// has no handler for it — unless it is blocked, when it waits. So a
/// SIGTERM (a KILL, the kernel stopping) that arrives while the sandbox
/// is still being set up is held, and passed on to the workload as soon as
/// it runs, instead of being lost.
pub fn hold_signals() -> Result<(), WorkloadError> {
    handled_signals()
        .thread_block()
        .map_err(|errno| WorkloadError::Supervise {
            step: "cannot block signals",
            errno,
        })
}

/// Whether the daemon has died (its end of the lifeline is closed).
pub fn lifeline_cut() -> bool {
    let mut polled = [PollFd::new(lifeline(), PollFlags::POLLIN)];
    // With one descriptor, "one ready" means it hung up (or has data,
    // which the daemon never writes).
    matches!(poll(&mut polled, PollTimeout::ZERO), Ok(ready) if ready > 0)
}

/// The read end of the lifeline.
fn lifeline() -> BorrowedFd<'static> {
    // SAFETY: the launcher places the lifeline at its fixed number before
    // the init runs, and the init never closes it: it is open for the life
    // of this process.
    unsafe { BorrowedFd::borrow_raw(fds::LIFELINE) }
}

/// Starts the workload and supervises it; returns the init's exit code.
pub fn run(spec: &SandboxSpec, claim: &Claim) -> Result<i32, WorkloadError> {
    let program = resolve_program(claim)?;
    if let Some(script) = &claim.script {
        if !script.exists() {
            return Err(WorkloadError::ScriptMissing(script.clone()));
        }
        if !readable(script) {
            return Err(WorkloadError::ScriptUnreadable {
                script: script.clone(),
                uid: nix::unistd::getuid().as_raw(),
            });
        }
    }
    let exec = ExecArgs::prepare(claim, &program)?;
    let (output_read, output_write) = pipe()?;
    let (exec_read, exec_write) = pipe()?;

    // The init blocked the signals it handles when it started (see
    // `hold_signals`): any that came since wait in the signalfd, and go on
    // to the workload once it runs. The workload unblocks them before exec.
    let handled = handled_signals();
    // SAFETY: this process is single-threaded, so the child may run any code.
    let child = match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => workload(&exec, &output_write, &exec_write),
        Ok(ForkResult::Parent { child }) => child,
        Err(errno) => {
            return Err(WorkloadError::Supervise {
                step: "cannot fork the workload",
                errno,
            })
        }
    };
    drop(output_write);
    drop(exec_write);
    // The channel (if the claim brought one) is the workload's alone: the
    // daemon must see it close when the workload ends.
    let _ = nix::unistd::close(fds::CHANNEL);

    // The exec pipe closes on a successful exec; anything written to it is
    // the reason the exec did not happen.
    let mut reason = Vec::new();
    read_to_end(&exec_read, &mut reason);
    if !reason.is_empty() {
        let _ = waitpid(child, None);
        return Err(exec_failure(
            &String::from_utf8_lossy(&reason),
            claim,
            &program,
        ));
    }
    report(&Status::Ready {
        pid: child.as_raw(),
    });
    let ending = supervise(spec, child, &handled, output_read)?;
    report(&ending);
    Ok(match ending {
        Status::Exited(code) => code,
        Status::Signaled(signal) => 128 + signal,
        _ => 1,
    })
}

/// The executable to run: absolute, or found on the workload's PATH.
fn resolve_program(spec: &Claim) -> Result<PathBuf, WorkloadError> {
    if spec.program.is_absolute() {
        return Ok(spec.program.clone());
    }
    let path = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| Path::new(dir).join(&spec.program))
        .find(|candidate| nix::unistd::access(candidate, nix::unistd::AccessFlags::X_OK).is_ok())
        .ok_or_else(|| WorkloadError::NotOnPath {
            program: spec.program.clone(),
            path: path.to_owned(),
        })
}

/// argv and environment, converted before fork.
struct ExecArgs {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
}

impl ExecArgs {
    fn prepare(spec: &Claim, program: &Path) -> Result<ExecArgs, WorkloadError> {
        let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| WorkloadError::NulByte);
        Ok(ExecArgs {
            program: c(program.as_os_str().as_bytes())?,
            argv: spec
                .argv
                .iter()
                .map(|a| c(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            env: spec
                .env
                .iter()
                .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
                .collect::<Result<_, _>>()?,
            cwd: c(spec.cwd.as_os_str().as_bytes())?,
        })
    }
}

/// The forked child: becomes the workload. Reports a failure on
/// `exec_write` as "<step> <errno>" and exits 127.
fn workload(exec: &ExecArgs, output: &OwnedFd, exec_write: &OwnedFd) -> ! {
    let fail = |step: &str, errno: Errno| -> ! {
        let message = format!("{step} {}", errno as i32);
        let _ = write(exec_write, message.as_bytes());
        // SAFETY: _exit has no preconditions; it leaves the forked child
        // without running the parent's destructors or atexit handlers.
        unsafe { libc::_exit(127) }
    };
    // Signals: default dispositions (SIGPIPE included — the daemon ignores
    // it, and ignored signals survive exec) and nothing blocked.
    for signal in Signal::iterator() {
        if signal != Signal::SIGKILL && signal != Signal::SIGSTOP {
            // SAFETY: resetting to the default disposition is always sound.
            unsafe {
                let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl);
            }
        }
    }
    let _ = SigSet::all().thread_unblock();
    // Its own session and process group, so the whole group can be
    // signalled when there is no PID namespace to do it.
    let _ = nix::unistd::setsid();
    if let Err(errno) =
        nix::unistd::dup2_stdout(output).and_then(|()| nix::unistd::dup2_stderr(output))
    {
        fail("dup2", errno);
    }
    // The channel, if there is one, stays open across exec.
    // SAFETY: F_SETFD on a fixed descriptor number; EBADF (no channel) is
    // harmless.
    unsafe {
        libc::fcntl(fds::CHANNEL, libc::F_SETFD, 0);
    }
    // The init keeps the OOM killer off itself; the workload is fair game.
    let _ = std::fs::write("/proc/self/oom_score_adj", "0");
    if let Err(errno) = nix::unistd::chdir(exec.cwd.as_c_str()) {
        fail("chdir", errno);
    }
    let Err(errno) = nix::unistd::execve(&exec.program, &exec.argv, &exec.env);
    fail("exec", errno)
}

fn exec_failure(reason: &str, spec: &Claim, program: &Path) -> WorkloadError {
    let (step, errno) = reason.split_once(' ').unwrap_or((reason, "0"));
    let errno = Errno::from_raw(errno.trim().parse().unwrap_or(0));
    match (step, errno) {
        ("exec", Errno::ENOENT) => WorkloadError::ProgramMissing(program.to_path_buf()),
        ("exec", Errno::EACCES) => WorkloadError::NotExecutable(program.to_path_buf()),
        ("exec", errno) => WorkloadError::Exec {
            program: program.to_path_buf(),
            errno,
        },
        ("chdir", Errno::ENOENT) => WorkloadError::CwdMissing(spec.cwd.clone()),
        ("chdir", errno) => WorkloadError::Cwd {
            cwd: spec.cwd.clone(),
            errno,
        },
        (step, errno) => WorkloadError::Setup {
            step: step.to_owned(),
            errno,
        },
    }
}

/// Runs until the workload has ended and its output is drained.
fn supervise(
    spec: &SandboxSpec,
    child: Pid,
    handled: &SigSet,
    output: OwnedFd,
) -> Result<Status, WorkloadError> {
    let signals = SignalFd::with_flags(handled, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|errno| WorkloadError::Supervise {
            step: "cannot create signalfd",
            errno,
        })?;
    let _ = fd::set_nonblocking(&output);
    let own_pid_namespace = spec.namespaces.pid;
    // SAFETY: the claim placed the log at its fixed number before the
    // workload started, and the init never closes it: it is open for the
    // life of this process.
    let log_fd = unsafe { BorrowedFd::borrow_raw(fds::LOG) };
    let mut log = LogWriter::new(log_fd, spec.log_cap);
    let mut ending: Option<Status> = None;
    let mut output_open = true;
    let mut linger_until: Option<Instant> = None;
    let mut buffer = vec![0u8; 64 * 1024];
    let lifeline = lifeline();

    while ending.is_none() || output_open {
        if linger_until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        let timeout = linger_until.map_or(PollTimeout::NONE, |_| PollTimeout::from(100u16));
        let mut polled = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(lifeline, PollFlags::POLLIN),
            PollFd::new(output.as_fd(), PollFlags::POLLIN),
        ];
        let watched = if output_open { 3 } else { 2 };
        match poll(&mut polled[..watched], timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                return Err(WorkloadError::Supervise {
                    step: "poll",
                    errno,
                })
            }
        }
        let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
        if ready(&polled[1]) {
            // The daemon is gone: so is everything it started.
            signal_workload(own_pid_namespace, child, Signal::SIGKILL);
            std::process::exit(137);
        }
        if ready(&polled[0]) {
            while let Ok(Some(info)) = signals.read_signal() {
                let signal = Signal::try_from(info.ssi_signo as i32).ok();
                match signal {
                    Some(Signal::SIGCHLD) => {
                        if let Some(end) = reap(child) {
                            ending = Some(end);
                            // Whatever the workload left behind goes with it.
                            signal_workload(own_pid_namespace, child, Signal::SIGKILL);
                            if !own_pid_namespace {
                                linger_until = Some(Instant::now() + OUTPUT_LINGER);
                            }
                        }
                    }
                    Some(other) if ending.is_none() => {
                        signal_workload(own_pid_namespace, child, other)
                    }
                    _ => {}
                }
            }
        }
        if output_open && polled.get(2).is_some_and(ready) {
            output_open = copy_output(&output, &mut buffer, &mut log);
        }
    }
    if own_pid_namespace {
        // Reap the rest so the namespace ends cleanly.
        while !matches!(waitpid(None, None), Err(Errno::ECHILD)) {}
    }
    Ok(ending.unwrap_or(Status::Exited(0)))
}

/// Reaps every child that has ended; returns the workload's ending if it
/// was among them.
fn reap(workload: Pid) -> Option<Status> {
    let mut ending = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == workload => {
                ending = Some(Status::Exited(code));
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == workload => {
                ending = Some(Status::Signaled(signal as i32));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return ending,
            Ok(_) => {}
        }
    }
}

/// Sends `signal` to every process of the workload: in a PID namespace,
/// to everything but this init; otherwise to the workload's process group.
fn signal_workload(own_pid_namespace: bool, workload: Pid, signal: Signal) {
    let target = if own_pid_namespace {
        Pid::from_raw(-1)
    } else {
        Pid::from_raw(-workload.as_raw())
    };
    let _ = kill(target, signal);
}

/// Copies what is available; returns whether the output is still open.
fn copy_output(output: &OwnedFd, buffer: &mut [u8], log: &mut LogWriter<'_>) -> bool {
    loop {
        match read(output, buffer) {
            Ok(0) => return false,
            Ok(n) => log.write(&buffer[..n]),
            Err(errno) => return matches!(errno, Errno::EAGAIN | Errno::EINTR),
        }
    }
}

/// Appends to the agent's log, keeping it under `cap` bytes: when full, the
/// newer half is moved to the front and the older half dropped.
struct LogWriter<'fd> {
    fd: BorrowedFd<'fd>,
    cap: u64,
}

impl<'fd> LogWriter<'fd> {
    fn new(fd: BorrowedFd<'fd>, cap: u64) -> LogWriter<'fd> {
        LogWriter { fd, cap }
    }

    fn size(&self) -> u64 {
        lseek(self.fd, 0, Whence::SeekEnd)
            .ok()
            .and_then(|end| u64::try_from(end).ok())
            .unwrap_or(0)
    }

    fn write(&mut self, mut data: &[u8]) {
        if self.cap > 0 && self.size() + data.len() as u64 > self.cap {
            self.keep_newer_half();
            let keep = (self.cap / 2) as usize;
            if data.len() > keep {
                data = &data[data.len() - keep..];
            }
        }
        while !data.is_empty() {
            match write(self.fd, data) {
                Ok(n) if n > 0 => data = &data[n..],
                _ => return,
            }
        }
    }

    fn keep_newer_half(&mut self) {
        let size = self.size();
        let keep = self.cap / 2;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut copied = 0u64;
        if size > keep {
            let start = size - keep;
            while copied < keep {
                let want = chunk.len().min((keep - copied) as usize);
                let n = match pread(self.fd, &mut chunk[..want], (start + copied) as libc::off_t) {
                    Ok(n) if n > 0 => n,
                    _ => break,
                };
                // The destination range precedes the source, so nothing
                // still to be read is overwritten.
                let _ = pwrite(self.fd, &chunk[..n], copied as libc::off_t);
                copied += n as u64;
            }
        }
        let _ = ftruncate(self.fd, copied as libc::off_t);
        let _ = lseek(self.fd, 0, Whence::SeekEnd);
        let marker = format!(
            "\n[agentos: older output dropped to keep this log under {} bytes]\n",
            self.cap
        );
        let _ = write(self.fd, marker.as_bytes());
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), WorkloadError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|errno| WorkloadError::Supervise {
        step: "cannot create a pipe",
        errno,
    })
}

fn read_to_end(fd: &OwnedFd, out: &mut Vec<u8>) {
    let mut chunk = [0u8; 256];
    loop {
        match read(fd, &mut chunk) {
            Ok(0) => return,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Whether `path` can be opened for reading by this process (after the
/// user switch, so by the workload's user).
fn readable(path: &Path) -> bool {
    std::fs::File::open(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn log_keeps_its_newer_half_under_the_cap() {
        let file = tempfile::tempfile().unwrap();
        let mut log = LogWriter::new(file.as_fd(), 1000);
        for i in 0..200 {
            log.write(format!("line {i:04}\n").as_bytes());
        }
        let size = log.size();
        assert!(size <= 1000 + 100, "{size}");
        let mut text = vec![0u8; size as usize];
        file.read_exact_at(&mut text, 0).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("line 0199"), "{text}");
        assert!(!text.contains("line 0000"), "{text}");
        assert!(text.contains("older output dropped"), "{text}");
    }
}
