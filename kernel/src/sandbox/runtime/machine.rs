//! What this machine lets the kernel give a sandbox: cgroups for limits, and
//! namespaces (as root, or through a user namespace when the daemon is
//! not root). Probed once at start; a missing piece degrades isolation,
//! and every SPAWN reply says so.

use std::sync::Arc;

use agentos_proto::payload::CgroupVersion;

use crate::cgroup::Cgroups;

/// The machine's support for sandboxes.
#[derive(Debug, Default)]
pub struct Machine {
    /// cgroups in use, if any.
    pub cgroups: Option<Arc<Cgroups>>,
    /// Why there are no cgroups, when there are none.
    pub no_cgroups: Option<String>,
    /// Why sandboxes cannot have namespaces at all, when they cannot.
    pub no_namespaces: Option<String>,
    /// How a sandbox's user is mapped when the daemon is not root: the
    /// daemon's own uid and gid.
    pub map_to: Option<(u32, u32)>,
}

impl Machine {
    /// Probes cgroups and namespaces, logging what is missing.
    pub fn probe() -> Machine {
        let (cgroups, no_cgroups) = match Cgroups::detect() {
            Ok(cgroups) => match cgroups.start() {
                Ok(()) => (Some(Arc::new(cgroups)), None),
                Err(err) => (None, Some(format!("cgroups could not be set up: {err}"))),
            },
            Err(reason) => (None, Some(reason.to_string())),
        };
        match (&cgroups, &no_cgroups) {
            (Some(c), _) => {
                log::info!("agent limits enforced with cgroup {}", c.version().as_str())
            }
            (None, Some(reason)) => log::warn!("{reason}"),
            _ => {}
        }
        let euid = nix::unistd::geteuid();
        let (no_namespaces, map_to) = if euid.is_root() {
            (None, None)
        } else {
            match probe_user_namespaces() {
                Ok(()) => (None, Some((euid.as_raw(), nix::unistd::getegid().as_raw()))),
                Err(reason) => (Some(reason.to_string()), None),
            }
        };
        if let Some(reason) = &no_namespaces {
            log::warn!("{reason}");
        }
        Machine {
            cgroups,
            no_cgroups,
            no_namespaces,
            map_to,
        }
    }

    /// Whether sandboxes get namespaces.
    pub fn has_namespaces(&self) -> bool {
        self.no_namespaces.is_none()
    }

    /// The cgroup version enforcing limits, if any.
    pub fn cgroup_version(&self) -> Option<CgroupVersion> {
        self.cgroups.as_ref().map(|c| c.version())
    }

    /// Whether PAUSE can freeze agents here.
    pub fn can_freeze(&self) -> bool {
        self.cgroups.as_ref().is_some_and(|c| c.can_freeze())
    }
}

/// Why an unprivileged daemon cannot give sandboxes namespaces.
#[derive(Debug, thiserror::Error)]
enum NoUserNamespaces {
    /// The probe's child could not create a user namespace.
    #[error(
        "agentosd is not root and this host does not let it create user \
         namespaces: agents run without namespaces"
    )]
    Refused,
    /// The probe's child could not be started.
    #[error("cannot probe user namespaces: {0}")]
    Probe(#[source] nix::errno::Errno),
}

/// Whether this (unprivileged) process may create a user namespace: tried
/// in a short-lived child so the daemon itself is untouched.
fn probe_user_namespaces() -> Result<(), NoUserNamespaces> {
    // SAFETY: the child only calls unshare and _exit.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: async-signal-safe calls only.
            unsafe {
                let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
                libc::_exit(if ok { 0 } else { 1 })
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                _ => Err(NoUserNamespaces::Refused),
            }
        }
        Err(err) => Err(NoUserNamespaces::Probe(err)),
    }
}
