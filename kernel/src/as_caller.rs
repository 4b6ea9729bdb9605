//! A thread that acts as its caller: the caller's uid and gid for the
//! filesystem (`setfsuid`, `setfsgid`), its supplementary groups, and no
//! capabilities. What such a thread opens or creates — a file, a socket —
//! is the caller's, checked and owned as the caller's would be, never the
//! kernel's.
//!
//! These are raw system calls: the C library's `setgroups` would change
//! every thread of the kernel. The thread ends with its work, and its
//! credentials with it.

use std::io;

use agentos_proto::{ErrorCode, ErrorReply};

/// Whom a thread acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsCaller {
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// Runs `work` on a thread (`name`) that acts as `who`, and waits for it.
/// `what` names the work in errors ("files").
pub fn run<T: Send + 'static>(
    name: &'static str,
    what: &'static str,
    who: AsCaller,
    work: impl FnOnce() -> Result<T, ErrorReply> + Send + 'static,
) -> Result<T, ErrorReply> {
    let thread = agentos_primitives::threads::spawn(name, move || {
        become_caller(&who).map_err(|err| cannot_act_as(&who, what, &err))?;
        work()
    })
    .map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot start a thread for {what}: {err}"),
        )
    })?;
    thread.join().unwrap_or_else(|_| {
        Err(ErrorReply::new(
            ErrorCode::Internal,
            format!("the thread for {what} failed; the kernel's log says why"),
        ))
    })
}

/// The refusal when a thread cannot become `who`.
pub fn cannot_act_as(who: &AsCaller, what: &str, err: &io::Error) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Unavailable,
        format!(
            "the kernel cannot act as uid {} for {what} ({err}); it needs root to act as \
             its callers",
            who.uid
        ),
    )
}

/// Makes this thread the caller for the filesystem, without capabilities.
/// A kernel that is not root may act only as its own uid.
pub fn become_caller(who: &AsCaller) -> io::Result<()> {
    let own = nix::unistd::geteuid().as_raw();
    if own == 0 {
        // SAFETY: raw setgroups(2) on this thread alone, with a valid
        // pointer to `len` gids.
        let rc =
            unsafe { libc::syscall(libc::SYS_setgroups, who.groups.len(), who.groups.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: setfsgid(2)/setfsuid(2) change this thread's
        // filesystem ids; they take plain integers.
        unsafe {
            libc::syscall(libc::SYS_setfsgid, who.gid);
            libc::syscall(libc::SYS_setfsuid, who.uid);
        }
        // Each returns the ids in force: ask again to be sure they took.
        // SAFETY: as above; -1 changes nothing.
        let (fsuid, fsgid) = unsafe {
            (
                libc::syscall(libc::SYS_setfsuid, -1i32) as u32,
                libc::syscall(libc::SYS_setfsgid, -1i32) as u32,
            )
        };
        if (fsuid, fsgid) != (who.uid, who.gid) {
            return Err(io::Error::other(format!(
                "the filesystem ids are {fsuid}:{fsgid}"
            )));
        }
    } else if who.uid != own {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    drop_capabilities()
}

/// Clears this thread's capabilities (raw capset(2): this thread only).
fn drop_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let none = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset(2) reads a valid header and two data structs.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, none.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
