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

mod listed;
mod proc_net;
mod sock_diag;

use std::io;
use std::net::{IpAddr, SocketAddr};

pub use listed::Unowned;
use listed::{canonical, owner_of, LISTEN};

/// Why the owner of a connection is not known.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    Unowned(#[from] Unowned),
    #[error("reading the connection's owner: {0}")]
    Io(#[from] io::Error),
}

/// Where the kernel's list of sockets is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketTable {
    /// One socket by its addresses, through NETLINK_SOCK_DIAG.
    SockDiag,
    /// /proc/net/tcp and tcp6, for a kernel without TCP sock_diag.
    ProcNet,
}

impl SocketTable {
    /// sock_diag where it can find `listener`'s own socket (a kernel
    /// built without `tcp_diag` answers every lookup "not found").
    pub fn for_listener(listener: SocketAddr) -> SocketTable {
        let unspecified = match listener.ip() {
            IpAddr::V4(_) => SocketAddr::from(([0u8; 4], 0)),
            IpAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        };
        match sock_diag::lookup(listener, unspecified) {
            Ok(Some(socket)) if socket.state == LISTEN => SocketTable::SockDiag,
            _ => SocketTable::ProcNet,
        }
    }

    /// The uid of the client at `peer` of the server's socket at `local`.
    pub fn owner(self, peer: SocketAddr, local: SocketAddr) -> Result<u32, LookupError> {
        let (peer, local) = (canonical(peer), canonical(local));
        let listed = match self {
            SocketTable::SockDiag => sock_diag::lookup(peer, local)?.into_iter().collect(),
            SocketTable::ProcNet => {
                // The table is read a page at a time while sockets come
                // and go, so a socket may be passed over: read it again.
                let mut listed = proc_net::lookup(peer, local)?;
                for _ in 0..PROC_NET_READS - 1 {
                    if !listed.is_empty() {
                        break;
                    }
                    listed = proc_net::lookup(peer, local)?;
                }
                listed
            }
        };
        Ok(owner_of(&listed)?)
    }
}

/// How often /proc/net/tcp is read for a socket not found in it.
const PROC_NET_READS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts `client`'s connection on `listener` and looks its owner up
    /// by every source this kernel has: each must name this process's
    /// user. Returns the client's address as the server saw it.
    fn every_source_names_this_user(
        listener: &std::net::TcpListener,
        client: std::net::TcpStream,
    ) -> SocketAddr {
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        let uid = crate::token::effective_uid();
        assert_eq!(SocketTable::ProcNet.owner(peer, local).unwrap(), uid);
        if SocketTable::for_listener(listener.local_addr().unwrap()) == SocketTable::SockDiag {
            assert_eq!(SocketTable::SockDiag.owner(peer, local).unwrap(), uid);
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
