//! Building the sandbox's root filesystem, inside its private mount
//! namespace. Every side effect goes through [`Syscalls`], so the order of
//! operations — which is what makes the result safe — is tested without
//! root against a recording double.
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
//! 7. hide secrets inside bound directories.
//!
//! Entry ([`enter_root`]), once the claim has said what the workload needs:
//! 8. bind the workload's own paths (script directory, interpreter, socket);
//! 9. pivot_root into the new root and detach the old one — from here on
//!    the host filesystem is unreachable;
//! 10. make the new root itself read-only.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::spec::{Bind, RootFs, User};

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
    /// mkdir -p with this mode for the directories it creates.
    fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()>;
    /// Creates an empty file to mount a non-directory on.
    fn touch(&mut self, path: &Path) -> io::Result<()>;
    /// symlink(2): `path` will point to `target`.
    fn symlink(&mut self, target: &Path, path: &Path) -> io::Result<()>;
    /// Whether `path` is a directory (following symlinks).
    fn is_dir(&mut self, path: &Path) -> bool;
    /// Whether `path` exists.
    fn exists(&mut self, path: &Path) -> bool;
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

/// Prepares `root` in the staging directory (steps 1–7). `user` owns the
/// tmpfs marked `owned_by_user`.
pub fn prepare_root(
    root: &RootFs,
    user: Option<User>,
    sys: &mut dyn Syscalls,
) -> Result<(), MountError> {
    let staging = root.staging.as_path();
    let inside = |path: &Path| staging.join(path.strip_prefix("/").unwrap_or(path));

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
        let dev = inside(Path::new("/dev"));
        sys.mkdir_all(&dev, 0o755)
            .map_err(failed("cannot create directory", &dev))?;
        sys.mount(
            Some(Path::new("tmpfs")),
            &dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=64k"),
        )
        .map_err(failed("cannot mount tmpfs on", &dev))?;
        for device in &root.devices {
            let target = inside(device);
            sys.touch(&target)
                .map_err(failed("cannot create device mount point", &target))?;
            sys.mount(Some(device), &target, None, MsFlags::MS_BIND, None)
                .map_err(failed("cannot bind device", device))?;
        }
        for (link, points_to) in DEV_LINKS {
            let path = inside(Path::new(link));
            sys.symlink(Path::new(points_to), &path)
                .map_err(failed("cannot create symlink", &path))?;
        }
    }

    // 4. Writable scratch space — before the binds, so a bind may land
    //    inside it (a script under /tmp on the host shows up under the
    //    sandbox's own /tmp).
    for tmpfs in &root.tmpfs {
        let target = inside(&tmpfs.target);
        sys.mkdir_all(&target, 0o755)
            .map_err(failed("cannot create directory", &target))?;
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
        .map_err(failed("cannot mount tmpfs on", &target))?;
    }

    // 5. What every program needs.
    bind_all(sys, staging, &root.binds)?;
    for link in &root.symlinks {
        let path = inside(&link.path);
        if let Some(parent) = path.parent() {
            sys.mkdir_all(parent, 0o755)
                .map_err(failed("cannot create directory", parent))?;
        }
        sys.symlink(&link.target, &path)
            .map_err(failed("cannot create symlink", &path))?;
    }

    // 6. /proc of the sandbox's own PID namespace.
    if root.proc {
        let proc = inside(Path::new("/proc"));
        sys.mkdir_all(&proc, 0o555)
            .map_err(failed("cannot create directory", &proc))?;
        sys.mount(
            Some(Path::new("proc")),
            &proc,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None,
        )
        .map_err(failed("cannot mount proc on", &proc))?;
        for name in PROC_READ_ONLY {
            let path = proc.join(name);
            if sys.exists(&path) {
                sys.mount(
                    Some(&path),
                    &path,
                    None,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None,
                )
                .map_err(failed("cannot bind", &path))?;
                remount_read_only(sys, &path, &path)?;
            }
        }
        for name in PROC_MASKED {
            let path = proc.join(name);
            if sys.exists(&path) {
                sys.mount(
                    Some(Path::new("/dev/null")),
                    &path,
                    None,
                    MsFlags::MS_BIND,
                    None,
                )
                .map_err(failed("cannot mask", &path))?;
            }
        }
    }

    // 7. Secrets inside bound directories: files become /dev/null,
    //    directories an empty read-only tmpfs.
    for mask in &root.masks {
        let target = inside(mask);
        if !sys.exists(&target) {
            continue;
        }
        if sys.is_dir(&target) {
            sys.mount(
                Some(Path::new("tmpfs")),
                &target,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0000,size=4k"),
            )
            .map_err(failed("cannot mask", &target))?;
        } else {
            sys.mount(
                Some(Path::new("/dev/null")),
                &target,
                None,
                MsFlags::MS_BIND,
                None,
            )
            .map_err(failed("cannot mask", &target))?;
        }
    }

    Ok(())
}

