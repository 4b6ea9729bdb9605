//! Building the sandbox's root filesystem, inside its private mount
//! namespace. Every side effect goes through [`Syscalls`], so the order of
//! operations — which is what makes the result safe — is tested without
//! root against a recording double.
//!
//! Two rules hold for every mount:
//! - a path inside the new root is resolved *beneath* it, as if it were
//!   already `/`: symlinks are followed as they would be inside, `..` stops
//!   at the root, and missing directories are created there — so nothing
//!   is ever mounted or created outside the staging directory, whatever
//!   the bound directories contain; and only plain absolute paths (no `.`
//!   or `..`) are accepted at all;
//! - a bind's host source is opened without following any symlink, so the
//!   directory bound is exactly the one the daemon resolved.
//!
//! Preparation ([`prepare_root`]), which a sandbox of the warm pool does
//! before any workload has claimed it:
//! 1. make every mount private, so nothing propagates to or from the host;
//! 2. mount a tmpfs on the staging directory: the new root, unbindable,
//!    so that no recursive bind copies it into itself;
//! 3. a fresh /dev with a handful of device nodes bound from the host;
//! 4. writable tmpfs scratch space (/tmp, /workspace, /dev/shm);
//! 5. bind what every program needs (read-only) and create symlinks;
//! 6. a fresh /proc (the sandbox has its own PID namespace), with the
//!    kernel-facing corners made read-only or hidden;
//! 7. hide secrets (and the kernel's own files) inside bound directories.
//!
//! Entry ([`enter_root`]), once the claim has said what the workload needs:
//! 8. bind the workload's own paths (script directory, interpreter, socket);
//! 9. hide again every secret lying in one of the directories bound: a
//!    mask is always mounted after every bind that could uncover it;
//! 10. pivot_root into the new root and detach the old one — from here on
//!     the host filesystem is unreachable;
//! 11. make the new root itself read-only.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::spec::{Bind, RootFs, User};

/// What to create at a mount point that does not exist yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// A directory (mode 0755).
    Dir,
    /// An empty regular file, to mount a non-directory on.
    File,
}

