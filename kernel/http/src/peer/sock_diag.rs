//! One TCP socket looked up by its exact addresses through the kernel's
//! `NETLINK_SOCK_DIAG` interface (what `ss` uses): the kernel finds the
//! one socket with that 4-tuple, as it would for an arriving packet, so
//! the cost does not grow with the number of sockets on the machine.
//!
//! The messages are `struct nlmsghdr`, `struct inet_diag_req_v2` and
//! `struct inet_diag_msg` of `<linux/inet_diag.h>`, written and read as
//! bytes at their fixed offsets.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{
    recv, sendto, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeVal;

use super::listed::{canonical, Listed};

/// `SOCK_DIAG_BY_FAMILY`: the request and reply message type.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`: the kernel's answer when it has no socket to report.
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const HEADER_BYTES: usize = 16;
/// `struct inet_diag_sockid`: ports, two 16-byte addresses, interface,
/// cookie.
const SOCKID_BYTES: usize = 48;
const REQUEST_BYTES: usize = HEADER_BYTES + 8 + SOCKID_BYTES;
/// `INET_DIAG_NOCOOKIE`: match by addresses alone.
const NO_COOKIE: u32 = u32::MAX;
/// The kernel answers at once; a reply this late means something is
/// wrong, and the connection is refused rather than waited on.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// The socket bound at `local` and connected to `remote`, as the kernel
/// lists it; `None` when there is none.
pub fn lookup(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<Listed>> {
    let family = match local.ip() {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    let netlink = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    setsockopt(
        &netlink,
        sockopt::ReceiveTimeout,
        &TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
    )?;
    let request = request(family as u8, local, remote);
    sendto(
        netlink.as_raw_fd(),
        &request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut reply = [0u8; 512];
    let length = recv(netlink.as_raw_fd(), &mut reply, MsgFlags::empty())?;
    parse_reply(&reply[..length], local, remote)
}

/// A `SOCK_DIAG_BY_FAMILY` request for the one TCP socket of `family`
/// bound at `local` and connected to `remote`.
fn request(family: u8, local: SocketAddr, remote: SocketAddr) -> [u8; REQUEST_BYTES] {
    let mut message = [0u8; REQUEST_BYTES];
    // struct nlmsghdr
    message[0..4].copy_from_slice(&(REQUEST_BYTES as u32).to_ne_bytes());
    message[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    message[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    // sequence and port id stay 0: one request, one reply.
    // struct inet_diag_req_v2
    let body = &mut message[HEADER_BYTES..];
    body[0] = family;
    body[1] = libc::IPPROTO_TCP as u8;
    // idiag_ext 0: no extensions; every state, as an exact lookup
    // reports whatever it finds and the caller judges the state.
    body[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
    write_sockid(&mut body[8..8 + SOCKID_BYTES], local, remote);
    message
}

/// `struct inet_diag_sockid`: ports big-endian, addresses in network
/// order, no interface, no cookie.
fn write_sockid(id: &mut [u8], local: SocketAddr, remote: SocketAddr) {
    id[0..2].copy_from_slice(&local.port().to_be_bytes());
    id[2..4].copy_from_slice(&remote.port().to_be_bytes());
    write_address(&mut id[4..20], local.ip());
    write_address(&mut id[20..36], remote.ip());
    id[40..44].copy_from_slice(&NO_COOKIE.to_ne_bytes());
    id[44..48].copy_from_slice(&NO_COOKIE.to_ne_bytes());
}

fn write_address(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
}

/// The socket in the kernel's reply, if it reports one with the asked
/// addresses.
fn parse_reply(reply: &[u8], local: SocketAddr, remote: SocketAddr) -> io::Result<Option<Listed>> {
    let short = || io::Error::new(io::ErrorKind::InvalidData, "a short sock_diag reply");
    let header = reply.get(..HEADER_BYTES).ok_or_else(short)?;
    let kind = u16::from_ne_bytes([header[4], header[5]]);
    let body = &reply[HEADER_BYTES..];
    if kind == NLMSG_ERROR {
        let errno = -i32::from_ne_bytes(
            body.get(..4)
                .ok_or_else(short)?
                .try_into()
                .map_err(|_| short())?,
        );
        return match errno {
            // No socket has those addresses.
            libc::ENOENT => Ok(None),
            errno => Err(io::Error::from_raw_os_error(errno)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("an unexpected sock_diag reply of type {kind}"),
        ));
    }
    // struct inet_diag_msg: family, state, timer, retrans, the sockid,
    // expires, rqueue, wqueue, uid, inode.
    let message = body.get(..72).ok_or_else(short)?;
    // The kernel finds an IPv6 socket connected to an IPv4 address by its
    // IPv4 addresses, and reports it as IPv6 (`::ffff:a.b.c.d`): the
    // addresses are compared as the ones they stand for.
    let (found_local, found_remote) =
        reported_addresses(message[0], &message[4..40]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a sock_diag reply of another family",
            )
        })?;
    if (canonical(found_local), canonical(found_remote)) != (canonical(local), canonical(remote)) {
        return Ok(None);
    }
    let word = |offset: usize| {
        u32::from_ne_bytes([
            message[offset],
            message[offset + 1],
            message[offset + 2],
            message[offset + 3],
        ])
    };
    Ok(Some(Listed {
        state: message[1],
        uid: word(64),
        inode: u64::from(word(68)),
    }))
}

/// The two ends in a reply's `struct inet_diag_sockid` (without its
/// interface and cookie), read as `family` lays them out.
fn reported_addresses(family: u8, id: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let port = |at: usize| u16::from_be_bytes([id[at], id[at + 1]]);
    let address = |at: usize| -> Option<IpAddr> {
        match i32::from(family) {
            libc::AF_INET => {
                let octets: [u8; 4] = id[at..at + 4].try_into().ok()?;
                Some(IpAddr::from(octets))
            }
            libc::AF_INET6 => {
                let octets: [u8; 16] = id[at..at + 16].try_into().ok()?;
                Some(IpAddr::from(octets))
            }
            _ => None,
        }
    };
    Some((
        SocketAddr::new(address(4)?, port(0)),
        SocketAddr::new(address(20)?, port(2)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::listed::ESTABLISHED;

    #[test]
    fn the_request_names_the_socket_by_its_four_addresses() {
        let local: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let remote: SocketAddr = "127.0.0.2:8765".parse().unwrap();
        let message = request(libc::AF_INET as u8, local, remote);
        assert_eq!(u32::from_ne_bytes(message[0..4].try_into().unwrap()), 72);
        let body = &message[16..];
        assert_eq!((body[0], body[1]), (libc::AF_INET as u8, 6));
        assert_eq!(&body[8..10], &40000u16.to_be_bytes());
        assert_eq!(&body[10..12], &8765u16.to_be_bytes());
        assert_eq!(&body[12..16], &[127, 0, 0, 1]);
        assert_eq!(&body[28..32], &[127, 0, 0, 2]);
        assert_eq!(&body[48..56], &[0xff; 8]);
    }

    /// A reply as the kernel writes it for a socket of `family` with
    /// these ends, ESTABLISHED, of uid 1000.
    fn reply(family: u8, local: SocketAddr, remote: SocketAddr) -> Vec<u8> {
        let mut message = vec![0u8; HEADER_BYTES + 72];
        message[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        let body = &mut message[HEADER_BYTES..];
        body[0] = family;
        body[1] = ESTABLISHED;
        write_sockid(&mut body[4..4 + SOCKID_BYTES], local, remote);
        body[64..68].copy_from_slice(&1000u32.to_ne_bytes());
        body[68..72].copy_from_slice(&77u32.to_ne_bytes());
        message
    }

    #[test]
    fn an_ipv6_socket_connected_to_an_ipv4_address_is_its_ipv4_self() {
        let (local, remote) = (
            "127.0.0.1:40000".parse().unwrap(),
            "127.0.0.1:8765".parse().unwrap(),
        );
        let mapped = reply(
            libc::AF_INET6 as u8,
            "[::ffff:127.0.0.1]:40000".parse().unwrap(),
            "[::ffff:127.0.0.1]:8765".parse().unwrap(),
        );
        let found = parse_reply(&mapped, local, remote).unwrap().unwrap();
        assert_eq!((found.uid, found.inode), (1000, 77));
        let plain = reply(libc::AF_INET as u8, local, remote);
        assert!(parse_reply(&plain, local, remote).unwrap().is_some());
        // Another socket's ends are not this connection's.
        let other = reply(
            libc::AF_INET as u8,
            "127.0.0.1:40001".parse().unwrap(),
            remote,
        );
        assert!(parse_reply(&other, local, remote).unwrap().is_none());
    }

    #[test]
    fn this_processs_own_connection_is_found_established_and_its_own() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_accepted, _) = listener.accept().unwrap();
        let found = lookup(client.local_addr().unwrap(), client.peer_addr().unwrap())
            .unwrap()
            .expect("the client's socket is listed");
        assert_eq!(found.state, ESTABLISHED);
        assert_eq!(found.uid, crate::token::effective_uid());
        assert_ne!(found.inode, 0);
    }

    #[test]
    fn a_socket_that_does_not_exist_is_not_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(lookup(gone, listener.local_addr().unwrap())
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_closed_clients_socket_is_no_longer_established() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (local, remote) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
        // The client closes first; the server's end is still open, so
        // the client's socket lingers as an orphan in FIN_WAIT2.
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        let found = lookup(local, remote)
            .unwrap()
            .expect("the orphan is listed");
        assert_ne!(found.state, ESTABLISHED);
        assert_eq!(found.inode, 0, "an orphan has no file");
        drop(accepted);
    }
}
