//! What a sandbox's init must build and run: computed by the daemon,
//! carried to the init as JSON — the shape on an inherited memfd at start,
//! the claim over the control socket when a workload takes the sandbox —
//! and carried out there step by step.

use std::os::fd::RawFd;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Descriptors the init finds open, at fixed numbers.
pub mod fds {
    use super::RawFd;
    /// A memfd holding the [`SandboxSpec`](super::SandboxSpec) as JSON.
    pub const SPEC: RawFd = 3;
    /// Write end of the status pipe (init → daemon), see `status`.
    pub const STATUS: RawFd = 4;
    /// The control socket (daemon → init), carrying the
    /// [`ControlMessage`](super::ControlMessage)s in their order. EOF: the
    /// daemon gave up on this sandbox.
    pub const CONTROL: RawFd = 5;
    /// Read end of the lifeline, whose write end only the daemon holds:
    /// it hangs up when the daemon dies, and the sandbox dies with it.
    pub const LIFELINE: RawFd = 6;
    /// Where the workload's log lands once claimed (also the init's own
    /// stdout and stderr from then on).
    pub const LOG: RawFd = 7;
    /// The workload's channel to the daemon, when its claim brings one (an
    /// exec host's): the workload finds it open at this number, and the
    /// init keeps no copy.
    pub const CHANNEL: RawFd = 8;
}

/// What the daemon says on a sandbox's control socket: one datagram each,
/// in this order. The receiver checks that what came is what it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlMessage {
    /// The init may be executed: in a new user namespace its id maps are
    /// written (read before the init is executed).
    Go,
    /// A workload claims the sandbox: the datagram carries the
    /// [`Claim`]'s memfd, the log and, for an exec host, its channel.
    Claim,
    /// The workload may start: the sandbox's cgroup is in order.
    Start,
}

impl ControlMessage {
    /// Its bytes on the socket.
    pub const fn tag(self) -> &'static [u8] {
        match self {
            ControlMessage::Go => b"go",
            ControlMessage::Claim => b"claim",
            ControlMessage::Start => b"start",
        }
    }

    /// Whether `received` is this message. Compares bytes only, so the
    /// launcher's child may call it between clone3 and execve.
    pub fn is(self, received: &[u8]) -> bool {
        received == self.tag()
    }
}

/// A sandbox's shape: everything that does not depend on which program
/// will run in it, so a sandbox can be prepared ahead of time (the warm
/// pool) and claimed by a workload later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Which namespaces the sandbox has of its own.
    pub namespaces: Namespaces,
    /// A new root filesystem (needs a mount namespace); the workload's own
    /// paths are added by its claim.
    pub root: Option<RootFs>,
    /// The user the workload runs as. `None`: keep the init's (inside a user
    /// namespace that is uid 0 there, an unprivileged uid outside).
    pub user: Option<User>,
    /// Drop every capability, set no_new_privs and install the seccomp
    /// filter before the workload starts.
    pub drop_privileges: bool,
    /// The workload may make namespaces of its own, inside a user
    /// namespace it creates (an exec host's zygote, which makes a set per
    /// run): the filter lets `unshare` and `mount` through; everything
    /// else of it holds, and each run adds the whole filter on top.
    pub nested_namespaces: bool,
    /// Resource limits for the workload.
    pub rlimits: Rlimits,
    /// Keep the log file under this many bytes (its newer half survives).
    pub log_cap: u64,
}

/// What runs in a sandbox: sent when the sandbox is claimed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Short name, for messages.
    pub name: String,
    /// Hostname inside the UTS namespace.
    pub hostname: Option<String>,
    /// The workload's executable: absolute, or a bare name looked up on
    /// the workload's PATH inside.
    pub program: PathBuf,
    /// The workload's argv, `argv[0]` first.
    pub argv: Vec<String>,
    /// The workload's whole environment.
    pub env: Vec<(String, String)>,
    /// The workload's working directory, as seen inside.
    pub cwd: PathBuf,
    /// A script the program runs: checked to exist and be readable by the
    /// workload's user before it starts, so SPAWN can say so.
    pub script: Option<PathBuf>,
    /// Host paths this workload needs on top of the shape's (its script's
    /// directory, its interpreter, its socket).
    pub binds: Vec<Bind>,
}