/// The system calls root construction needs.
pub trait Syscalls {
    /// mount(2).
    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()>;
    /// `path` (plain and absolute, as seen inside) resolved beneath `root`
    /// as if `root` were `/`. With `create`, missing directories on the
    /// way are made and a missing last component becomes that node;
    /// without, a missing path is `Ok(None)`. Returns a name for the
    /// resolved location that mount(2) and symlink(2) accept.
    fn beneath(
        &mut self,
        root: &Path,
        path: &Path,
        create: Option<Node>,
    ) -> io::Result<Option<PathBuf>>;
    /// A bind source: `path` opened without following any symlink in it.
    /// Returns a name for exactly that file that mount(2) accepts.
    fn source(&mut self, path: &Path) -> io::Result<PathBuf>;
    /// symlink(2): `path` will point to `target`.
    fn symlink(&mut self, target: &Path, path: &Path) -> io::Result<()>;
    /// Whether `path` is a directory (following symlinks).
    fn is_dir(&mut self, path: &Path) -> bool;
    /// The flags of the mount holding `path` that a read-only remount must
    /// repeat: in a user namespace nosuid/nodev/noexec/atime are locked.
    fn locked_flags(&mut self, path: &Path) -> MsFlags;
    /// pivot_root(2).
    fn pivot_root(&mut self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    /// chdir(2).
    fn chdir(&mut self, path: &Path) -> io::Result<()>;
    /// umount2(2) with MNT_DETACH.
    fn umount_detach(&mut self, path: &Path) -> io::Result<()>;
    /// rmdir(2).
    fn rmdir(&mut self, path: &Path) -> io::Result<()>;
}

/// A step that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{step} {}: {source}", path.display())]
pub struct MountError {
    /// What was being done.
    pub step: &'static str,
    /// On which path.
    pub path: PathBuf,
    /// Why it failed.
    pub source: io::Error,
}

fn failed<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Files under /proc that expose the host kernel and are masked with /dev/null.
pub const PROC_MASKED: [&str; 4] = ["kcore", "keys", "timer_list", "sysrq-trigger"];
/// Directories under /proc made read-only.
pub const PROC_READ_ONLY: [&str; 4] = ["sys", "irq", "bus", "fs"];
/// Links every /dev has.
const DEV_LINKS: [(&str, &str); 4] = [
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// Whether `path` is absolute and made only of plain names: no `.`, no
/// `..`. Every path the sandbox mounts on or binds from must be.
pub fn is_plain(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    // Read the bytes: `Path::components` silently drops inner `.`s.
    let bytes = path.as_os_str().as_bytes();
    bytes.first() == Some(&b'/')
        && bytes
            .split(|b| *b == b'/')
            .all(|name| name != b"." && name != b"..")
}

/// `path` resolved beneath `root`, created as `create` says if missing.
fn resolve(
    sys: &mut dyn Syscalls,
    root: &Path,
    path: &Path,
    create: Option<Node>,
) -> Result<Option<PathBuf>, MountError> {
    if !is_plain(path) {
        return Err(not_plain(path));
    }
    let step = match create {
        Some(_) => "cannot create mount point",
        None => "cannot resolve",
    };
    sys.beneath(root, path, create).map_err(failed(step, path))
}

/// The mount point for `path` inside `root`, created as `node` if missing.
fn mount_point(
    sys: &mut dyn Syscalls,
    root: &Path,
    path: &Path,
    node: Node,
) -> Result<PathBuf, MountError> {
    resolve(sys, root, path, Some(node))?
        .ok_or_else(|| failed("cannot create mount point", path)(io::ErrorKind::NotFound.into()))
}

/// `path` inside `root` if it exists there.
fn existing(
    sys: &mut dyn Syscalls,
    root: &Path,
    path: &Path,
) -> Result<Option<PathBuf>, MountError> {
    resolve(sys, root, path, None)
}

fn not_plain(path: &Path) -> MountError {
    MountError {
        step: "refusing a path that is not absolute and plain (no `.` or `..`)",
        path: path.to_path_buf(),
        source: io::ErrorKind::InvalidInput.into(),
    }
}

/// Prepares `root` in the staging directory (steps 1–7). `user` owns the
/// tmpfs marked `owned_by_user`.
pub fn prepare_root(
    root: &RootFs,
    user: Option<User>,
    sys: &mut dyn Syscalls,
) -> Result<(), MountError> {
    let staging = root.staging.as_path();

    // 1. Nothing we mount may reach the host, nor host mounts reach us.
    sys.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )
    .map_err(failed("cannot make mounts private at", Path::new("/")))?;

    // 2. The new root: a small tmpfs that holds only mount points.
    sys.mount(
        Some(Path::new("tmpfs")),
        staging,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=4m"),
    )
    .map_err(failed("cannot mount the root tmpfs on", staging))?;
    // Unbindable, because a directory the workload is given may hold the
    // staging directory (a script kept beside the kernel's socket): its
    // recursive bind would carry a copy of this very root, every mount of
    // it, into the sandbox — and its mount table would list them all at
    // their paths under the kernel's state directory, masked or not. A
    // recursive bind leaves unbindable mounts out.
    sys.mount(None, staging, None, MsFlags::MS_UNBINDABLE, None)
        .map_err(failed("cannot make the root unbindable at", staging))?;

    // 3. /dev: a tmpfs with only the harmless devices.
    if !root.devices.is_empty() {
        let dev = mount_point(sys, staging, Path::new("/dev"), Node::Dir)?;
        sys.mount(
            Some(Path::new("tmpfs")),
            &dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=64k"),
        )
        .map_err(failed("cannot mount tmpfs on", Path::new("/dev")))?;
        for device in &root.devices {
            let target = mount_point(sys, staging, device, Node::File)?;
            let source = sys.source(device).map_err(failed("cannot open", device))?;
            sys.mount(Some(&source), &target, None, MsFlags::MS_BIND, None)
                .map_err(failed("cannot bind device", device))?;
        }
        for (link, points_to) in DEV_LINKS {
            make_symlink(sys, staging, Path::new(link), Path::new(points_to))?;
        }
    }

    // 4. Writable scratch space — before the binds, so a bind may land
    //    inside it (a script under /tmp on the host shows up under the
    //    sandbox's own /tmp).
    for tmpfs in &root.tmpfs {
        let target = mount_point(sys, staging, &tmpfs.target, Node::Dir)?;
        let mut options = format!("mode={:o},size={}", tmpfs.mode, tmpfs.size);
        if let (true, Some(user)) = (tmpfs.owned_by_user, user) {
            options.push_str(&format!(",uid={},gid={}", user.uid, user.gid));
        }
        sys.mount(
            Some(Path::new("tmpfs")),
            &target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(&options),
        )
        .map_err(failed("cannot mount tmpfs on", &tmpfs.target))?;
    }

    for path in &root.mount_points {
        mount_point(sys, staging, path, Node::Dir)?;
    }

    // 5. What every program needs.
    bind_all(sys, staging, &root.binds)?;
    for link in &root.symlinks {
        make_symlink(sys, staging, &link.path, &link.target)?;
    }

    // 6. /proc of the sandbox's own PID namespace.
    if root.proc {
        let proc = mount_point(sys, staging, Path::new("/proc"), Node::Dir)?;
        sys.mount(
            Some(Path::new("proc")),
            &proc,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None,
        )
        .map_err(failed("cannot mount proc on", Path::new("/proc")))?;
        if root.proc_guards {
            for name in PROC_READ_ONLY {
                let inside = Path::new("/proc").join(name);
                if let Some(path) = existing(sys, staging, &inside)? {
                    sys.mount(
                        Some(&path),
                        &path,
                        None,
                        MsFlags::MS_BIND | MsFlags::MS_REC,
                        None,
                    )
                    .map_err(failed("cannot bind", &inside))?;
                    let bound = mount_point(sys, staging, &inside, Node::Dir)?;
                    remount_read_only(sys, &bound, &bound, &inside)?;
                }
            }
            for name in PROC_MASKED {
                let inside = Path::new("/proc").join(name);
                if let Some(path) = existing(sys, staging, &inside)? {
                    sys.mount(
                        Some(Path::new("/dev/null")),
                        &path,
                        None,
                        MsFlags::MS_BIND,
                        None,
                    )
                    .map_err(failed("cannot mask", &inside))?;
                }
            }
        }
    }

    // 7. Secrets inside bound directories.
    mask_all(sys, staging, &root.masks)
}

/// Binds the workload's own paths, hides again what they could uncover,
/// and enters the prepared root (steps 8–11).
pub fn enter_root(root: &RootFs, binds: &[Bind], sys: &mut dyn Syscalls) -> Result<(), MountError> {
    let staging = root.staging.as_path();
    // 8. The workload's own paths.
    bind_all(sys, staging, binds)?;

    // 9. A directory bound on or above a masked path (a script beside the
    //    kernel's config file) would show what the mask hides: mask those
    //    again, on top. A file bound at a path (the workload's socket, at
    //    the path the kernel's own socket has on the host) simply is that
    //    file, and stays.
    let covered: Vec<PathBuf> = root
        .masks
        .iter()
        .filter(|mask| {
            binds
                .iter()
                .any(|bind| mask.starts_with(&bind.target) && sys.is_dir(&bind.source))
        })
        .cloned()
        .collect();
    mask_all(sys, staging, &covered)?;

    // 10. Enter the new root; the old one (the host's) is detached for good.
    mount_point(sys, staging, Path::new("/.old-root"), Node::Dir)?;
    let put_old = staging.join(".old-root");
    sys.pivot_root(staging, &put_old)
        .map_err(failed("cannot pivot_root into", staging))?;
    sys.chdir(Path::new("/"))
        .map_err(failed("cannot chdir to", Path::new("/")))?;
    let old = Path::new("/.old-root");
    sys.umount_detach(old)
        .map_err(failed("cannot detach the old root at", old))?;
    sys.rmdir(old).map_err(failed("cannot remove", old))?;

    // 11. Only the scratch mounts stay writable.
    sys.mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None,
    )
    .map_err(failed("cannot make the root read-only at", Path::new("/")))
}

