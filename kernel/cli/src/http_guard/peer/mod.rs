//! Which user is at the other end of a TCP connection from this machine.
//!
//! TCP carries no peer credentials (as a Unix socket's SO_PEERCRED does),
//! but Linux knows the owner of every TCP socket: the client's end of a
//! connection is the socket bound at the server's peer address and
//! connected to the server's own. Its uid names the client only while it
//! is ESTABLISHED and open in a process (it has an inode): a socket its
//! process has closed lingers as an orphan (FIN_WAIT2, TIME_WAIT) that the
//! kernel lists as uid 0, though the bytes it sent may still wait to be
//! read. So the owner is asked for each request, when its bytes are in,
//! and a connection whose client end is anything else belongs to no one.
//!
//! A uid is a second layer only: a connection through the kernel's
//! egress proxy is the proxy's socket, owned by the kernel's user, so the
//! token is what keeps a sandbox out.

mod proc_net;
mod sock_diag;

use std::io;
use std::net::{IpAddr, SocketAddr};

/// `TCP_ESTABLISHED`.
pub const ESTABLISHED: u8 = 1;
/// `TCP_LISTEN`.
const LISTEN: u8 = 10;

/// A TCP socket as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The TCP state, as `TCP_ESTABLISHED` and the rest number them.
    pub state: u8,
    pub uid: u32,
    /// 0 when no process holds the socket any more.
    pub inode: u64,
}

/// Why a connection has no owner to name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unowned {
    #[error("no socket on this machine is the connection's other end")]
    NotFound,
    #[error(
        "the connection's other end is no longer established (TCP state {0:02X}), so whose it \
         is cannot be told"
    )]
    NotEstablished(u8),
    #[error(
        "the connection's other end is closed in every process, so whose it is cannot be told"
    )]
    Orphaned,
    #[error("more than one socket is listed as the connection's other end")]
    Ambiguous,
}

/// Why the owner of a connection is not known.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    Unowned(#[from] Unowned),
    #[error("reading the connection's owner: {0}")]
    Io(#[from] io::Error),
}

/// The owner of the one ESTABLISHED, open socket among `listed`.
pub fn owner_of(listed: &[Listed]) -> Result<u32, Unowned> {
    let socket = match listed {
        [] => return Err(Unowned::NotFound),
        [socket] => socket,
        _ => return Err(Unowned::Ambiguous),
    };
    if socket.state != ESTABLISHED {
        return Err(Unowned::NotEstablished(socket.state));
    }
    if socket.inode == 0 {
        return Err(Unowned::Orphaned);
    }
    Ok(socket.uid)
}

/// Where the kernel's list of sockets is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One socket by its addresses, through NETLINK_SOCK_DIAG.
    SockDiag,
    /// /proc/net/tcp and tcp6, for a kernel without TCP sock_diag.
    ProcNet,
}

impl Source {
    /// sock_diag where it can find `listener`'s own socket (a kernel
    /// built without `tcp_diag` answers every lookup "not found").
    pub fn for_listener(listener: SocketAddr) -> Source {
        let unspecified = match listener.ip() {
            IpAddr::V4(_) => SocketAddr::from(([0u8; 4], 0)),
            IpAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        };
        match sock_diag::lookup(listener, unspecified) {
            Ok(Some(socket)) if socket.state == LISTEN => Source::SockDiag,
            _ => Source::ProcNet,
        }
    }

    /// The uid of the client at `peer` of the server's socket at `local`.
    pub fn owner(self, peer: SocketAddr, local: SocketAddr) -> Result<u32, LookupError> {
        let (peer, local) = (canonical(peer), canonical(local));
        let listed = match self {
            Source::SockDiag => sock_diag::lookup(peer, local)?.into_iter().collect(),
            Source::ProcNet => proc_net::lookup(peer, local)?,
        };
        Ok(owner_of(&listed)?)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is: a dual-stack
/// server sees an IPv4 client that way, and the client's socket is IPv4.
fn canonical(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, |v4| {
            SocketAddr::new(IpAddr::V4(v4), address.port())
        }),
        IpAddr::V4(_) => address,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(state: u8, uid: u32, inode: u64) -> Listed {
        Listed { state, uid, inode }
    }

    #[test]
    fn only_one_established_open_socket_names_an_owner() {
        assert_eq!(owner_of(&[socket(ESTABLISHED, 1000, 7)]), Ok(1000));
        assert_eq!(owner_of(&[]), Err(Unowned::NotFound));
        // FIN_WAIT2 and TIME_WAIT orphans are listed as root's.
        assert_eq!(
            owner_of(&[socket(5, 0, 0)]),
            Err(Unowned::NotEstablished(5))
        );
        assert_eq!(
            owner_of(&[socket(6, 0, 0)]),
            Err(Unowned::NotEstablished(6))
        );
        assert_eq!(
            owner_of(&[socket(ESTABLISHED, 0, 0)]),
            Err(Unowned::Orphaned)
        );
        assert_eq!(
            owner_of(&[socket(ESTABLISHED, 1000, 7), socket(ESTABLISHED, 0, 8)]),
            Err(Unowned::Ambiguous)
        );
    }

    /// Accepts `client`'s connection on `listener` and looks its owner up
    /// by every source this kernel has: each must name this process's
    /// user. Returns the client's address as the server saw it.
    fn every_source_names_this_user(
        listener: &std::net::TcpListener,
        client: std::net::TcpStream,
    ) -> SocketAddr {
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        let uid = crate::http_guard::effective_uid();
        assert_eq!(Source::ProcNet.owner(peer, local).unwrap(), uid);
        if Source::for_listener(listener.local_addr().unwrap()) == Source::SockDiag {
            assert_eq!(Source::SockDiag.owner(peer, local).unwrap(), uid);
        } else {
            eprintln!("!!! NOT TESTED: this kernel has no TCP sock_diag; /proc/net/tcp is read");
        }
        drop(client);
        peer
    }

    #[test]
    fn a_client_on_this_machine_is_found_as_its_users() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        every_source_names_this_user(&listener, client);
    }

    #[test]
    fn both_sources_agree_on_an_ipv6_client_of_an_ipv4_server() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let Ok(client) = std::net::TcpStream::connect(("::ffff:127.0.0.1", port)) else {
            eprintln!("!!! NOT TESTED: no IPv6 sockets on this machine");
            return;
        };
        every_source_names_this_user(&listener, client);
    }

    #[test]
    fn both_sources_agree_on_a_dual_stack_servers_ipv4_client() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            eprintln!("!!! NOT TESTED: no IPv6 on this machine");
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let peer = every_source_names_this_user(&listener, client);
        assert!(peer.is_ipv6(), "{peer}");
    }
}
