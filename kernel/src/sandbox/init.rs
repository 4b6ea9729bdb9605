//! The sandbox's init: the daemon's own binary, re-executed by the launcher
//! as the first process of the new namespaces (`agentosd __agentos-sandbox-init`).
//! Being a fresh single-threaded process, it can do the setup in ordinary
//! Rust that a forked child of the multi-threaded daemon could not.
//!
//! It reads the order of the day from fd 3 and carries it out, in this
//! order — the code below reads the same way:
//! 1. wait for the daemon's go (it writes user-namespace maps first);
//! 2. build the root filesystem and pivot into it;
//! 3. hostname, loopback;
//! 4. resource limits, then drop every privilege and switch user;
//! 5. die with the daemon (parent-death signal, lifeline check);
//! 6. seccomp;
//! 7. become PID 1 for the workload: fork and exec it, reap, forward
//!    signals, copy its output to the log, and report how it ended.
//!
//! Any failure is reported on the status pipe as one `error` line, which
//! becomes the SPAWN reply.

use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;

use agentos_proto::ErrorCode;

use super::spec::{fds, SandboxSpec};
use super::status::Status;
use super::{mounts, network, pid1, privileges, seccomp};

/// The hidden first argument that selects this role in `agentosd`.
pub const ARG: &str = "__agentos-sandbox-init";

/// Why the sandbox could not start its workload.
#[derive(Debug)]
pub struct Failure {
    /// The protocol word for the SPAWN reply.
    pub code: ErrorCode,
    /// The sentence for the SPAWN reply.
    pub message: String,
}

impl Failure {
    /// A failure of the kernel's own making.
    pub fn internal(message: impl Into<String>) -> Failure {
        Failure {
            code: ErrorCode::Internal,
            message: message.into(),
        }
    }
}

/// Runs the init role; never returns.
pub fn main() -> ! {
    set_process_name(b"agentos-init\0");
    let code = match read_spec().and_then(|spec| run(&spec)) {
        Ok(code) => code,
        Err(failure) => {
            report(&Status::Error {
                code: failure.code,
                message: failure.message,
            });
            127
        }
    };
    std::process::exit(code)
}

fn run(spec: &SandboxSpec) -> Result<i32, Failure> {
    keep_fds_from_the_workload(spec);
    wait_for_go()?;
    if let Some(root) = &spec.root {
        mounts::build_root(root, spec.user, &mut mounts::Real)
            .map_err(|err| Failure::internal(format!("sandbox setup failed: {err}")))?;
    }
    if let Some(hostname) = &spec.hostname {
        nix::unistd::sethostname(hostname)
            .map_err(|err| Failure::internal(format!("cannot set hostname: {err}")))?;
    }
    if spec.namespaces.net {
        network::loopback_up()
            .map_err(|err| Failure::internal(format!("cannot bring up loopback: {err}")))?;
    }
    privileges::set_rlimits(&spec.rlimits)
        .map_err(|err| Failure::internal(format!("cannot set resource limits: {err}")))?;
    if spec.drop_privileges {
        privileges::drop_all(spec.user).map_err(Failure::internal)?;
    }
    privileges::tie_to_parent()
        .map_err(|err| Failure::internal(format!("cannot tie the sandbox to the kernel: {err}")))?;
    if pid1::lifeline_cut() {
        // The daemon died before the parent-death signal was armed.
        std::process::exit(1);
    }
    if spec.drop_privileges {
        seccomp::install().map_err(Failure::internal)?;
    }
    pid1::run(spec)
}

fn read_spec() -> Result<SandboxSpec, Failure> {
    // SAFETY: the launcher put the spec memfd at this number for us, and
    // nothing else in this process uses it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fds::SPEC) };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|err| Failure::internal(format!("cannot read the sandbox spec: {err}")))?;
    serde_json::from_str(&text).map_err(|err| Failure::internal(format!("bad sandbox spec: {err}")))
}

/// Marks every descriptor the launcher handed us close-on-exec, so none
/// reaches the workload by accident; it gets exactly what `pid1` gives it.
fn keep_fds_from_the_workload(spec: &SandboxSpec) {
    let last = fds::CGROUP_BASE + spec.cgroup_fds as RawFd;
    for fd in fds::STATUS..last {
        // SAFETY: F_SETFD on descriptors of this process.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// Blocks until the daemon says go. EOF means it gave up on this sandbox.
fn wait_for_go() -> Result<(), Failure> {
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: reading one byte into a local buffer from our go pipe.
        let n = unsafe { libc::read(fds::GO, byte.as_mut_ptr().cast(), 1) };
        match n {
            1 => return Ok(()),
            0 => std::process::exit(1),
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => {
                return Err(Failure::internal(format!(
                    "cannot read the go signal: {}",
                    std::io::Error::last_os_error()
                )))
            }
        }
    }
}

/// Writes one status line to the daemon. If the daemon is gone there is
/// nobody to tell, so errors are ignored.
pub fn report(status: &Status) {
    let line = status.encode();
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing from a valid buffer to our status pipe.
        let n = unsafe { libc::write(fds::STATUS, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

fn set_process_name(name: &[u8]) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
}

/// Whether `path` can be opened for reading by this process (after the
/// user switch, so by the workload's user).
pub fn readable(path: &Path) -> bool {
    std::fs::File::open(path).is_ok()
}
