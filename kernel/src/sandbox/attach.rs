//! Mounting disks into a sandbox from outside: a session's disk, a
//! template and volumes into a run child, volumes into an agent's sandbox
//! before its workload is started. Each is a copy of a mount the kernel
//! holds (`open_tree`; a read-only mount's copy is read-only, and a copy
//! may be made read-only on its own), moved into the sandbox's mount
//! namespace (`setns` on its pidfd, then `move_mount`). Nothing of a disk
//! is visible to any other sandbox: each sees exactly what it was given.
//!
//! Joining another mount namespace changes the whole thread's view of the
//! filesystem, so it is done on a thread of its own that ends with it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// `open_tree(2)`: a detached copy of the mount at the path.
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
/// `move_mount(2)`: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
/// `move_mount(2)`: the target is the descriptor itself.
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
/// `mount_setattr(2)`: read-only.
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// One part of a disk and where it goes in a run child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The part, a directory at the disk's root.
    pub part: &'static str,
    /// Where the child sees it: a mount point of its own.
    pub target: &'static str,
}

/// A volume and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePlace {
    /// The volume's files, as the kernel has them mounted.
    pub source: PathBuf,
    /// Where the sandbox sees them: a plain absolute path.
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// How volumes' mount points are made in the sandbox.
#[derive(Clone, Debug)]
pub struct VolumeRoots {
    /// The directory volume targets are beneath, in the sandbox's mount
    /// namespace: `/` for a run child; the staging root of a sandbox not
    /// yet entered.
    pub base: PathBuf,
    /// Directories (beneath `base`) that only the host's empty mount
    /// points are: a private tmpfs covers one before a volume's mount
    /// point is made in it.
    pub covered: Vec<&'static str>,
    /// Who owns the directories made (the sandbox's user).
    pub owner: (u32, u32),
}

/// Mounts each of `places` — a part of a disk mounted at a root, and where
/// it goes — over its target, then each of `volumes` at its target
/// (made if missing, as `roots` says), in the mount namespace of the
/// process `pidfd` refers to.
pub fn attach(
    pidfd: BorrowedFd<'_>,
    places: &[(PathBuf, Place)],
    volumes: &[VolumePlace],
    roots: &VolumeRoots,
) -> io::Result<()> {
    let mut trees = Vec::with_capacity(places.len());
    for (disk_root, place) in places {
        trees.push((clone_tree(&disk_root.join(place.part))?, place.target));
    }
    let mut volume_trees = Vec::with_capacity(volumes.len());
    for volume in volumes {
        let tree = clone_tree(&volume.source)?;
        if volume.read_only {
            make_read_only(&tree)?;
        }
        volume_trees.push((tree, volume.target.clone()));
    }
    // A volume beneath another's path would be hidden by it: shallowest
    // first.
    volume_trees.sort_by_key(|(_, target)| target.components().count());
    let roots = roots.clone();
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
        let mut covered = Vec::new();
        for (tree, target) in &volume_trees {
            let at = mount_point(&roots, target, &mut covered)?;
            move_tree_to(tree, &at, target)?;
        }
        Ok(())
    })?;
    thread
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the attaching thread failed")))
}

/// The directory `target` names beneath `roots.base`, made where missing
/// without following any symbolic link (what a sandbox wrote may be
/// anything); a covered root it lies beneath gets its private tmpfs first
/// (once: `covered` lists those done).
fn mount_point(
    roots: &VolumeRoots,
    target: &Path,
    covered: &mut Vec<&'static str>,
) -> io::Result<OwnedFd> {
    let names: Vec<&std::ffi::OsStr> = target
        .components()
        .map(|c| match c {
            Component::RootDir => Ok(None),
            Component::Normal(name) => Ok(Some(name)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{target:?} is not a plain path"),
            )),
        })
        .filter_map(Result::transpose)
        .collect::<io::Result<_>>()?;
    let root = roots
        .covered
        .iter()
        .find(|root| target.starts_with(root) && target != Path::new(root));
    if let Some(root) = root.filter(|root| !covered.contains(root)) {
        let at = roots.base.join(root.trim_start_matches('/'));
        nix::mount::mount(
            Some("tmpfs"),
            &at,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV
                | nix::mount::MsFlags::MS_NOEXEC,
            Some("size=64k,mode=0755"),
        )?;
        covered.push(root);
    }
    let mut dir = open_dir(None, &roots.base)?;
    for name in names {
        match nix::sys::stat::mkdirat(&dir, name, nix::sys::stat::Mode::from_bits_truncate(0o755)) {
            Ok(()) => {
                let (uid, gid) = roots.owner;
                nix::unistd::fchownat(
                    &dir,
                    name,
                    Some(uid.into()),
                    Some(gid.into()),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
            }
            Err(nix::errno::Errno::EEXIST) => {}
            Err(err) => return Err(err.into()),
        }
        dir = open_dir(Some(&dir), Path::new(name))?;
    }
    Ok(dir)
}

/// Opens directory `path` (beneath `at`, if given) without following a
/// symbolic link at its last name.
fn open_dir(at: Option<&OwnedFd>, path: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match at {
        Some(dir) => nix::fcntl::openat(dir, path, flags, nix::sys::stat::Mode::empty()),
        None => nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty()),
    };
    fd.map_err(|err| {
        io::Error::new(
            io::Error::from(err).kind(),
            format!("a volume's mount point: {path:?} is not a directory there ({err})"),
        )
    })
}

fn clone_tree(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // A link where a disk's part should be is not followed: the clone
    // would be of whatever host path it names.
    let flags = OPEN_TREE_CLONE
        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint
        | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel has just made this descriptor, and nothing else
    // owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Makes a detached tree read-only (its own flag, not its filesystem's).
fn make_read_only(tree: &OwnedFd) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = CString::default();
    // SAFETY: the path is NUL-terminated, `attr` is a `struct mount_attr`
    // of the size passed, and both outlive the call.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn move_tree(tree: &OwnedFd, target: &str) -> io::Result<()> {
    let path = CString::new(target)?;
    moved(tree, libc::AT_FDCWD, &path, MOVE_MOUNT_F_EMPTY_PATH, target)
}

/// Moves `tree` onto the directory `at` (which `target` names).
fn move_tree_to(tree: &OwnedFd, at: &OwnedFd, target: &Path) -> io::Result<()> {
    let flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH;
    let shown = target.display().to_string();
    moved(tree, at.as_raw_fd(), &CString::default(), flags, &shown)
}

/// `move_mount(2)` of `tree` to `path` beneath `at` (the target itself
/// with an empty path and `MOVE_MOUNT_T_EMPTY_PATH`).
fn moved(
    tree: &OwnedFd,
    at: i32,
    path: &CString,
    flags: libc::c_uint,
    shown: &str,
) -> io::Result<()> {
    let empty = CString::default();
    // SAFETY: both strings are NUL-terminated and outlive the call; the
    // descriptors are open.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            at,
            path.as_ptr(),
            flags,
        )
    };
    if result != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(
            err.kind(),
            format!("mount on {shown:?}: {err}"),
        ));
    }
    Ok(())
}
