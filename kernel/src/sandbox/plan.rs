//! Turning "run this program in a sandbox" into a [`SandboxSpec`] (the
//! sandbox's shape) and a [`Claim`] (what runs in it): which
//! host directories the program needs and how they appear inside, which
//! secrets to hide, what scratch space to give it.

use std::path::{Path, PathBuf};

use agentos_egress::gateway::CA_BUNDLE_INSIDE;

use super::spec::{Bind, Claim, Namespaces, Rlimits, RootFs, SandboxSpec, Symlink, Tmpfs, User};

/// System directories visible (read-only) in every sandbox: programs and
/// their libraries, and /etc for name resolution, time zones and certificates.
const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Secrets under /etc that sandboxes never see.
const ETC_SECRETS: [&str; 9] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/agentos",
];

/// Devices bound into the sandbox's /dev.
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The sandbox's socket path: the kernel socket as agents see it.
pub const SOCKET_INSIDE: &str = "/run/agentos/agentos.sock";
/// The writable working directory of every sandbox.
pub const WORKSPACE: &str = "/workspace";
/// Where an exec host's runs have a session's home mounted.
pub const SESSION_HOME: &str = "/home/user";
/// Where an exec host's runs have a template mounted (read-only).
pub const TEMPLATE_ROOT: &str = "/opt/template";
/// Where volumes go in an exec host's runs beyond their workspace: the
/// host has empty directories there, which a run covers with a tmpfs of
/// its own before a volume's mount point is made in it.
pub const RUN_VOLUME_ROOTS: [&str; 2] = ["/data", "/mnt"];

/// How this daemon builds sandboxes (the same for every one).
#[derive(Clone, Debug)]
pub struct Profile {
    /// An empty host directory to build each root on (see [`RootFs::staging`]).
    pub staging: PathBuf,
    /// The user workloads run as (a root daemon); `None` inside a user
    /// namespace, where the init's uid 0 is already unprivileged outside.
    pub user: Option<User>,
    /// Whether a user namespace is needed (the daemon is not root).
    pub user_namespace: bool,
    /// Size of /tmp, in bytes.
    pub tmp_size: u64,
    /// Size of /workspace, in bytes.
    pub workspace_size: u64,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// Cap on each agent's log.
    pub log_cap: u64,
    /// More host paths to hide (the daemon's own config file).
    pub extra_masks: Vec<PathBuf>,
    /// The certificates sandboxes trust when the egress proxy intercepts
    /// hosts, bound read-only at [`CA_BUNDLE_INSIDE`].
    pub ca_bundle: Option<PathBuf>,
}

/// One program to run.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Name (hostname `agent-<name>`).
    pub name: String,
    /// Executable, absolute or a bare name looked up on PATH inside.
    pub program: PathBuf,
    /// argv, argv[0] first.
    pub argv: Vec<String>,
    /// The whole environment.
    pub env: Vec<(String, String)>,
    /// Working directory; the workspace when `None`.
    pub cwd: Option<PathBuf>,
    /// A script the program runs, checked before it starts.
    pub script: Option<PathBuf>,
    /// Host directories the workload needs beyond the system ones (its
    /// script's, its interpreter's), bound read-only; plain, resolved
    /// paths.
    pub binds: Vec<Bind>,
    /// The host socket to bind at [`SOCKET_INSIDE`], if the workload gets
    /// one.
    pub socket: Option<PathBuf>,
}

/// What kind of sandbox a workload needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Isolated at all (namespaces, new root, no privileges).
    pub sandboxed: bool,
    /// Share the host's network (only when sandboxed).
    pub network: bool,
    /// An exec host: its workload makes namespaces per run (see
    /// `SandboxSpec::nested_namespaces`).
    pub nested: bool,
}

impl Shape {
    /// The shape SPAWN gives when asked for nothing special; the warm pool
    /// keeps sandboxes of this shape ready.
    pub const DEFAULT: Shape = Shape {
        sandboxed: true,
        network: false,
        nested: false,
    };

    /// An exec host: sandboxed, loopback only, making namespaces per run.
    pub const EXEC_HOST: Shape = Shape {
        sandboxed: true,
        network: false,
        nested: true,
    };