/// Binds the workload's own paths and enters the prepared root (steps
/// 8–10).
pub fn enter_root(root: &RootFs, binds: &[Bind], sys: &mut dyn Syscalls) -> Result<(), MountError> {
    let staging = root.staging.as_path();
    // 8. The workload's own paths.
    bind_all(sys, staging, binds)?;

    // 9. Enter the new root; the old one (the host's) is detached for good.
    let old = staging.join(".old-root");
    sys.mkdir_all(&old, 0o700)
        .map_err(failed("cannot create directory", &old))?;
    sys.pivot_root(staging, &old)
        .map_err(failed("cannot pivot_root into", staging))?;
    sys.chdir(Path::new("/"))
        .map_err(failed("cannot chdir to", Path::new("/")))?;
    let old = Path::new("/.old-root");
    sys.umount_detach(old)
        .map_err(failed("cannot detach the old root at", old))?;
    sys.rmdir(old).map_err(failed("cannot remove", old))?;

    // 10. Only the scratch mounts stay writable.
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
        let target = staging.join(bind.target.strip_prefix("/").unwrap_or(&bind.target));
        make_mount_point(sys, &bind.source, &target)?;
        sys.mount(
            Some(&bind.source),
            &target,
            None,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None,
        )
        .map_err(failed("cannot bind", &bind.source))?;
        if !bind.writable {
            remount_read_only(sys, &bind.source, &target)?;
        }
    }
    Ok(())
}

fn make_mount_point(
    sys: &mut dyn Syscalls,
    source: &Path,
    target: &Path,
) -> Result<(), MountError> {
    if sys.is_dir(source) {
        sys.mkdir_all(target, 0o755)
            .map_err(failed("cannot create directory", target))
    } else {
        if let Some(parent) = target.parent() {
            sys.mkdir_all(parent, 0o755)
                .map_err(failed("cannot create directory", parent))?;
        }
        sys.touch(target)
            .map_err(failed("cannot create mount point", target))
    }
}

fn remount_read_only(
    sys: &mut dyn Syscalls,
    source: &Path,
    target: &Path,
) -> Result<(), MountError> {
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | sys.locked_flags(source);
    sys.mount(None, target, None, flags, None)
        .map_err(failed("cannot make read-only", target))
}

/// The real system calls.
#[derive(Debug, Default)]
pub struct Real;

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

    fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
    }

    fn touch(&mut self, path: &Path) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(drop)
    }

    fn symlink(&mut self, target: &Path, path: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, path)
    }

    fn is_dir(&mut self, path: &Path) -> bool {
        path.is_dir()
    }

    fn exists(&mut self, path: &Path) -> bool {
        path.exists()
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
        fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()> {
            self.calls
                .push(format!("mkdir {} {mode:o}", path.display()));
            Ok(())
        }
        fn touch(&mut self, path: &Path) -> io::Result<()> {
            self.calls.push(format!("touch {}", path.display()));
            Ok(())
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
        fn exists(&mut self, path: &Path) -> bool {
            self.is_dir(path) || self.existing.iter().any(|e| e == path)
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
