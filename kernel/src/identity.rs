//! Who is calling. The kernel never trusts the header's `agent_id`: it asks
//! the socket (`SO_PEERCRED`) for the peer's pid, uid and gid at accept time
//! and derives the caller's identity from that alone — together with the
//! peer's PID namespace, because uid 0 inside a sandbox's user namespace is
//! the daemon's own uid outside it.
//!
//! A connection's [`Identity`] is what its replies carry; its [`Principal`]
//! is whom its work is done for, charged to and owned by: an operator's
//! uid, an agent, or an EXEC run. A run is a principal of its own — code an
//! LLM wrote is hostile, and the connection it holds never acts as the
//! caller that started it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use agentos_proto::payload::DelegateName;
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::process;

/// Operator connection ids start here, so they never collide with agent ids.
pub const FIRST_OPERATOR_ID: u32 = 1_000_000;

/// The operator the kernel acts as for work of its own (boot agents, an
/// operator's background tasks), with the first operator id.
pub const KERNEL_OPERATOR: Identity = Identity::Operator {
    id: FIRST_OPERATOR_ID,
};

/// The peer's credentials as the kernel saw them when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id (in the kernel's pid namespace).
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// Reads `SO_PEERCRED` from a connected Unix socket.
pub fn peer_cred(socket: &impl AsFd) -> io::Result<PeerCred> {
    let cred = getsockopt(socket, PeerCredentials)?;
    Ok(PeerCred {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
    })
}

/// The peer's supplementary groups as they were when it connected
/// (`SO_PEERGROUPS`, Linux 4.13+). Read from the socket rather than from
/// `/proc/<pid>`, which may be hidden, gone, or a different process by now.
pub fn peer_groups(socket: &impl AsFd) -> io::Result<Vec<u32>> {
    const GID: usize = std::mem::size_of::<libc::gid_t>();
    let fd = socket.as_fd().as_raw_fd();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * GID) as libc::socklen_t;
        // SAFETY: `groups` is a writable buffer of `len` bytes, and `len`
        // points to a valid socklen_t; the kernel writes at most `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / GID);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // ERANGE: the buffer was too small; `len` now says how big it must be.
        if err.raw_os_error() == Some(libc::ERANGE) && len as usize > groups.len() * GID {
            groups.resize(len as usize / GID, 0);
            continue;
        }
        return Err(err);
    }
}

/// `ioctl(2)` request for the parent of a PID namespace (`NS_GET_PARENT`).
const NS_GET_PARENT: libc::c_ulong = 0xb702;
/// Nested PID namespaces Linux allows.
const MAX_PID_NAMESPACE_DEPTH: usize = 32;

