//! A TCP socket as the kernel lists it, and what makes one the owner of a
//! connection: what both ways of reading the kernel's sockets share.

use std::net::{IpAddr, SocketAddr};

/// `TCP_ESTABLISHED`.
pub const ESTABLISHED: u8 = 1;
/// `TCP_LISTEN`.
pub const LISTEN: u8 = 10;

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

/// An IPv4-mapped IPv6 address as the IPv4 address it is: a dual-stack
/// server sees an IPv4 client that way, and the client's socket is IPv4.
pub fn canonical(address: SocketAddr) -> SocketAddr {
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

    #[test]
    fn an_ipv4_mapped_address_is_its_ipv4_self() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(mapped), "127.0.0.1:80".parse().unwrap());
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
