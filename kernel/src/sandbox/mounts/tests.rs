//! The mount layer's specification: the order of operations, checked
//! against a recording [`Syscalls`] double, and path resolution checked
//! against a real directory tree.

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
            (MsFlags::MS_UNBINDABLE, "unbindable"),
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
        mount_points: Vec::new(),
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
        proc_guards: true,
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
    // The new root is left out of recursive binds before anything is
    // bound, so a bound directory holding the staging directory cannot
    // carry a copy of the root (and its mounts) into itself.
    assert_eq!(calls[2], "mount /stage unbindable");
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
        &"mount /stage/etc/agentos from tmpfs type tmpfs ro noexec [mode=0000,size=4k]".to_owned()
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
        mount_points: Vec::new(),
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
        mount_points: Vec::new(),
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
        mount_points: Vec::new(),
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
        mount_points: Vec::new(),
        masks: vec!["/etc/gshadow".into()],
        ..RootFs::default()
    };
    let mut sys = Recorder::default();
    prepare_root(&root, None, &mut sys).unwrap();
    assert!(!sys.calls.iter().any(|c| c.contains("gshadow")));
}