/// The PID namespaces the peer of `socket` lives in (inode numbers): its
/// own first, then each parent up to the kernel's own. `Ok(None)`: the
/// kernel may not look (a process of another user, to an unprivileged
/// kernel — never one of its sandboxes, whose processes are its own).
/// An error: the peer is gone.
pub fn peer_pid_namespaces(socket: &impl AsFd, peer: &PeerCred) -> io::Result<Option<Vec<u64>>> {
    // Pin the peer first: if the process behind the pid is still alive
    // after its namespace was read, the pid was not reused meanwhile.
    let pinned = peer_pidfd(socket);
    let namespace = match File::open(format!("/proc/{}/ns/pid", peer.pid)) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut chain = Vec::new();
    let own = std::fs::metadata("/proc/self/ns/pid")?.ino();
    let mut current = OwnedFd::from(namespace);
    for _ in 0..MAX_PID_NAMESPACE_DEPTH {
        let inode = nix::sys::stat::fstat(&current)?.st_ino;
        chain.push(inode);
        if inode == own {
            break;
        }
        // SAFETY: NS_GET_PARENT on a namespace descriptor we own; it
        // returns a new descriptor or -1 (EPERM past our own namespace).
        let parent = unsafe { libc::ioctl(current.as_raw_fd(), NS_GET_PARENT) };
        if parent < 0 {
            break;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        current = unsafe { OwnedFd::from_raw_fd(parent) };
    }
    if let Some(pidfd) = pinned {
        // ESRCH: it has exited, and its pid may be another's by now.
        let gone = process::signal(pidfd.as_fd(), 0)
            .is_err_and(|err| err.raw_os_error() == Some(libc::ESRCH));
        if gone {
            return Err(io::ErrorKind::NotFound.into());
        }
    }
    Ok(Some(chain))
}

/// The cgroups the peer of `socket` is in, one path per hierarchy (as
/// `/proc/<pid>/cgroup` gives them, `/` first). An error: the peer is gone,
/// or its pid may be another process's by now.
pub fn peer_cgroups(socket: &impl AsFd, peer: &PeerCred) -> io::Result<Vec<PathBuf>> {
    let pinned = peer_pidfd(socket);
    let listing = std::fs::read_to_string(format!("/proc/{}/cgroup", peer.pid))?;
    if let Some(pidfd) = pinned {
        let gone = process::signal(pidfd.as_fd(), 0)
            .is_err_and(|err| err.raw_os_error() == Some(libc::ESRCH));
        if gone {
            return Err(io::ErrorKind::NotFound.into());
        }
    }
    // "<id>:<controllers>:<path>" per hierarchy.
    Ok(listing
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .map(PathBuf::from)
        .collect())
}

/// A pidfd for the peer as it was when it connected (`SO_PEERPIDFD`,
/// Linux 6.5+), if the kernel offers one.
fn peer_pidfd(socket: &impl AsFd) -> Option<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a writable c_int and `len` its size.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel gave us a fresh pidfd.
    (rc == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whom work is done for: the owner of sessions, tasks and queued work,
/// and whose permissions and budgets a request is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// An operator, by uid: every connection of that uid is the same
    /// principal.
    Operator {
        /// The user id.
        uid: u32,
    },
    /// An agent, by the id SPAWN returned.
    Agent {
        /// The agent's id.
        id: u32,
    },
    /// An EXEC run, by the kernel's number for it; whose run it is and
    /// what it was given are the kernel's run table's.
    Run {
        /// The run's number.
        number: u64,
    },
    /// A delegate an operator named (DELEGATE): a tenant of the operator,
    /// within what the operator has, owning what it creates.
    Delegate {
        /// The operator's user id.
        uid: u32,
        /// The name the operator gave it.
        name: DelegateName,
    },
}

impl Principal {
    /// Whether what it keeps (sessions, volumes, snapshots, tasks) lasts
    /// beyond the kernel: an operator's, and a delegate's (a delegate is
    /// whoever names it again); an agent's or a run's ends with it.
    pub fn outlives_kernels(self) -> bool {
        match self {
            Principal::Operator { .. } | Principal::Delegate { .. } => true,
            Principal::Agent { .. } | Principal::Run { .. } => false,
        }
    }

    /// Whom caps on what may be kept (sessions, disk room, snapshots) are
    /// counted for: a delegate's count with its operator's, so no delegate
    /// gets more room than the user who named it.
    pub fn quota_owner(self) -> Principal {
        match self {
            Principal::Delegate { uid, .. } => Principal::Operator { uid },
            Principal::Operator { .. } | Principal::Agent { .. } | Principal::Run { .. } => self,
        }
    }
}

/// The caller's identity, carried as `agent_id` in every reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A trusted local user: root, the daemon's user, or a member of the
    /// socket's group. Each connection gets its own id.
    Operator {
        /// Per-connection id, `>= FIRST_OPERATOR_ID`.
        id: u32,
    },
    /// A process of an agent the kernel spawned: it reached the kernel
    /// through that agent's own socket, which exists only inside its
    /// sandbox, and its pid namespace was checked to be the agent's.
    Agent {
        /// The id SPAWN returned, the same across restarts.
        id: u32,
    },
    /// An operator's connection that narrowed itself to a delegate
    /// (DELEGATE), for as long as it lasts.
    Delegate {
        /// The connection's id, as it was before (an operator's).
        id: u32,
        /// The delegate's name.
        name: DelegateName,
    },
    /// The kernel connection of an EXEC run: made by the kernel and handed
    /// into the run, no path leads to it. It speaks for the run, never for
    /// the run's caller.
    Run {
        /// The connection's own id, from the operators' range (so it is
        /// never taken for an agent's).
        id: u32,
        /// The run's number.
        run: u64,
    },
}

impl Identity {
    /// The id written into reply headers.
    pub fn id(self) -> u32 {
        match self {
            Identity::Operator { id }
            | Identity::Agent { id }
            | Identity::Delegate { id, .. }
            | Identity::Run { id, .. } => id,
        }
    }

    /// The agent's id, for an agent.
    pub fn agent(self) -> Option<u32> {
        match self {
            Identity::Agent { id } => Some(id),
            Identity::Operator { .. } | Identity::Delegate { .. } | Identity::Run { .. } => None,
        }
    }

