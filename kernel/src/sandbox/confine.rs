//! The kernel's own children — the local model server now, MCP servers
//! next — run confined, by the rule for everything the kernel starts: as
//! the sandbox user, with no capabilities, `no_new_privs` and the seccomp
//! filter, on the same read-only view of the filesystem an agent gets
//! (system directories, the program's own directories, masks over the
//! secrets and the kernel's files) — keeping only what they need: the
//! host's network, so the kernel can reach a server on 127.0.0.1.
//!
//! Unlike an agent, such a child is the supervisor's own process: its
//! stdin, stdout and pid are the supervisor's to use. So there is no init
//! and no PID namespace; the daemon's binary is run in a confining role
//! (`agentosd __agentos-confined <orders>`) that sets everything up in its
//! own mount namespace and then *becomes* the program, in this order:
//! 1. a private mount namespace (in a user namespace of its own, mapping
//!    only the daemon's uid, when the daemon is not root);
//! 2. the root filesystem, built and entered as a sandbox's, and the
//!    working directory the program was given;
//! 3. no core dumps; every privilege dropped, the user switched;
//! 4. the parent-death signal (re-armed: the user switch cleared it);
//! 5. seccomp;
//! 6. exec the program, with the environment and descriptors it was given.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::mounts::MountError;
use super::plan::{self, Profile, Shape};
use super::privileges::PrivilegeError;
use super::seccomp::SeccompError;
use super::spec::{Bind, RootFs, User};
use super::{mounts, privileges, seccomp};

/// The hidden first argument that selects this role in `agentosd`.
pub const ARG: &str = "__agentos-confined";

