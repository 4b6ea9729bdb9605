//! A sandbox's view of the filesystem, as the daemon built it: which host
//! directories are bound where, what is private scratch space, what is
//! masked, which symlinks the new root holds. Paths are looked up in it the
//! way the sandbox's own lookups would go — component by component,
//! symlinks followed inside the view (an absolute link starts again at the
//! sandbox's root), `..` stopping at that root, a masked path not there,
//! and a directory entered only if the sandbox's user may search it — so
//! the daemon, which runs as root on the host, can answer "what does this
//! path name for *that* sandbox?" without ever following a host path the
//! sandbox could not.
//!
//! The host is only read: `lstat` and `readlink` of paths under bound
//! directories.

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::spec::{Bind, RootFs, Symlink};

/// Symlinks followed in one lookup before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// The user a view belongs to, for permission checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewUser {
    /// Its uid on the host.
    pub uid: u32,
    /// Its gid on the host (its only group).
    pub gid: u32,
}

/// What a path names in a view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A file or directory on a bound host directory.
    Host {
        /// Its path inside, every symlink and `..` resolved.
        inside: PathBuf,
        /// The same file's path on the host.
        host: PathBuf,
    },
    /// Something in the sandbox's private space (its /tmp, /workspace,
    /// /dev, /proc, its socket, or the root's own directories): nothing
    /// another sandbox can be given.
    Private(PathBuf),
}

/// The path does not exist in the view, or the viewer may not see it: the
/// two are deliberately one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unseen;

/// Where a resolved path lies.
enum Place<'a> {
    /// On a bound host directory.
    Bound(&'a Bind),
    /// In a private mount (tmpfs, /dev, /proc, the socket).
    Private,
    /// In the root's own small tmpfs.
    Root,
}

/// One sandbox's view.
#[derive(Clone, Debug)]
pub struct View {
    /// Read-only binds from the host: the shape's and the workload's.
    binds: Vec<Bind>,
    /// Mount points of private filesystems.
    private: Vec<PathBuf>,
    /// Symlinks in the root.
    links: Vec<Symlink>,
    /// Masked paths, resolved inside the view.
    masks: Vec<PathBuf>,
    viewer: ViewUser,
}

impl View {
    /// The view of a sandbox with `root` whose workload claimed `binds`.
    pub fn of(root: &RootFs, binds: &[Bind], viewer: ViewUser) -> View {
        let mut view = View {
            binds: Vec::new(),
            private: Vec::new(),
            links: root.symlinks.clone(),
            masks: Vec::new(),
            viewer,
        };
        for bind in root.binds.iter().chain(binds) {
            if bind.writable {
                view.private.push(bind.target.clone());
            } else {
                view.binds.push(bind.clone());
            }
        }
        view.private
            .extend(root.tmpfs.iter().map(|t| t.target.clone()));
        if !root.devices.is_empty() {
            view.private.push("/dev".into());
        }
        if root.proc {
            view.private.push("/proc".into());
        }
        // The sandbox resolves its masks inside its root, so a mask reached
        // through a symlink hides where the link leads.
        view.masks = root
            .masks
            .iter()
            .filter_map(|mask| match view.walk(mask, true) {
                Ok(Seen::Host { inside, .. }) => Some(inside),
                _ => None,
            })
            .collect();
        view
    }

    /// What `path` names, every symlink followed.
    pub fn resolve(&self, path: &Path) -> Result<Seen, Unseen> {
        self.walk(path, true)
    }

    /// What `path` names with its directory resolved but its last
    /// component kept, even if that is a symlink (a virtual environment's
    /// `bin/python` must run under its own name).
    pub fn resolve_entry(&self, path: &Path) -> Result<Seen, Unseen> {
        self.walk(path, false)
    }

    /// Whether the viewer may open the host file `host` for `mode` (some of
    /// `MAY_READ`, `MAY_EXECUTE`).
    pub fn may(&self, meta: &Metadata, mode: u32) -> bool {
        permits(meta, self.viewer, mode)
    }