/// Namespaces to create.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    /// PID: the init is PID 1, the workload sees only its own tree.
    pub pid: bool,
    /// NET: only a loopback interface.
    pub net: bool,
    /// MNT: a root filesystem of its own.
    pub mount: bool,
    /// UTS: its own hostname.
    pub uts: bool,
    /// IPC: its own System V IPC and POSIX queues.
    pub ipc: bool,
    /// USER: uid 0 inside is an unprivileged uid outside (used when the
    /// daemon itself is not root).
    pub user: bool,
}

impl Namespaces {
    /// The protocol's names of the namespaces in force.
    pub fn names(&self) -> Vec<String> {
        [
            (self.pid, "pid"),
            (self.net, "net"),
            (self.mount, "mnt"),
            (self.uts, "uts"),
            (self.ipc, "ipc"),
            (self.user, "user"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| name.to_owned())
        .collect()
    }
}

/// A user to switch to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Group id (also the only supplementary group).
    pub gid: u32,
}

/// Resource limits (soft = hard).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// Open files.
    pub nofile: u64,
    /// Largest file the workload may write, in bytes.
    pub fsize: u64,
}

/// The new root filesystem, built on a tmpfs and entered with pivot_root.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    /// An existing, empty host directory to build the new root on (inside
    /// the sandbox's private mount namespace, so the host never sees it).
    pub staging: PathBuf,
    /// Host paths every sandbox of this shape sees.
    pub binds: Vec<Bind>,
    /// Symbolic links to create (`/bin -> usr/bin` on merged-/usr hosts).
    pub symlinks: Vec<Symlink>,
    /// Writable scratch filesystems.
    pub tmpfs: Vec<Tmpfs>,
    /// Empty directories of the root itself (read-only, as it is), where
    /// disks are mounted later from outside: a session's home, a
    /// template, volumes.
    pub mount_points: Vec<PathBuf>,
    /// Paths hidden inside a bound directory (secrets under /etc).
    pub masks: Vec<PathBuf>,
    /// Device nodes bound from the host's /dev into a fresh /dev.
    pub devices: Vec<PathBuf>,
    /// Mount a fresh /proc (needs a PID namespace).
    pub proc: bool,
    /// Mask, and make read-only, the parts of that /proc sandboxed code
    /// never needs. An exec host leaves this to its runs: each mounts a
    /// /proc of its own and guards it, which the kernel allows a user
    /// namespace only while a fully visible /proc exists.
    pub proc_guards: bool,
}

/// A bind mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Where it appears inside.
    pub target: PathBuf,
    /// Read-write; otherwise read-only.
    pub writable: bool,
}

/// A symbolic link inside the new root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    /// The link's path inside.
    pub path: PathBuf,
    /// What it points to.
    pub target: PathBuf,
}

/// A tmpfs mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tmpfs {
    /// Where it appears inside.
    pub target: PathBuf,
    /// Size cap in bytes (its pages count against the memory cgroup).
    pub size: u64,
    /// Mode of its root directory.
    pub mode: u32,
    /// Owned by the workload's user rather than root.
    pub owned_by_user: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_control_message_is_told_from_the_others() {
        let all = [
            ControlMessage::Go,
            ControlMessage::Claim,
            ControlMessage::Start,
        ];
        for message in all {
            for other in all {
                assert_eq!(message.is(other.tag()), message == other);
            }
            assert!(!message.is(b""));
            assert!(!message.is(&[message.tag(), b"x"].concat()));
        }
    }
}
