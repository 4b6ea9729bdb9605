//! Who is calling. The kernel never trusts the header's `agent_id`: it asks
//! the socket (`SO_PEERCRED`) for the peer's pid, uid and gid at accept time
//! and derives the caller's identity from that alone.

use std::io;
use std::os::fd::AsFd;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// Operator connection ids start here, so they never collide with agent ids.
pub const FIRST_OPERATOR_ID: u32 = 1_000_000;

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

/// The caller's identity, carried as `agent_id` in every reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A trusted local user: root, the daemon's user, or a member of the
    /// socket's group. Each connection gets its own id.
    Operator {
        /// Per-connection id, `>= FIRST_OPERATOR_ID`.
        id: u32,
    },
}

impl Identity {
    /// The id written into reply headers.
    pub fn id(self) -> u32 {
        match self {
            Identity::Operator { id } => id,
        }
    }
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

    /// The identity of a new connection, or why it is refused.
    pub fn identify(&mut self, peer: &PeerCred) -> Result<Identity, String> {
        let trusted = peer.uid == 0
            || peer.uid == self.daemon_uid
            || peer.gid == self.socket_gid
            || supplementary_groups(peer.pid).contains(&self.socket_gid);
        if !trusted {
            return Err(format!(
                "uid {} is not allowed to use this kernel: only root, uid {} and members of \
                 group {} are operators",
                peer.uid, self.daemon_uid, self.socket_gid
            ));
        }
        let id = self.next_operator_id;
        self.next_operator_id = self
            .next_operator_id
            .checked_add(1)
            .unwrap_or(FIRST_OPERATOR_ID);
        Ok(Identity::Operator { id })
    }
}

/// The supplementary groups of a process, from `/proc/<pid>/status`. Empty if
/// the process is gone or unreadable, which then simply grants nothing.
fn supplementary_groups(pid: i32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups_line(&status)
}

fn parse_groups_line(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| {
            groups
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32) -> PeerCred {
        PeerCred {
            // No such process: supplementary groups come back empty.
            pid: i32::MAX,
            uid,
            gid,
        }
    }

    #[test]
    fn operators_get_distinct_ids_from_their_own_range() {
        let mut authority = Authority::new(1000, 1000);
        let a = authority.identify(&peer(0, 0)).unwrap();
        let b = authority.identify(&peer(1000, 5)).unwrap();
        assert_eq!(a.id(), FIRST_OPERATOR_ID);
        assert_eq!(b.id(), FIRST_OPERATOR_ID + 1);
    }

    #[test]
    fn socket_group_members_are_operators_and_strangers_are_not() {
        let mut authority = Authority::new(0, 4242);
        assert!(authority.identify(&peer(1234, 4242)).is_ok());
        let err = authority.identify(&peer(1234, 1234)).unwrap_err();
        assert!(err.contains("uid 1234"), "{err}");
    }

    #[test]
    fn groups_line_is_parsed() {
        let status = "Name:\tx\nGid:\t5\t5\t5\t5\nGroups:\t4 24 27 \nNgid:\t0\n";
        assert_eq!(parse_groups_line(status), vec![4, 24, 27]);
        assert!(parse_groups_line("Name:\tx\n").is_empty());
    }

    #[test]
    fn own_socket_peer_credentials_are_read() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(cred.uid, nix::unistd::geteuid().as_raw());
    }
}