/// The step of the confining role that failed. There is no status pipe:
/// the role writes it to its stderr, which the supervisor logs, and exits
/// 126.
#[derive(Debug, thiserror::Error)]
enum ConfineError {
    /// The command line carried no orders.
    #[error("no orders")]
    NoOrders,
    /// The orders could not be read.
    #[error("bad orders: {0}")]
    BadOrders(#[source] serde_json::Error),
    /// The user and mount namespaces could not be created.
    #[error("cannot create namespaces: {0}")]
    Namespaces(#[source] Errno),
    /// A file mapping the user namespace could not be written.
    #[error("cannot map the user namespace: {path}: {source}")]
    MapUser {
        /// `/proc/self/setgroups`, `uid_map` or `gid_map`.
        path: &'static str,
        /// Why it failed.
        source: io::Error,
    },
    /// The mount namespace could not be created.
    #[error("cannot create a mount namespace: {0}")]
    MountNamespace(#[source] Errno),
    /// Building or entering the root filesystem failed; the mount error
    /// names the step and the path.
    #[error("cannot build its root: {0}")]
    Root(#[from] MountError),
    /// The working directory is not there, or not open to the child.
    #[error("cannot enter its working directory {}: {source}", path.display())]
    Chdir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: Errno,
    },
    /// Core dumps could not be turned off.
    #[error("cannot turn core dumps off: {0}")]
    CoreDumps(#[source] Errno),
    /// Dropping capabilities or switching user failed.
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    /// The parent-death signal or non-dumpability could not be set.
    #[error("cannot tie itself to the kernel: {0}")]
    TieToParent(#[source] io::Error),
    /// The seccomp filter could not be installed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// The program's path or an argument holds a NUL byte.
    #[error("a NUL byte in the program")]
    NulByte,
    /// execv(2) failed.
    #[error("cannot execute {}: {source}", program.display())]
    Exec {
        /// The program.
        program: PathBuf,
        /// Why it failed.
        source: Errno,
    },
}

/// How the kernel confines its children: fixed for the daemon's life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// The root filesystem (without the program's own directories).
    root: RootFs,
    /// The user the child runs as; `None`: the daemon's own (not root).
    user: Option<User>,
    /// Whether a user namespace is needed to mount (the daemon is not
    /// root): the daemon's uid and gid, mapped to themselves.
    map_self: Option<(u32, u32)>,
}

/// What the confining role is told: the confinement, and the program.
#[derive(Debug, Serialize, Deserialize)]
struct Orders {
    confinement: Confinement,
    /// The program's own directories, bound read-only.
    binds: Vec<Bind>,
    program: PathBuf,
    argv: Vec<String>,
    /// Its working directory inside the view (default `/`).
    cwd: Option<PathBuf>,
}

impl Confinement {
    /// The confinement for children of a daemon whose sandboxes follow
    /// `profile`: an agent's view with the host's network, a private /tmp,
    /// and no /proc of its own (there is no PID namespace to show).
    pub fn for_kernel_children(profile: &Profile) -> Option<Confinement> {
        let shape = Shape {
            sandboxed: true,
            network: true,
            nested: false,
        };
        let mut root = plan::sandbox(profile, shape).root?;
        root.proc = false;
        root.tmpfs.retain(|tmpfs| tmpfs.target == Path::new("/tmp"));
        let map_self = profile.user_namespace.then(|| {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        });
        Some(Confinement {
            root,
            user: profile.user,
            map_self,
        })
    }

    /// The user its children run as; `None`: the daemon's own.
    pub fn user(&self) -> Option<User> {
        self.user
    }

    /// A command that runs `program` with `argv` confined, in `cwd` (else
    /// `/`); `binds` are the program's own directories. The caller sets its
    /// environment, its standard streams and any descriptor it passes on,
    /// as for the program itself.
    pub fn command(
        &self,
        program: &Path,
        argv: &[String],
        binds: Vec<Bind>,
        cwd: Option<&Path>,
    ) -> io::Result<Command> {
        let orders = Orders {
            confinement: self.clone(),
            binds,
            program: program.to_path_buf(),
            argv: argv.to_vec(),
            cwd: cwd.map(Path::to_path_buf),
        };
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0("agentos-confine")
            .arg(ARG)
            .arg(serde_json::to_string(&orders).map_err(io::Error::other)?);
        Ok(command)
    }
}

/// Runs the confining role; returns only to report why it failed.
pub fn main() -> ! {
    let orders = std::env::args_os()
        .nth(2)
        .ok_or(ConfineError::NoOrders)
        .and_then(|text| {
            serde_json::from_slice::<Orders>(text.as_bytes()).map_err(ConfineError::BadOrders)
        });
    let failure = match orders.and_then(|orders| confine_and_exec(&orders)) {
        Ok(never) => match never {},
        Err(failure) => failure,
    };
    eprintln!("agentos-confine: {failure}");
    std::process::exit(126)
}

/// Steps 1–6; returns only on failure.
fn confine_and_exec(orders: &Orders) -> Result<std::convert::Infallible, ConfineError> {
    let confinement = &orders.confinement;
    // 1. A mount namespace of its own.
    match confinement.map_self {
        Some((uid, gid)) => {
            nix::sched::unshare(
                nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
            )
            .map_err(ConfineError::Namespaces)?;
            let map = |path: &'static str, contents: String| {
                std::fs::write(path, contents)
                    .map_err(|source| ConfineError::MapUser { path, source })
            };
            map("/proc/self/setgroups", "deny".to_owned())?;
            map("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
            map("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
        }
        None => nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(ConfineError::MountNamespace)?,
    }
    // 2. The view.
    let mut sys = mounts::Real::default();
    mounts::prepare_root(&confinement.root, confinement.user, &mut sys)?;
    mounts::enter_root(&confinement.root, &orders.binds, &mut sys)?;
    drop(sys);
    if let Some(cwd) = &orders.cwd {
        nix::unistd::chdir(cwd).map_err(|source| ConfineError::Chdir {
            path: cwd.clone(),
            source,
        })?;
    }
    // 3. Privileges.
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(ConfineError::CoreDumps)?;
    privileges::drop_all(confinement.user)?;
    // 4. Die with the supervisor.
    privileges::tie_to_parent().map_err(ConfineError::TieToParent)?;
    // 5. seccomp.
    seccomp::install(&seccomp::filter())?;
    // 6. Become the program.
    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| ConfineError::NulByte);
    let program = c(orders.program.as_os_str().as_bytes())?;
    let argv: Vec<CString> = orders
        .argv
        .iter()
        .map(|a| c(OsStr::new(a).as_bytes()))
        .collect::<Result<_, _>>()?;
    let source = nix::unistd::execv(&program, &argv).unwrap_err();
    Err(ConfineError::Exec {
        program: orders.program.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::plan::test_profile as profile;

    #[test]
    fn kernel_children_see_an_agents_view_with_a_private_tmp_and_no_proc() {
        let confinement = Confinement::for_kernel_children(&profile()).unwrap();
        let root = &confinement.root;
        assert!(root.binds.iter().any(|b| b.target == Path::new("/usr")));
        assert!(root.binds.iter().all(|b| !b.writable));
        assert!(root.masks.contains(&PathBuf::from("/etc/shadow")));
        assert!(root
            .masks
            .contains(&PathBuf::from("/etc/agentos/agentosd.toml")));
        let scratch: Vec<&Path> = root.tmpfs.iter().map(|t| t.target.as_path()).collect();
        assert_eq!(scratch, [Path::new("/tmp")]);
        assert!(!root.proc);
        assert_eq!(confinement.user.map(|u| u.uid), Some(65534));
        assert!(confinement.map_self.is_none());
    }

    #[test]
    fn orders_travel_whole() {
        let confinement = Confinement::for_kernel_children(&profile()).unwrap();
        let command = confinement
            .command(
                Path::new("/usr/bin/python3"),
                &["python3".into(), "/dev/fd/3".into()],
                Vec::new(),
                None,
            )
            .unwrap();
        let args: Vec<&OsStr> = command.get_args().collect();
        assert_eq!(args[0], ARG);
        let orders: Orders = serde_json::from_slice(args[1].as_bytes()).unwrap();
        assert_eq!(orders.confinement, confinement);
        assert_eq!(orders.argv, ["python3", "/dev/fd/3"]);
    }
}
