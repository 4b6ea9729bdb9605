//! Giving a run child its disks. A run child is prepared ahead, already
//! without privileges, with a private tmpfs on `/workspace` and `/tmp`;
//! the session that takes it brings its disk, and a template its own,
//! which the kernel mounts from outside: a copy of each part of the
//! mounted disk (`open_tree`; a read-only mount's copy is read-only),
//! moved into the child's mount namespace (`setns` on its pidfd, then
//! `move_mount`). Nothing of a disk is ever visible to an exec host, and
//! no other session's: the child sees exactly its own parts, where its
//! tmpfs mounts (or empty directories) were.
//!
//! Joining another mount namespace changes the whole thread's view of the
//! filesystem, so it is done on a thread of its own that ends with it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `open_tree(2)`: a detached copy of the mount at the path.
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
/// `move_mount(2)`: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// One part of a disk and where it goes in the child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The part, a directory at the disk's root.
    pub part: &'static str,
    /// Where the child sees it: a mount point of its own.
    pub target: &'static str,
}

/// Mounts each of `places` — a part of the disk mounted at a root, and
/// where it goes — over its target in the mount namespace of the process
/// `pidfd` refers to.
pub fn attach(pidfd: BorrowedFd<'_>, places: &[(PathBuf, Place)]) -> io::Result<()> {
    let mut trees = Vec::with_capacity(places.len());
    for (disk_root, place) in places {
        trees.push((clone_tree(&disk_root.join(place.part))?, place.target));
    }
    let pidfd = pidfd.try_clone_to_owned()?;
    let thread = agentos_primitives::threads::spawn("agentos-disk-attach", move || {
        // A thread shares its filesystem view with the others until it
        // takes one of its own; only then may it join another namespace.
        // SAFETY: unshare takes flags only; CLONE_FS affects this thread.
        if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the descriptor is a pidfd this closure owns.
        if unsafe { libc::setns(pidfd.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for (tree, target) in &trees {
            move_tree(tree, target)?;
        }
        Ok(())
    })?;
    thread
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the attaching thread failed")))
}

fn clone_tree(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel has just made this descriptor, and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn move_tree(tree: &OwnedFd, target: &str) -> io::Result<()> {
    let target = CString::new(target)?;
    let empty = CString::default();
    // SAFETY: both strings are NUL-terminated and outlive the call; the
    // tree's descriptor is open.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("mount on {target:?}: {err}"),
        ));
    }
    Ok(())
}
