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
//! 2. mount a tmpfs on the staging directory: the new root;
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
const PROC_MASKED: [&str; 4] = ["kcore", "keys", "timer_list", "sysrq-trigger"];
/// Directories under /proc made read-only.
const PROC_READ_ONLY: [&str; 4] = ["sys", "irq", "bus", "fs"];
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
mod tests {
    use super::*;
    use crate::sandbox::spec::{Symlink, Tmpfs};

    /// Records every call; directories listed in `dirs` exist, as do the
    /// paths in `existing`.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<String>,
        dirs: Vec<PathBuf>,
        existing: Vec<PathBuf>,
    }

    impl Syscalls for Recorder {
        fn mount(
            &mut self,
            source: Option<&Path>,
            target: &Path,
            fstype: Option<&str>,
            flags: MsFlags,
            data: Option<&str>,
        ) -> io::Result<()> {
            let mut words = vec![format!("mount {}", target.display())];
            if let Some(source) = source {
                words.push(format!("from {}", source.display()));
            }
            if let Some(fstype) = fstype {
                words.push(format!("type {fstype}"));
            }
            for (flag, name) in [
                (MsFlags::MS_BIND, "bind"),
                (MsFlags::MS_REC, "rec"),
                (MsFlags::MS_REMOUNT, "remount"),
                (MsFlags::MS_RDONLY, "ro"),
                (MsFlags::MS_PRIVATE, "private"),
                (MsFlags::MS_NOEXEC, "noexec"),
            ] {
                if flags.contains(flag) {
                    words.push(name.to_owned());
                }
            }
            if let Some(data) = data {
                words.push(format!("[{data}]"));
            }
            self.calls.push(words.join(" "));
            Ok(())
        }
        fn beneath(
            &mut self,
            root: &Path,
            path: &Path,
            create: Option<Node>,
        ) -> io::Result<Option<PathBuf>> {
            let full = root.join(path.strip_prefix("/").unwrap_or(path));
            if full == root || self.is_dir(&full) || self.existing.contains(&full) {
                return Ok(Some(full));
            }
            match create {
                Some(Node::Dir) => {
                    self.calls.push(format!("mkdir {}", full.display()));
                    self.dirs.push(full.clone());
                }
                Some(Node::File) => {
                    self.calls.push(format!("touch {}", full.display()));
                    self.existing.push(full.clone());
                }
                None => return Ok(None),
            }
            Ok(Some(full))
        }
        fn source(&mut self, path: &Path) -> io::Result<PathBuf> {
            Ok(path.to_path_buf())
        }
        fn symlink(&mut self, target: &Path, path: &Path) -> io::Result<()> {
            self.calls.push(format!(
                "symlink {} -> {}",
                path.display(),
                target.display()
            ));
            Ok(())
        }
        fn is_dir(&mut self, path: &Path) -> bool {
            self.dirs.iter().any(|d| d == path)
        }
        fn locked_flags(&mut self, path: &Path) -> MsFlags {
            if path == Path::new("/usr") {
                MsFlags::MS_NOEXEC
            } else {
                MsFlags::empty()
            }
        }
        fn pivot_root(&mut self, new_root: &Path, put_old: &Path) -> io::Result<()> {
            self.calls.push(format!(
                "pivot_root {} {}",
                new_root.display(),
                put_old.display()
            ));
            Ok(())
        }
        fn chdir(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(format!("chdir {}", path.display()));
            Ok(())
        }
        fn umount_detach(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(format!("umount -l {}", path.display()));
            Ok(())
        }
        fn rmdir(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(format!("rmdir {}", path.display()));
            Ok(())
        }
    }

    fn position(calls: &[String], prefix: &str) -> usize {
        calls
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no call starting with {prefix:?} in {calls:#?}"))
    }

    #[test]
    fn root_is_built_in_a_safe_order() {
        let root = RootFs {
            staging: "/stage".into(),
            binds: vec![Bind {
                source: "/usr".into(),
                target: "/usr".into(),
                writable: false,
            }],
            symlinks: vec![Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            }],
            tmpfs: vec![Tmpfs {
                target: "/workspace".into(),
                size: 1 << 20,
                mode: 0o700,
                owned_by_user: true,
            }],
            masks: vec!["/etc/shadow".into(), "/etc/agentos".into()],
            devices: vec!["/dev/null".into()],
            proc: true,
        };
        let mut sys = Recorder {
            dirs: vec![
                "/usr".into(),
                "/stage/etc/agentos".into(),
                "/stage/proc/sys".into(),
            ],
            existing: vec!["/stage/etc/shadow".into(), "/stage/proc/kcore".into()],
            ..Recorder::default()
        };
        let user = User {
            uid: 65534,
            gid: 65534,
        };
        prepare_root(&root, Some(user), &mut sys).unwrap();
        let prepared = sys.calls.len();
        let socket = Bind {
            source: "/run/agentos/agents/7.sock".into(),
            target: "/run/agentos/agentos.sock".into(),
            writable: true,
        };
        enter_root(&root, &[socket], &mut sys).unwrap();
        let calls = &sys.calls;

        // Private propagation comes before anything is mounted.
        assert_eq!(calls[0], "mount / rec private");
        assert_eq!(
            calls[1],
            "mount /stage from tmpfs type tmpfs [mode=0755,size=4m]"
        );
        // A read-only bind repeats the source mount's locked flags.
        let bind = position(calls, "mount /stage/usr from /usr bind rec");
        assert_eq!(calls[bind + 1], "mount /stage/usr bind remount ro noexec");
        // Scratch space comes before binds, so binds may land inside it.
        assert!(position(calls, "mount /stage/workspace") < bind);
        // The claim's socket is a file: a file mount point, bound after the
        // prepared part, and it stays writable.
        let socket = position(calls, "touch /stage/run/agentos/agentos.sock");
        assert!(socket >= prepared);
        assert!(!calls[socket + 2].contains("remount"));
        assert!(calls.contains(&"symlink /stage/bin -> usr/bin".to_owned()));
        assert!(calls.contains(&"symlink /stage/dev/fd -> /proc/self/fd".to_owned()));
        assert!(calls.contains(
            &"mount /stage/workspace from tmpfs type tmpfs [mode=700,size=1048576,uid=65534,gid=65534]"
                .to_owned()
        ));
        // /proc is the sandbox's own, with host-facing corners closed.
        let proc = position(calls, "mount /stage/proc from proc type proc noexec");
        assert!(position(calls, "mount /stage/proc/sys bind remount ro") > proc);
        assert!(position(calls, "mount /stage/proc/kcore from /dev/null bind") > proc);
        // Secrets: a file becomes /dev/null, a directory an empty tmpfs.
        assert!(calls.contains(&"mount /stage/etc/shadow from /dev/null bind".to_owned()));
        assert!(calls.contains(
            &"mount /stage/etc/agentos from tmpfs type tmpfs ro noexec [mode=0000,size=4k]"
                .to_owned()
        ));
        // The host root is detached, and the new root made read-only, last.
        let pivot = position(calls, "pivot_root /stage /stage/.old-root");
        assert_eq!(calls[pivot + 1], "chdir /");
        assert_eq!(calls[pivot + 2], "umount -l /.old-root");
        assert_eq!(calls[pivot + 3], "rmdir /.old-root");
        assert_eq!(calls.last().unwrap(), "mount / bind remount ro");
        assert!(calls[..pivot]
            .iter()
            .all(|c| !c.starts_with("mount / bind remount")));
    }

    #[test]
    fn a_mask_under_a_claimed_directory_is_mounted_again_after_its_bind() {
        let root = RootFs {
            staging: "/stage".into(),
            masks: vec!["/srv/agents/agentosd.toml".into(), "/etc/shadow".into()],
            ..RootFs::default()
        };
        let mut sys = Recorder {
            dirs: vec!["/srv/agents".into()],
            existing: vec![
                "/stage/srv/agents/agentosd.toml".into(),
                "/stage/etc/shadow".into(),
            ],
            ..Recorder::default()
        };
        prepare_root(&root, None, &mut sys).unwrap();
        let scripts = Bind {
            source: "/srv/agents".into(),
            target: "/srv/agents".into(),
            writable: false,
        };
        enter_root(&root, &[scripts], &mut sys).unwrap();
        let calls = &sys.calls;
        let bind = position(calls, "mount /stage/srv/agents from /srv/agents bind rec");
        let mask = "mount /stage/srv/agents/agentosd.toml from /dev/null bind";
        let last_mask = calls.iter().rposition(|c| c == mask).unwrap();
        assert!(last_mask > bind, "{calls:#?}");
        // Masks no claimed directory covers are not mounted twice.
        let shadow = "mount /stage/etc/shadow from /dev/null bind";
        assert_eq!(calls.iter().filter(|c| *c == shadow).count(), 1);
    }

    /// The system socket is `/run/agentos/agentos.sock` on the host, and
    /// the workload's own socket has that path inside: masking the host's
    /// must not hide the workload's.
    #[test]
    fn the_workloads_socket_is_not_masked_as_the_kernels() {
        let root = RootFs {
            staging: "/stage".into(),
            masks: vec!["/run/agentos/agentos.sock".into()],
            ..RootFs::default()
        };
        let mut sys = Recorder::default();
        prepare_root(&root, None, &mut sys).unwrap();
        let socket = Bind {
            source: "/run/agentos/agentos.sock.d/agents/7.sock".into(),
            target: "/run/agentos/agentos.sock".into(),
            writable: true,
        };
        enter_root(&root, &[socket], &mut sys).unwrap();
        assert!(
            !sys.calls.iter().any(|c| c.contains("from /dev/null")),
            "{:#?}",
            sys.calls
        );
    }

    #[test]
    fn paths_with_dot_or_dot_dot_are_refused() {
        let root = RootFs {
            staging: "/stage".into(),
            ..RootFs::default()
        };
        for (source, target) in [
            ("/tmp/../etc", "/tmp/../etc"),
            ("/srv/a", "/tmp/../../etc"),
            ("/srv/./a", "/srv/a"),
            ("srv/a", "/srv/a"),
        ] {
            let bind = Bind {
                source: source.into(),
                target: target.into(),
                writable: false,
            };
            let mut sys = Recorder::default();
            let err = enter_root(&root, &[bind], &mut sys).unwrap_err();
            assert_eq!(err.source.kind(), io::ErrorKind::InvalidInput, "{err}");
            assert!(
                !sys.calls.iter().any(|c| c.starts_with("mount")),
                "{:?}",
                sys.calls
            );
        }
        let masked = RootFs {
            masks: vec!["/etc/../root".into()],
            ..root
        };
        assert!(prepare_root(&masked, None, &mut Recorder::default()).is_err());
    }

    /// The real resolution never leaves the root, whatever symlinks the
    /// bound directories hold.
    #[test]
    fn mount_points_are_made_beneath_the_root_even_through_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("absolute")).unwrap();
        std::os::unix::fs::symlink("../../../..", root.path().join("upward")).unwrap();
        let mut sys = Real::default();
        // `..` stops at the root.
        let made = sys.beneath(root.path(), Path::new("/upward/made"), Some(Node::Dir));
        assert!(made.unwrap().is_some());
        assert!(root.path().join("made").is_dir());
        // An absolute link resolves from the root: while its target does
        // not exist there, nothing is made through it...
        let through = Path::new("/absolute/made");
        assert!(sys.beneath(root.path(), through, Some(Node::Dir)).is_err());
        assert!(sys.beneath(root.path(), through, None).unwrap().is_none());
        // ...and once it does, it is made there, inside.
        let target_inside = root.path().join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&target_inside).unwrap();
        let made = sys.beneath(root.path(), through, Some(Node::Dir)).unwrap();
        assert!(made.is_some());
        assert!(target_inside.join("made").is_dir());
        let file = sys.beneath(root.path(), Path::new("/absolute/file"), Some(Node::File));
        assert!(file.unwrap().is_some());
        assert!(target_inside.join("file").is_file());
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "something was created outside the root"
        );
    }

    #[test]
    fn bind_sources_are_opened_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let mut sys = Real::default();
        assert!(sys.source(&real).is_ok());
        assert!(sys.source(&dir.path().join("link")).is_err());
    }

    #[test]
    fn missing_masks_are_skipped() {
        let root = RootFs {
            staging: "/stage".into(),
            masks: vec!["/etc/gshadow".into()],
            ..RootFs::default()
        };
        let mut sys = Recorder::default();
        prepare_root(&root, None, &mut sys).unwrap();
        assert!(!sys.calls.iter().any(|c| c.contains("gshadow")));
    }
}
