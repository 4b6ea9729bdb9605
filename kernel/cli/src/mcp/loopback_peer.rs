//! Which user is at the other end of a loopback TCP connection.
//!
//! A loopback port is open to every user of the machine, not only to the
//! one who runs `agentos mcp --http`; without a token, the server serves
//! its own user only, and this is how it tells. TCP carries no peer
//! credentials (as a Unix socket's SO_PEERCRED does), but Linux lists
//! every TCP socket with its owner's uid in /proc/net/tcp and tcp6: the
//! client's end of the connection is the line whose local address is the
//! server's peer and whose remote address is the server's own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// The uid owning the socket at `peer` connected to `local`; `None` when
/// no listed socket is that (the client has gone, or is on another
/// machine).
pub fn peer_uid(peer: SocketAddr, local: SocketAddr) -> std::io::Result<Option<u32>> {
    for table in TABLES {
        let text = match std::fs::read_to_string(table) {
            Ok(text) => text,
            // A kernel without IPv6 has no tcp6.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        if let Some(uid) = find_owner(&text, peer, local) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

/// The uid of the socket bound at `from` and connected to `to`, in a
/// /proc/net/tcp{,6} listing.
fn find_owner(table: &str, from: SocketAddr, to: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote, uid) = (fields.get(1)?, fields.get(2)?, fields.get(7)?);
        let matches =
            same_address(parse_endpoint(local)?, from) && same_address(parse_endpoint(remote)?, to);
        matches.then(|| uid.parse().ok()).flatten()
    })
}

/// Equal, an IPv4 address and its IPv4-mapped IPv6 form being the same.
fn same_address(listed: SocketAddr, wanted: SocketAddr) -> bool {
    let canonical = |address: SocketAddr| match address.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, |v4| {
            SocketAddr::new(IpAddr::V4(v4), address.port())
        }),
        IpAddr::V4(_) => address,
    };
    canonical(listed) == canonical(wanted)
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the
/// address as the kernel's 32-bit words in host byte order, the port in
/// hex.
fn parse_endpoint(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |index: usize| -> Option<[u8; 4]> {
        let digits = address.get(index * 8..index * 8 + 8)?;
        Some(u32::from_str_radix(digits, 16).ok()?.to_ne_bytes())
    };
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for index in 0..4 {
                bytes[index * 4..index * 4 + 4].copy_from_slice(&word(index)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `address` as /proc/net/tcp prints it on this machine.
    fn listed(address: SocketAddr) -> String {
        let hex = |bytes: &[u8]| {
            bytes
                .chunks(4)
                .map(|word| format!("{:08X}", u32::from_ne_bytes(word.try_into().unwrap())))
                .collect::<String>()
        };
        let ip = match address.ip() {
            IpAddr::V4(v4) => hex(&v4.octets()),
            IpAddr::V6(v6) => hex(&v6.octets()),
        };
        format!("{ip}:{:04X}", address.port())
    }

    fn table(rows: &[(SocketAddr, SocketAddr, u32)]) -> String {
        let mut text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n".to_owned();
        for (index, (local, remote, uid)) in rows.iter().enumerate() {
            text.push_str(&format!(
                "   {index}: {} {} 01 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {} 1 0 20 4 30 10 -1\n",
                listed(*local),
                listed(*remote),
                1000 + index
            ));
        }
        text
    }

    #[test]
    fn the_clients_end_of_the_connection_names_its_owner() {
        let server: SocketAddr = "127.0.0.1:8765".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        let text = table(&[
            (server, "0.0.0.0:0".parse().unwrap(), 0),
            // The server's own end of each connection: not the client.
            (server, client, 0),
            (server, other, 0),
            (other, server, 1001),
            (client, server, 1000),
        ]);
        assert_eq!(find_owner(&text, client, server), Some(1000));
        assert_eq!(find_owner(&text, other, server), Some(1001));
        let gone: SocketAddr = "127.0.0.1:40002".parse().unwrap();
        assert_eq!(find_owner(&text, gone, server), None);
    }

    #[test]
    fn ipv6_and_ipv4_mapped_addresses_are_read() {
        let server: SocketAddr = "[::1]:8765".parse().unwrap();
        let client: SocketAddr = "[::1]:40000".parse().unwrap();
        let text = table(&[(client, server, 1000)]);
        assert_eq!(find_owner(&text, client, server), Some(1000));

        let mapped_server: SocketAddr = "[::ffff:127.0.0.1]:8765".parse().unwrap();
        let mapped_client: SocketAddr = "[::ffff:127.0.0.1]:40000".parse().unwrap();
        let text = table(&[(mapped_client, mapped_server, 1002)]);
        let v4_client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let v4_server: SocketAddr = "127.0.0.1:8765".parse().unwrap();
        assert_eq!(find_owner(&text, v4_client, v4_server), Some(1002));
    }

    #[test]
    fn this_processs_own_connection_is_found_as_its_own() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let uid = peer_uid(peer, accepted.local_addr().unwrap()).unwrap();
        assert_eq!(uid, Some(super::super::effective_uid()));
        drop(client);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert_eq!(parse_endpoint("nonsense"), None);
        assert_eq!(parse_endpoint("0100007F:ZZZZ"), None);
        assert_eq!(parse_endpoint("0100007:1F90"), None);
        let server: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(find_owner("header\n garbage line\n", server, server), None);
    }
}
