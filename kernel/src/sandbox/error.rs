//! Why a sandbox could not start its workload: each step of the init's
//! setup that can fail, with the path, call or step it failed on, and the
//! one place ([`SetupError::code`]) that turns a reason into the protocol
//! word of the SPAWN reply.

use std::io;

use agentos_proto::ErrorCode;
use nix::errno::Errno;

use super::control::ControlError;
use super::init::Failure;
use super::mounts::MountError;
use super::privileges::PrivilegeError;
use super::seccomp::SeccompError;

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
    /// The PID 1 half failed: holding signals, or starting the workload
    /// (no such program or script, one the user may not run, arguments
    /// with NUL bytes). It chooses the code itself, from what the exec in
    /// the forked workload reported.
    #[error(transparent)]
    Pid1(#[from] Failure),
}

impl SetupError {
    /// The protocol word for the SPAWN reply. A setup step that fails is
    /// the kernel's own failure: `internal`. A workload that cannot be
    /// started keeps the code PID 1 chose for it (a missing program is
    /// `not_found`).
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
            SetupError::Pid1(failure) => failure.code,
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
    fn a_workload_that_cannot_start_keeps_the_code_pid1_chose() {
        let err = SetupError::from(Failure {
            code: ErrorCode::NotFound,
            message: "program /no/such does not exist in the sandbox".into(),
        });
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert_eq!(
            err.to_string(),
            "program /no/such does not exist in the sandbox"
        );
    }
}