    fn walk(&self, path: &Path, follow_last: bool) -> Result<Seen, Unseen> {
        if !path.is_absolute() {
            return Err(Unseen);
        }
        let mut todo: Vec<PathBuf> = Vec::new();
        push_components(&mut todo, path);
        let mut here = PathBuf::from("/");
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == Path::new("..") {
                here.pop();
                continue;
            }
            let next = here.join(&name);
            let last = todo.is_empty();
            if self.masks.iter().any(|m| next.starts_with(m)) {
                return Err(Unseen);
            }
            match self.place(&next) {
                // Private space may hold the mount point of a bind (a
                // script's directory under /tmp): only that leads on.
                Place::Private if !last && self.holds_mount_below(&next) => here = next,
                Place::Private => return Ok(Seen::Private(next)),
                Place::Root => {
                    if let Some(link) = self.links.iter().find(|l| l.path == next) {
                        if last && !follow_last {
                            return Ok(Seen::Private(next));
                        }
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(Unseen);
                        }
                        push_components(&mut todo, &link.target);
                        if link.target.is_absolute() {
                            here = PathBuf::from("/");
                        }
                        continue;
                    }
                    if !self.holds_mount_below(&next) {
                        return Err(Unseen);
                    }
                    here = next;
                }
                Place::Bound(bind) => {
                    // Looking `name` up in `here` needs search permission on
                    // `here` — unless `next` is the bind's own root, which
                    // the root's tmpfs holds.
                    if next != bind.target {
                        let dir = host_of(bind, &here);
                        let searchable = std::fs::metadata(&dir)
                            .is_ok_and(|m| permits(&m, self.viewer, MAY_EXECUTE));
                        if !searchable {
                            return Err(Unseen);
                        }
                    }
                    let host = host_of(bind, &next);
                    let meta = std::fs::symlink_metadata(&host).map_err(|_| Unseen)?;
                    if meta.file_type().is_symlink() && (follow_last || !last) {
                        links += 1;
                        if links > MAX_LINKS {
                            return Err(Unseen);
                        }
                        let target = std::fs::read_link(&host).map_err(|_| Unseen)?;
                        push_components(&mut todo, &target);
                        if target.is_absolute() {
                            here = PathBuf::from("/");
                        }
                        continue;
                    }
                    if !last && !meta.is_dir() {
                        return Err(Unseen);
                    }
                    here = next;
                }
            }
        }
        match self.place(&here) {
            Place::Bound(bind) => Ok(Seen::Host {
                host: host_of(bind, &here),
                inside: here,
            }),
            _ => Ok(Seen::Private(here)),
        }
    }

    /// The innermost mount holding `path`.
    fn place(&self, path: &Path) -> Place<'_> {
        let bind = self
            .binds
            .iter()
            .filter(|b| path.starts_with(&b.target))
            .max_by_key(|b| b.target.components().count());
        let private = self
            .private
            .iter()
            .filter(|p| path.starts_with(p))
            .map(|p| p.components().count())
            .max();
        match (bind, private) {
            (Some(bind), Some(depth)) if depth > bind.target.components().count() => Place::Private,
            (Some(bind), _) => Place::Bound(bind),
            (None, Some(_)) => Place::Private,
            (None, None) => Place::Root,
        }
    }

    /// Whether the root's tmpfs has a directory at `path`: some mount point
    /// or link lies below it.
    fn holds_mount_below(&self, path: &Path) -> bool {
        self.binds
            .iter()
            .map(|b| b.target.as_path())
            .chain(self.private.iter().map(PathBuf::as_path))
            .chain(self.links.iter().map(|l| l.path.as_path()))
            .any(|target| target.starts_with(path) && target != path)
    }
}