    /// Every shape there is.
    pub const ALL: [Shape; 4] = [
        Shape::DEFAULT,
        Shape {
            sandboxed: true,
            network: true,
            nested: false,
        },
        Shape {
            sandboxed: false,
            network: false,
            nested: false,
        },
        Shape::EXEC_HOST,
    ];
}

/// A sandbox of `shape` under `profile`, ready to be claimed.
pub fn sandbox(profile: &Profile, shape: Shape) -> SandboxSpec {
    if !shape.sandboxed {
        // A plain child of the daemon: same user, no namespaces, no new
        // root, no privilege changes.
        return SandboxSpec {
            namespaces: Namespaces::default(),
            root: None,
            user: None,
            drop_privileges: false,
            nested_namespaces: false,
            rlimits: profile.rlimits,
            log_cap: profile.log_cap,
        };
    }
    let mut binds = Vec::new();
    let mut symlinks = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    symlinks.push(Symlink {
                        path: path.to_path_buf(),
                        target,
                    });
                }
            }
            Ok(meta) if meta.is_dir() => binds.push(read_only(path)),
            _ => {}
        }
    }
    binds.extend(profile.ca_bundle.iter().map(|bundle| Bind {
        source: bundle.clone(),
        target: CA_BUNDLE_INSIDE.into(),
        writable: false,
    }));
    let tmpfs = vec![
        Tmpfs {
            target: "/tmp".into(),
            size: profile.tmp_size,
            mode: 0o1777,
            owned_by_user: false,
        },
        Tmpfs {
            target: WORKSPACE.into(),
            size: profile.workspace_size,
            mode: 0o700,
            owned_by_user: true,
        },
        Tmpfs {
            target: "/dev/shm".into(),
            size: profile.tmp_size,
            mode: 0o1777,
            owned_by_user: false,
        },
    ];
    let mut mount_points = Vec::new();
    if shape.nested {
        // Where a session's home, a template and volumes are mounted in a
        // run: empty directories of the host's read-only root.
        let [data, mnt] = RUN_VOLUME_ROOTS;
        mount_points.extend([SESSION_HOME, TEMPLATE_ROOT, data, mnt].map(PathBuf::from));
    }
    let mut masks: Vec<PathBuf> = ETC_SECRETS.iter().map(PathBuf::from).collect();
    masks.extend(profile.extra_masks.iter().cloned());
    SandboxSpec {
        namespaces: Namespaces {
            pid: true,
            net: !shape.network,
            mount: true,
            uts: true,
            ipc: true,
            user: profile.user_namespace,
        },
        root: Some(RootFs {
            staging: profile.staging.clone(),
            binds,
            symlinks,
            tmpfs,
            mount_points,
            masks,
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            proc: true,
            proc_guards: !shape.nested,
        }),
        user: profile.user,
        drop_privileges: true,
        nested_namespaces: shape.nested,
        rlimits: profile.rlimits,
        log_cap: profile.log_cap,
    }
}

/// The claim that runs `workload` in a sandbox of `shape`.
pub fn claim(shape: Shape, workload: &Workload) -> Claim {
    let mut binds = Vec::new();
    if shape.sandboxed {
        binds.extend(workload.binds.iter().cloned());
        binds.extend(workload.socket.iter().map(|socket| Bind {
            source: socket.clone(),
            target: SOCKET_INSIDE.into(),
            writable: true,
        }));
    }
    Claim {
        name: workload.name.clone(),
        hostname: shape.sandboxed.then(|| hostname_for(&workload.name)),
        program: workload.program.clone(),
        argv: workload.argv.clone(),
        env: workload.env.clone(),
        cwd: workload
            .cwd
            .clone()
            .unwrap_or_else(|| PathBuf::from(if shape.sandboxed { WORKSPACE } else { "/" })),
        script: workload.script.clone(),
        binds,
    }
}

/// Whether `path` lies in a system directory every sandbox sees.
pub fn is_system(path: &Path) -> bool {
    SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
}

/// `agent-<name>`, within the kernel's 64-byte limit.
pub fn hostname_for(name: &str) -> String {
    let mut hostname = format!("agent-{name}");
    hostname.truncate(64);
    hostname
}

fn read_only(path: &Path) -> Bind {
    Bind {
        source: path.to_path_buf(),
        target: path.to_path_buf(),
        writable: false,
    }
}