/// Binds each host path at its target inside `staging`, read-only unless
/// marked writable.
fn bind_all(sys: &mut dyn Syscalls, staging: &Path, binds: &[Bind]) -> Result<(), MountError> {
    for bind in binds {
        if !is_plain(&bind.source) {
            return Err(not_plain(&bind.source));
        }
        let node = if sys.is_dir(&bind.source) {
            Node::Dir
        } else {
            Node::File
        };
        let target = mount_point(sys, staging, &bind.target, node)?;
        let source = sys
            .source(&bind.source)
            .map_err(failed("cannot open bind source", &bind.source))?;
        sys.mount(
            Some(&source),
            &target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )
        .map_err(failed("cannot bind", &bind.source))?;
        if !bind.writable {
            // Resolved afresh: the name held for the mount point still
            // names what the bind now covers.
            let bound = mount_point(sys, staging, &bind.target, node)?;
            remount_read_only(sys, &bind.source, &bound, &bind.target)?;
        }
    }
    Ok(())
}

/// Hides each path that exists inside `staging`: a file becomes /dev/null,
/// a directory an empty read-only tmpfs.
fn mask_all(sys: &mut dyn Syscalls, staging: &Path, masks: &[PathBuf]) -> Result<(), MountError> {
    for mask in masks {
        let Some(target) = existing(sys, staging, mask)? else {
            continue;
        };
        if sys.is_dir(&target) {
            sys.mount(
                Some(Path::new("tmpfs")),
                &target,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0000,size=4k"),
            )
            .map_err(failed("cannot mask", mask))?;
        } else {
            sys.mount(
                Some(Path::new("/dev/null")),
                &target,
                None,
                MsFlags::MS_BIND,
                None,
            )
            .map_err(failed("cannot mask", mask))?;
        }
    }
    Ok(())
}

