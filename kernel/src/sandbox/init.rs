//! The sandbox's init: the daemon's own binary, re-executed by the launcher
//! as the first process of the new namespaces (`agentosd __agentos-sandbox-init`).
//! Being a fresh single-threaded process, it can do the setup in ordinary
//! Rust that a forked child of the multi-threaded daemon could not.
//!
//! It reads the sandbox's shape from fd 3 and carries it out, in this
//! order — the code below reads the same way:
//! 1. hold the signals it will pass on (a PID 1 would otherwise discard
//!    them until it has handlers), and keep the OOM killer off the init
//!    itself (the launcher has already waited for the daemon's go, which
//!    follows the user-namespace maps);
//! 2. prepare the root filesystem; bring up loopback; resource limits;
//!    compile the seccomp filter;
//! 3. wait for the claim: what to run, and the log to write to (a sandbox
//!    of the warm pool waits here until a SPAWN takes it);
//! 4. bind the workload's paths and pivot into the new root; hostname;
//! 5. drop every privilege and switch user;
//! 6. die with the daemon (parent-death signal, lifeline check);
//! 7. seccomp;
//! 8. wait for the start: the daemon names and limits the sandbox's cgroup
//!    while the steps above run;
//! 9. become PID 1 for the workload: fork and exec it, reap, forward
//!    signals, copy its output to the log, and report how it ended.
//!
//! Any failure is a `SetupError`, reported on the status pipe as one
//! `error` line with the protocol word `SetupError::code` gives it; the
//! line becomes the SPAWN reply.

use std::io::Read;
use std::os::fd::FromRawFd;

use super::error::SetupError;
use super::spec::{fds, SandboxSpec};
use super::status::{report, Status};
use super::{control, mounts, network, pid1, privileges, seccomp};

/// The hidden first argument that selects this role in `agentosd`.
pub const ARG: &str = "__agentos-sandbox-init";

/// Runs the init role; never returns.
pub fn main() -> ! {
    set_process_name(b"agentos-init\0");
    let code = match read_spec().and_then(|spec| run(&spec)) {
        Ok(code) => code,
        Err(err) => {
            report(&Status::Error {
                code: err.code(),
                message: err.to_string(),
            });
            127
        }
    };
    std::process::exit(code)
}

fn run(spec: &SandboxSpec) -> Result<i32, SetupError> {
    pid1::hold_signals()?;
    keep_fds_from_the_workload();
    // The OOM killer should take the workload, never the init that reports
    // on it. Lowering needs CAP_SYS_RESOURCE, which a user namespace lacks:
    // then the init simply stays a candidate.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    if let Some(root) = &spec.root {
        mounts::prepare_root(root, spec.user, &mut mounts::Real::default())?;
    }
    if spec.namespaces.net {
        network::loopback_up().map_err(SetupError::Loopback)?;
    }
    privileges::set_rlimits(&spec.rlimits).map_err(SetupError::Rlimits)?;
    let filter = spec
        .drop_privileges
        .then(|| seccomp::filter_for(spec.nested_namespaces));

    let claim = control::wait_for_claim()?;
    if let Some(root) = &spec.root {
        mounts::enter_root(root, &claim.binds, &mut mounts::Real::default())?;
    }
    if let Some(hostname) = &claim.hostname {
        nix::unistd::sethostname(hostname).map_err(SetupError::Hostname)?;
    }
    if spec.drop_privileges {
        privileges::drop_all(spec.user)?;
    }
    privileges::tie_to_parent().map_err(SetupError::TieToParent)?;
    if pid1::lifeline_cut() {
        // The daemon died before the parent-death signal was armed.
        std::process::exit(1);
    }
    if let Some(filter) = &filter {
        seccomp::install(filter)?;
    }
    control::wait_for_start()?;
    Ok(pid1::run(spec, &claim)?)
}

fn read_spec() -> Result<SandboxSpec, SetupError> {
    // SAFETY: the launcher put the spec memfd at this number for us, and
    // nothing else in this process uses it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fds::SPEC) };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(SetupError::ReadSpec)?;
    serde_json::from_str(&text).map_err(SetupError::ParseSpec)
}

/// Marks every descriptor the launcher handed us close-on-exec, so none
/// reaches the workload by accident; it gets exactly what `pid1` gives it.
fn keep_fds_from_the_workload() {
    for fd in fds::STATUS..=fds::LIFELINE {
        // SAFETY: F_SETFD on descriptors of this process.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

fn set_process_name(name: &[u8]) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
}