/// A root daemon's profile, for tests.
#[cfg(test)]
pub fn test_profile() -> Profile {
    Profile {
        staging: "/run/agentos/root".into(),
        user: Some(User {
            uid: 65534,
            gid: 65534,
        }),
        user_namespace: false,
        tmp_size: 64 << 20,
        workspace_size: 256 << 20,
        rlimits: Rlimits {
            nofile: 1024,
            fsize: 1 << 30,
        },
        log_cap: 1 << 20,
        extra_masks: vec!["/etc/agentos/agentosd.toml".into()],
        ca_bundle: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        test_profile()
    }

    fn workload() -> Workload {
        Workload {
            name: "w1".into(),
            program: "/usr/bin/python3".into(),
            argv: vec!["python3".into(), "/srv/agents/a.py".into()],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: None,
            script: Some("/srv/agents/a.py".into()),
            binds: vec![read_only(Path::new("/srv/agents"))],
            socket: Some("/run/agentos/agents/1.sock".into()),
        }
    }

    #[test]
    fn a_sandbox_sees_system_dirs_its_script_and_its_socket_only() {
        let spec = sandbox(&profile(), Shape::DEFAULT);
        let claim = claim(Shape::DEFAULT, &workload());
        let root = spec.root.as_ref().unwrap();
        let sources: Vec<&Path> = root
            .binds
            .iter()
            .chain(&claim.binds)
            .map(|b| b.source.as_path())
            .collect();
        assert!(sources.contains(&Path::new("/usr")));
        assert!(sources.contains(&Path::new("/srv/agents")));
        assert!(!sources
            .iter()
            .any(|s| s.starts_with("/root") || s.starts_with("/home")));
        assert!(root
            .binds
            .iter()
            .chain(&claim.binds)
            .all(|b| !b.writable || b.target == Path::new(SOCKET_INSIDE)));
        assert!(root.masks.contains(&PathBuf::from("/etc/shadow")));
        assert!(root
            .masks
            .contains(&PathBuf::from("/etc/agentos/agentosd.toml")));
        assert!(root.proc);
        assert_eq!(claim.cwd, Path::new(WORKSPACE));
        assert_eq!(claim.hostname.as_deref(), Some("agent-w1"));
        assert_eq!(spec.namespaces.names(), ["pid", "net", "mnt", "uts", "ipc"]);
        assert!(spec.drop_privileges);
    }

    #[test]
    fn an_exec_host_makes_namespaces_per_run_and_guards_each_runs_proc_itself() {
        let spec = sandbox(&profile(), Shape::EXEC_HOST);
        assert!(spec.nested_namespaces && spec.drop_privileges);
        assert!(spec.namespaces.net, "loopback only");
        let root = spec.root.unwrap();
        assert!(root.proc && !root.proc_guards);
        let agent = sandbox(&profile(), Shape::DEFAULT);
        assert!(!agent.nested_namespaces && agent.root.unwrap().proc_guards);
    }

    #[test]
    fn network_true_keeps_the_host_network() {
        let shape = Shape {
            sandboxed: true,
            network: true,
            nested: false,
        };
        assert!(!sandbox(&profile(), shape).namespaces.net);
    }

    #[test]
    fn unsandboxed_is_a_plain_child() {
        let shape = Shape {
            sandboxed: false,
            network: false,
            nested: false,
        };
        let spec = sandbox(&profile(), shape);
        assert!(spec.root.is_none() && !spec.drop_privileges && spec.user.is_none());
        assert!(spec.namespaces.names().is_empty());
        let claim = claim(shape, &workload());
        assert!(claim.binds.is_empty() && claim.hostname.is_none());
        assert_eq!(claim.cwd, Path::new("/"));
    }

    #[test]
    fn hostnames_fit_the_kernel_limit() {
        assert_eq!(hostname_for(&"x".repeat(64)).len(), 64);
    }

    #[test]
    fn system_directories_are_recognised() {
        assert!(is_system(Path::new("/usr/bin/python3")));
        assert!(is_system(Path::new("/etc")));
        assert!(!is_system(Path::new("/srv/agents")));
        assert!(!is_system(Path::new("/usrlocal")));
    }
}