/// Creates the link `path` (inside `staging`) pointing to `target`.
fn make_symlink(
    sys: &mut dyn Syscalls,
    staging: &Path,
    path: &Path,
    target: &Path,
) -> Result<(), MountError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(not_plain(path));
    };
    let parent = mount_point(sys, staging, parent, Node::Dir)?;
    sys.symlink(target, &parent.join(name))
        .map_err(failed("cannot create symlink", path))
}

/// Remounts the mount at `target` read-only; `flags_of` is a path on the
/// mount whose locked flags must be kept.
fn remount_read_only(
    sys: &mut dyn Syscalls,
    flags_of: &Path,
    target: &Path,
    named: &Path,
) -> Result<(), MountError> {
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | sys.locked_flags(flags_of);
    sys.mount(None, target, None, flags, None)
        .map_err(failed("cannot make read-only", named))
}

/// The real system calls. Holds the descriptors behind the names it hands
/// out (`/proc/self/fd/N`) until it is dropped.
#[derive(Debug, Default)]
pub struct Real {
    held: Vec<std::os::fd::OwnedFd>,
}

impl Real {
    /// A name for `fd`'s file that path-based calls follow to exactly it.
    fn hold(&mut self, fd: std::os::fd::OwnedFd) -> PathBuf {
        use std::os::fd::AsRawFd;
        let name = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        self.held.push(fd);
        name
    }
}

/// Opens `relative` beneath `root` as if `root` were `/` (O_PATH).
fn open_in_root(root: &std::os::fd::OwnedFd, relative: &Path) -> nix::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    openat2(
        root,
        relative,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
}

impl Syscalls for Real {
    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data).map_err(io::Error::from)
    }

    fn beneath(
        &mut self,
        root: &Path,
        path: &Path,
        create: Option<Node>,
    ) -> io::Result<Option<PathBuf>> {
        use nix::errno::Errno;
        use nix::fcntl::OFlag;
        use nix::sys::stat::Mode;
        let root = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let relative = path.strip_prefix("/").unwrap_or(path);
        let node = match (open_in_root(&root, relative), create) {
            (Ok(fd), _) => return Ok(Some(self.hold(fd))),
            (Err(Errno::ENOENT), Some(node)) => node,
            (Err(Errno::ENOENT), None) => return Ok(None),
            (Err(errno), _) => return Err(errno.into()),
        };
        // Create what is missing one component at a time, each in its
        // parent as resolved beneath the root.
        let names: Vec<&std::ffi::OsStr> = relative.iter().collect();
        for depth in 1..=names.len() {
            let prefix: PathBuf = names[..depth].iter().collect();
            match open_in_root(&root, &prefix) {
                Ok(_) => continue,
                Err(Errno::ENOENT) => {}
                Err(errno) => return Err(errno.into()),
            }
            let parent: PathBuf = names[..depth - 1].iter().collect();
            let parent = open_in_root(&root, &parent)?;
            let name = names[depth - 1];
            if depth == names.len() && node == Node::File {
                nix::fcntl::openat(
                    &parent,
                    name,
                    OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_WRONLY
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o644),
                )?;
            } else {
                match nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
        }
        Ok(Some(self.hold(open_in_root(&root, relative)?)))
    }

    fn source(&mut self, path: &Path) -> io::Result<PathBuf> {
        use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
        let fd = openat2(
            nix::fcntl::AT_FDCWD,
            path,
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS),
        )?;
        Ok(self.hold(fd))
    }

    fn symlink(&mut self, target: &Path, path: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, path)
    }

    fn is_dir(&mut self, path: &Path) -> bool {
        path.is_dir()
    }

    fn locked_flags(&mut self, path: &Path) -> MsFlags {
        use nix::sys::statvfs::{statvfs, FsFlags};
        let Ok(stat) = statvfs(path) else {
            return MsFlags::empty();
        };
        let flags = stat.flags();
        [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ]
        .into_iter()
        .filter(|(st, _)| flags.contains(*st))
        .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms)
    }

    fn pivot_root(&mut self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        nix::unistd::pivot_root(new_root, put_old).map_err(io::Error::from)
    }

    fn chdir(&mut self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(io::Error::from)
    }

    fn umount_detach(&mut self, path: &Path) -> io::Result<()> {
        nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
    }

    fn rmdir(&mut self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
}

#[cfg(test)]
mod tests;
