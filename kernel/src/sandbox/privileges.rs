//! Giving up privileges, in the order the kernel requires: resource limits
//! (lowering needs nothing), the capability bounding set (dropping needs
//! CAP_SETPCAP, so while still root), the user switch (which clears the
//! effective and permitted capabilities), any capabilities left (inside a
//! user namespace the init stays uid 0, so they are cleared by hand),
//! no_new_privs (so no exec can regain anything), then the parent-death
//! signal — last, because changing credentials resets it.

use std::io;

use caps::errors::CapsError;
use caps::{CapSet, Capability};
use nix::errno::Errno;
use nix::unistd::{Gid, Uid};

use super::spec::{Rlimits, User};

/// The step of [`drop_all`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// A capability could not be dropped from the bounding set.
    #[error("cannot drop {capability} from the bounding set: {source}")]
    Bounding {
        /// The capability.
        capability: Capability,
        /// Why it failed.
        source: CapsError,
    },
    /// One of the calls that switch to the workload's user failed.
    #[error("{call}: {source}")]
    SwitchUser {
        /// `setgroups`, `setresgid` or `setresuid`.
        call: &'static str,
        /// Why it failed.
        source: Errno,
    },
    /// A capability set could not be cleared.
    #[error("cannot clear {set:?} capabilities: {source}")]
    Clear {
        /// The set.
        set: CapSet,
        /// Why it failed.
        source: CapsError,
    },
    /// `no_new_privs` could not be set.
    #[error("no_new_privs: {0}")]
    NoNewPrivs(#[source] io::Error),
}

/// Lowers the resource limits the workload will inherit. Core dumps are off.
pub fn set_rlimits(limits: &Rlimits) -> io::Result<()> {
    use nix::sys::resource::{setrlimit, Resource};
    setrlimit(Resource::RLIMIT_NOFILE, limits.nofile, limits.nofile)?;
    setrlimit(Resource::RLIMIT_FSIZE, limits.fsize, limits.fsize)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// Drops every capability for good and, if given, becomes `user`.
pub fn drop_all(user: Option<User>) -> Result<(), PrivilegeError> {
    for capability in caps::all() {
        caps::drop(None, CapSet::Bounding, capability)
            .map_err(|source| PrivilegeError::Bounding { capability, source })?;
    }
    if let Some(user) = user {
        let gid = Gid::from_raw(user.gid);
        let uid = Uid::from_raw(user.uid);
        let switch = |call| move |source| PrivilegeError::SwitchUser { call, source };
        nix::unistd::setgroups(&[gid]).map_err(switch("setgroups"))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(switch("setresgid"))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(switch("setresuid"))?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|source| PrivilegeError::Clear { set, source })?;
    }
    // SAFETY: prctl with constant arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(PrivilegeError::NoNewPrivs(io::Error::last_os_error()));
    }
    Ok(())
}

/// Dies with the daemon, and keeps other processes of the same user from
/// reading this one's memory (`/proc/<pid>/mem` needs a dumpable target).
pub fn tie_to_parent() -> io::Result<()> {
    // SAFETY: prctl with constant arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
