//! Giving up privileges, in the order the kernel requires: resource limits
//! (lowering needs nothing), the capability bounding set (dropping needs
//! CAP_SETPCAP, so while still root), the user switch (which clears the
//! effective and permitted capabilities), any capabilities left (inside a
//! user namespace the init stays uid 0, so they are cleared by hand),
//! no_new_privs (so no exec can regain anything), then the parent-death
//! signal — last, because changing credentials resets it.

use std::io;

use caps::CapSet;
use nix::unistd::{Gid, Uid};

use super::spec::{Rlimits, User};

/// Lowers the resource limits the workload will inherit. Core dumps are off.
pub fn set_rlimits(limits: &Rlimits) -> io::Result<()> {
    use nix::sys::resource::{setrlimit, Resource};
    setrlimit(Resource::RLIMIT_NOFILE, limits.nofile, limits.nofile)?;
    setrlimit(Resource::RLIMIT_FSIZE, limits.fsize, limits.fsize)?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// Drops every capability for good and, if given, becomes `user`.
pub fn drop_all(user: Option<User>) -> Result<(), String> {
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap)
            .map_err(|err| format!("cannot drop {cap} from the bounding set: {err}"))?;
    }
    if let Some(user) = user {
        let gid = Gid::from_raw(user.gid);
        let uid = Uid::from_raw(user.uid);
        nix::unistd::setgroups(&[gid]).map_err(|err| format!("setgroups: {err}"))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|err| format!("setresgid: {err}"))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|err| format!("setresuid: {err}"))?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set)
            .map_err(|err| format!("cannot clear {set:?} capabilities: {err}"))?;
    }
    // SAFETY: prctl with constant arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", io::Error::last_os_error()));
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
