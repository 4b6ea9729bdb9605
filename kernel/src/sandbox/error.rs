//! Why a sandbox could not start its workload, on either side of the
//! launch: the daemon's ([`LaunchError`]: preparing, claiming, watching a
//! sandbox) and the init's ([`SetupError`]: each step of its setup, and
//! [`WorkloadError`]: starting and supervising the workload). Each names
//! the path, call or step it failed on, and this file is the one place
//! where a reason becomes the protocol word of the reply.

use std::io;
use std::path::PathBuf;

use agentos_proto::ErrorCode;
use nix::errno::Errno;

use super::control::ControlError;
use super::mounts::MountError;
use super::privileges::PrivilegeError;
use super::seccomp::SeccompError;
use crate::cgroup::CgroupError;

/// A step of the init's setup that failed, in the order
/// [`init`](super::init) takes them.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The spec could not be read from its memfd.
    #[error("cannot read the sandbox spec: {0}")]
    ReadSpec(#[source] io::Error),
    /// The spec is not a [`SandboxSpec`](super::SandboxSpec).
    #[error("bad sandbox spec: {0}")]
    ParseSpec(#[source] serde_json::Error),
    /// Preparing or entering the root filesystem failed; the mount error
    /// names the step and the path.
    #[error("sandbox setup failed: {0}")]
    Root(#[from] MountError),
    /// Loopback could not be brought up in the new network namespace.
    #[error("cannot bring up loopback: {0}")]
    Loopback(#[source] io::Error),
    /// The workload's resource limits could not be set.
    #[error("cannot set resource limits: {0}")]
    Rlimits(#[source] io::Error),
    /// The claim's hostname could not be set.
    #[error("cannot set hostname: {0}")]
    Hostname(#[source] Errno),
    /// Dropping capabilities or switching user failed.
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    /// The parent-death signal or non-dumpability could not be set.
    #[error("cannot tie the sandbox to the kernel: {0}")]
    TieToParent(#[source] io::Error),
    /// The seccomp filter could not be installed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// The claim or the start could not be read from the control socket.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The PID 1 half failed: holding signals, or starting or supervising
    /// the workload.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
}

/// Why PID 1 could not start the workload, or supervise it.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The script is not in the sandbox.
    #[error("script {} does not exist in the sandbox", .0.display())]
    ScriptMissing(PathBuf),
    /// The workload's user may not read the script.
    #[error(
        "script {} is not readable by the agent's user (uid {uid}); make it and its \
         directories readable by others",
        script.display()
    )]
    ScriptUnreadable {
        /// The script.
        script: PathBuf,
        /// The workload's uid.
        uid: u32,
    },
    /// A bare program name is on none of the PATH's directories.
    #[error("program {program:?} was not found on the sandbox's PATH ({path})")]
    NotOnPath {
        /// The name.
        program: PathBuf,
        /// The PATH searched.
        path: String,
    },
    /// An argument or variable holds a NUL byte.
    #[error("arguments and environment must not contain NUL bytes")]
    NulByte,
    /// The program is not in the sandbox.
    #[error("program {} does not exist in the sandbox", .0.display())]
    ProgramMissing(PathBuf),
    /// The workload's user may not execute the program.
    #[error("program {} is not executable by the agent's user", .0.display())]
    NotExecutable(PathBuf),
    /// The exec failed otherwise.
    #[error("cannot execute {}: {errno}", program.display())]
    Exec {
        /// The program.
        program: PathBuf,
        /// Why.
        errno: Errno,
    },
    /// The working directory is not in the sandbox.
    #[error("working directory {} does not exist in the sandbox", .0.display())]
    CwdMissing(PathBuf),
    /// The working directory cannot be entered.
    #[error("cannot enter working directory {}: {errno}", cwd.display())]
    Cwd {
        /// The directory.
        cwd: PathBuf,
        /// Why.
        errno: Errno,
    },
    /// Another step of the workload's own setup, after the fork.
    #[error("workload setup failed at {step}: {errno}")]
    Setup {
        /// The step, as the workload reported it.
        step: String,
        /// Why.
        errno: Errno,
    },
    /// PID 1 itself could not do its part (block signals, fork, make a
    /// pipe or signalfd, poll).
    #[error("{step}: {errno}")]
    Supervise {
        /// What it was doing.
        step: &'static str,
        /// Why.
        errno: Errno,
    },
}

/// Why the daemon could not prepare, claim or watch a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Its cgroup could not be created.
    #[error("cannot create the sandbox's cgroup: {0}")]
    CreateCgroup(#[source] CgroupError),
    /// A file of its cgroup could not be opened for the init to join.
    #[error("cannot open {}: {source}", path.display())]
    JoinCgroup {
        /// The cgroup directory or `tasks` file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The init could not be cloned or told to go.
    #[error("cannot start the sandbox: {0}")]
    Start(#[source] io::Error),
    /// The reactor could not watch the sandbox's pidfd or status pipe.
    #[error("cannot watch the sandbox: {0}")]
    Watch(#[source] io::Error),
    /// The workload's log could not be opened.
    #[error("cannot open the agent log {}: {source}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The claim could not be sent to the init.
    #[error("cannot hand the sandbox its workload: {0}")]
    Claim(#[source] io::Error),
    /// The cgroup could not be renamed after its owner or limited.
    #[error("{0}")]
    ClaimCgroup(#[source] CgroupError),
    /// The init could not be told to start the workload.
    #[error("cannot start the sandbox: {0}")]
    Go(#[source] io::Error),
    /// The sandbox ended before it could be claimed.
    #[error("the sandbox ended before it could be claimed")]
    Gone,
}

impl LaunchError {
    /// The protocol word for the reply: each of these is the kernel's or
    /// the host's failure, never the caller's.
    pub fn code(&self) -> ErrorCode {
        match self {
            LaunchError::CreateCgroup(_)
            | LaunchError::JoinCgroup { .. }
            | LaunchError::Start(_)
            | LaunchError::Watch(_)
            | LaunchError::Log { .. }
            | LaunchError::Claim(_)
            | LaunchError::ClaimCgroup(_)
            | LaunchError::Go(_)
            | LaunchError::Gone => ErrorCode::Internal,
        }
    }
}

impl SetupError {
    /// The protocol word for the SPAWN reply. A setup step that fails is
    /// the kernel's own failure: `internal`; a workload that cannot be
    /// started says why in the caller's terms.
    pub fn code(&self) -> ErrorCode {
        match self {
            SetupError::ReadSpec(_)
            | SetupError::ParseSpec(_)
            | SetupError::Root(_)
            | SetupError::Loopback(_)
            | SetupError::Rlimits(_)
            | SetupError::Hostname(_)
            | SetupError::Privileges(_)
            | SetupError::TieToParent(_)
            | SetupError::Seccomp(_)
            | SetupError::Control(_) => ErrorCode::Internal,
            SetupError::Workload(err) => err.code(),
        }
    }
}

impl WorkloadError {
    /// The protocol word: what is missing is `not_found`, what the agent's
    /// user may not use is `permission_denied`, what the request cannot
    /// mean is `bad_request`, and the rest is the kernel's own failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkloadError::ScriptMissing(_)
            | WorkloadError::NotOnPath { .. }
            | WorkloadError::ProgramMissing(_)
            | WorkloadError::CwdMissing(_) => ErrorCode::NotFound,
            WorkloadError::ScriptUnreadable { .. }
            | WorkloadError::NotExecutable(_)
            | WorkloadError::Cwd { .. } => ErrorCode::PermissionDenied,
            WorkloadError::NulByte | WorkloadError::Exec { .. } => ErrorCode::BadRequest,
            WorkloadError::Setup { .. } | WorkloadError::Supervise { .. } => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_failed_setup_step_is_internal_and_names_its_path() {
        let err = SetupError::from(MountError {
            step: "cannot bind",
            path: PathBuf::from("/srv/agents"),
            source: io::ErrorKind::PermissionDenied.into(),
        });
        assert_eq!(err.code(), ErrorCode::Internal);
        let message = err.to_string();
        assert!(
            message.starts_with("sandbox setup failed: cannot bind /srv/agents: "),
            "{message}"
        );
        let err = SetupError::from(PrivilegeError::SwitchUser {
            call: "setresuid",
            source: Errno::EPERM,
        });
        assert_eq!(err.code(), ErrorCode::Internal);
        assert_eq!(err.to_string(), format!("setresuid: {}", Errno::EPERM));
    }

    #[test]
    fn a_workload_that_cannot_start_says_why_in_the_callers_terms() {
        let missing = SetupError::from(WorkloadError::ProgramMissing("/no/such".into()));
        assert_eq!(missing.code(), ErrorCode::NotFound);
        assert_eq!(
            missing.to_string(),
            "program /no/such does not exist in the sandbox"
        );
        let denied = SetupError::from(WorkloadError::NotExecutable("/srv/tool".into()));
        assert_eq!(denied.code(), ErrorCode::PermissionDenied);
        let nul = SetupError::from(WorkloadError::NulByte);
        assert_eq!(nul.code(), ErrorCode::BadRequest);
        let fork = SetupError::from(WorkloadError::Supervise {
            step: "cannot fork the workload",
            errno: Errno::EAGAIN,
        });
        assert_eq!(fork.code(), ErrorCode::Internal);
        assert_eq!(
            fork.to_string(),
            format!("cannot fork the workload: {}", Errno::EAGAIN)
        );
    }
}