    /// Whom the connection speaks for, given its peer's `uid`.
    pub fn principal(self, uid: u32) -> Principal {
        match self {
            Identity::Operator { .. } => Principal::Operator { uid },
            Identity::Agent { id } => Principal::Agent { id },
            Identity::Delegate { name, .. } => Principal::Delegate { uid, name },
            Identity::Run { run, .. } => Principal::Run { number: run },
        }
    }
}

/// A peer the kernel does not serve: it is neither root, nor the daemon's
/// user, nor in the socket's group.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "uid {uid} is not allowed to use this kernel: only root, uid {daemon_uid} and members of \
     group {socket_gid} are operators"
)]
pub struct NotOperator {
    /// The peer's uid.
    pub uid: u32,
    /// The daemon's uid.
    pub daemon_uid: u32,
    /// The group the socket belongs to.
    pub socket_gid: u32,
}

/// Decides who a peer is and whether it may talk to the kernel at all.
#[derive(Debug)]
pub struct Authority {
    daemon_uid: u32,
    socket_gid: u32,
    next_operator_id: u32,
}

impl Authority {
    /// An authority for a daemon running as `daemon_uid` whose socket belongs
    /// to `socket_gid`.
    pub fn new(daemon_uid: u32, socket_gid: u32) -> Self {
        Authority {
            daemon_uid,
            socket_gid,
            next_operator_id: FIRST_OPERATOR_ID,
        }
    }

    /// The identity of a new connection, or why it is refused. `groups`
    /// gives the peer's supplementary groups, asked only when needed.
    pub fn identify(
        &mut self,
        peer: &PeerCred,
        groups: impl FnOnce() -> Vec<u32>,
    ) -> Result<Identity, NotOperator> {
        let trusted = peer.uid == 0
            || peer.uid == self.daemon_uid
            || peer.gid == self.socket_gid
            || groups().contains(&self.socket_gid);
        if !trusted {
            return Err(NotOperator {
                uid: peer.uid,
                daemon_uid: self.daemon_uid,
                socket_gid: self.socket_gid,
            });
        }
        Ok(Identity::Operator {
            id: self.connection_id(),
        })
    }

    /// The identity of an EXEC run's own connection to the kernel.
    pub fn run_connection(&mut self, run: u64) -> Identity {
        Identity::Run {
            id: self.connection_id(),
            run,
        }
    }

    /// A fresh id from the operators' range.
    fn connection_id(&mut self) -> u32 {
        let id = self.next_operator_id;
        self.next_operator_id = self
            .next_operator_id
            .checked_add(1)
            .unwrap_or(FIRST_OPERATOR_ID);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32) -> PeerCred {
        PeerCred { pid: 1, uid, gid }
    }

    fn no_groups() -> Vec<u32> {
        Vec::new()
    }

    #[test]
    fn operators_get_distinct_ids_from_their_own_range() {
        let mut authority = Authority::new(1000, 1000);
        let a = authority.identify(&peer(0, 0), no_groups).unwrap();
        let b = authority.identify(&peer(1000, 5), no_groups).unwrap();
        assert_eq!(a.id(), FIRST_OPERATOR_ID);
        assert_eq!(b.id(), FIRST_OPERATOR_ID + 1);
    }

    #[test]
    fn socket_group_members_are_operators_and_strangers_are_not() {
        let mut authority = Authority::new(0, 4242);
        assert!(authority.identify(&peer(1234, 4242), no_groups).is_ok());
        assert!(authority
            .identify(&peer(1234, 1234), || vec![7, 4242])
            .is_ok());
        let err = authority
            .identify(&peer(1234, 1234), || vec![7])
            .unwrap_err()
            .to_string();
        assert!(err.contains("uid 1234"), "{err}");
    }

    #[test]
    fn a_peer_on_the_host_lives_in_the_kernels_own_pid_namespace() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = peer_cred(&a).unwrap();
        let chain = peer_pid_namespaces(&a, &peer).unwrap().unwrap();
        let own = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
        assert_eq!(chain, [own]);
    }

    #[test]
    fn own_socket_peer_credentials_are_read() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, nix::unistd::geteuid().as_raw());
        let groups = peer_groups(&a).unwrap();
        let ours = nix::unistd::getgroups().unwrap();
        assert_eq!(groups.len(), ours.len());
        for gid in ours {
            assert!(groups.contains(&gid.as_raw()));
        }
    }
}