/// Queues `path`'s components so that `pop` yields them in order, ahead
/// of whatever is queued already.
fn push_components(todo: &mut Vec<PathBuf>, path: &Path) {
    let names: Vec<PathBuf> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(PathBuf::from(name)),
            Component::ParentDir => Some(PathBuf::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    todo.extend(names.into_iter().rev());
}

fn host_of(bind: &Bind, inside: &Path) -> PathBuf {
    match inside.strip_prefix(&bind.target) {
        Ok(rest) if rest.as_os_str().is_empty() => bind.source.clone(),
        Ok(rest) => bind.source.join(rest),
        Err(_) => bind.source.clone(),
    }
}

/// Read permission, for [`View::may`].
pub const MAY_READ: u32 = 0o4;
/// Execute (or search) permission, for [`View::may`].
pub const MAY_EXECUTE: u32 = 0o1;

/// Whether `viewer` has `mode` on a file with `meta`, by its mode bits.
fn permits(meta: &Metadata, viewer: ViewUser, mode: u32) -> bool {
    if viewer.uid == 0 {
        return mode & MAY_EXECUTE == 0 || meta.is_dir() || meta.mode() & 0o111 != 0;
    }
    let bits = meta.permissions().mode();
    let granted = if meta.uid() == viewer.uid {
        bits >> 6
    } else if meta.gid() == viewer.gid {
        bits >> 3
    } else {
        bits
    } & 0o7;
    granted & mode == mode
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::spec::Tmpfs;
    use std::fs;
    use std::os::unix::fs::symlink;

    const NOBODY: ViewUser = ViewUser {
        uid: 65534,
        gid: 65534,
    };

    /// A host tree and a view of part of it: `/srv/agent` (the agent's
    /// directory) and `/usr` bound, `/tmp` private, `/bin -> usr/bin`,
    /// `/srv/agent/secret.toml` masked.
    struct Fixture {
        host: tempfile::TempDir,
        view: View,
    }

    impl Fixture {
        fn new() -> Fixture {
            let host = tempfile::tempdir().unwrap();
            let h = |p: &str| host.path().join(p);
            for dir in ["agent/lib", "usr/bin", "elsewhere", "agent/closed"] {
                fs::create_dir_all(h(dir)).unwrap();
            }
            for dir in ["agent", "agent/lib", "usr", "usr/bin", "elsewhere", ""] {
                fs::set_permissions(h(dir), fs::Permissions::from_mode(0o755)).unwrap();
            }
            fs::set_permissions(h("agent/closed"), fs::Permissions::from_mode(0o700)).unwrap();
            for file in [
                "agent/main.py",
                "agent/lib/util.py",
                "agent/secret.toml",
                "agent/closed/inner.py",
                "usr/bin/python3",
                "elsewhere/secret.py",
            ] {
                fs::write(h(file), "x").unwrap();
                fs::set_permissions(h(file), fs::Permissions::from_mode(0o755)).unwrap();
            }
            symlink("lib/util.py", h("agent/relative.py")).unwrap();
            symlink("/usr/bin/python3", h("agent/python")).unwrap();
            symlink(h("elsewhere/secret.py"), h("agent/escape.py")).unwrap();
            symlink("../../../../../../elsewhere/secret.py", h("agent/up.py")).unwrap();
            symlink("loop2", h("agent/loop1")).unwrap();
            symlink("loop1", h("agent/loop2")).unwrap();
            let bind = |source: &str, target: &str| Bind {
                source: h(source),
                target: target.into(),
                writable: false,
            };
            let root = RootFs {
                staging: "/stage".into(),
                mount_points: Vec::new(),
                binds: vec![bind("usr", "/usr")],
                symlinks: vec![Symlink {
                    path: "/bin".into(),
                    target: "usr/bin".into(),
                }],
                tmpfs: vec![Tmpfs {
                    target: "/tmp".into(),
                    size: 1,
                    mode: 0o1777,
                    owned_by_user: false,
                }],
                masks: vec!["/srv/agent/secret.toml".into()],
                devices: vec!["/dev/null".into()],
                proc: true,
                proc_guards: true,
            };
            let claimed = [
                bind("agent", "/srv/agent"),
                Bind {
                    source: h("sock"),
                    target: "/run/agentos/agentos.sock".into(),
                    writable: true,
                },
            ];
            let view = View::of(&root, &claimed, NOBODY);
            Fixture { host, view }
        }

        fn host(&self, path: &str) -> PathBuf {
            self.host.path().join(path)
        }

        fn inside(&self, path: &str) -> Result<PathBuf, Unseen> {
            match self.view.resolve(Path::new(path))? {
                Seen::Host { inside, host } => {
                    assert!(host.starts_with(self.host.path()), "{host:?}");
                    Ok(inside)
                }
                Seen::Private(p) => panic!("{path} is private: {p:?}"),
            }
        }
    }

    #[test]
    fn bound_files_resolve_to_their_host_paths() {
        let f = Fixture::new();
        assert_eq!(
            f.view.resolve(Path::new("/srv/agent/main.py")),
            Ok(Seen::Host {
                inside: "/srv/agent/main.py".into(),
                host: f.host("agent/main.py"),
            })
        );
    }

    #[test]
    fn symlinks_are_followed_inside_the_view() {
        let f = Fixture::new();
        assert_eq!(
            f.inside("/srv/agent/relative.py"),
            Ok("/srv/agent/lib/util.py".into())
        );
        // An absolute link starts again at the sandbox's root, and a link
        // in the root itself is followed as well.
        assert_eq!(f.inside("/srv/agent/python"), Ok("/usr/bin/python3".into()));
        assert_eq!(f.inside("/bin/python3"), Ok("/usr/bin/python3".into()));
        // The entry keeps its own name.
        assert_eq!(
            f.view.resolve_entry(Path::new("/srv/agent/python")),
            Ok(Seen::Host {
                inside: "/srv/agent/python".into(),
                host: f.host("agent/python"),
            })
        );
    }

    #[test]
    fn nothing_outside_the_view_is_reached() {
        let f = Fixture::new();
        let elsewhere = f.host("elsewhere/secret.py");
        // The host path itself, a link to it, a link climbing out, `..`
        // climbing out, a masked file, a directory it may not enter, a loop.
        for path in [
            elsewhere.to_str().unwrap(),
            "/srv/agent/escape.py",
            "/srv/agent/up.py",
            "/srv/agent/../../../elsewhere/secret.py",
            "/srv/agent/secret.toml",
            "/srv/agent/closed/inner.py",
            "/srv/agent/loop1",
            "/srv/agent/missing.py",
            "/srv/nothing",
            "relative/path",
        ] {
            // (The host path lies under the host's /tmp, which in the view
            // is the sandbox's own: private, never the host's file.)
            let seen = f.view.resolve(Path::new(path));
            assert!(!matches!(seen, Ok(Seen::Host { .. })), "{path}: {seen:?}");
        }
        assert_eq!(
            f.view.resolve(Path::new("/srv/agent/closed/inner.py")),
            Err(Unseen)
        );
    }

    #[test]
    fn a_bind_inside_private_space_is_reached() {
        let host = tempfile::tempdir().unwrap();
        fs::set_permissions(host.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(host.path().join("a.py"), "").unwrap();
        let root = RootFs {
            tmpfs: vec![Tmpfs {
                target: "/tmp".into(),
                size: 1,
                mode: 0o1777,
                owned_by_user: false,
            }],
            ..RootFs::default()
        };
        let claimed = [Bind {
            source: host.path().into(),
            target: "/tmp/agent".into(),
            writable: false,
        }];
        let view = View::of(&root, &claimed, NOBODY);
        assert_eq!(
            view.resolve(Path::new("/tmp/agent/a.py")),
            Ok(Seen::Host {
                inside: "/tmp/agent/a.py".into(),
                host: host.path().join("a.py"),
            })
        );
        assert!(matches!(
            view.resolve(Path::new("/tmp/other/a.py")),
            Ok(Seen::Private(_))
        ));
    }

    #[test]
    fn private_space_is_recognised() {
        let f = Fixture::new();
        for path in [
            "/tmp/x.py",
            "/proc/1/root",
            "/dev/null",
            "/run/agentos/agentos.sock",
        ] {
            assert!(
                matches!(f.view.resolve(Path::new(path)), Ok(Seen::Private(_))),
                "{path}"
            );
        }
        // `..` from a bound directory into private space stays private.
        assert!(matches!(
            f.view.resolve(Path::new("/usr/../tmp/x.py")),
            Ok(Seen::Private(_))
        ));
    }

    #[test]
    fn permissions_are_the_viewers() {
        let f = Fixture::new();
        let meta = fs::metadata(f.host("agent/main.py")).unwrap();
        assert!(f.view.may(&meta, MAY_READ | MAY_EXECUTE));
        fs::set_permissions(f.host("agent/main.py"), fs::Permissions::from_mode(0o750)).unwrap();
        let meta = fs::metadata(f.host("agent/main.py")).unwrap();
        assert!(!f.view.may(&meta, MAY_READ));
        assert_eq!(
            f.inside("/srv/agent/main.py"),
            Ok("/srv/agent/main.py".into())
        );
    }
}
