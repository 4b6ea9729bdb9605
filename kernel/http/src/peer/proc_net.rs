//! The fallback where the kernel has no TCP sock_diag: Linux lists every
//! TCP socket in /proc/net/tcp and tcp6, with its state, its owner's uid
//! and its inode. Reading them costs a pass over every socket on the
//! machine, so sock_diag is used wherever it works.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::listed::{canonical, Listed};

const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// Every listed socket bound at `local` and connected to `remote`.
pub fn lookup(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Vec<Listed>> {
    let mut found = Vec::new();
    for table in TABLES {
        let text = match std::fs::read_to_string(table) {
            Ok(text) => text,
            // A kernel without IPv6 has no tcp6.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        found.extend(find(&text, local, remote));
    }
    Ok(found)
}

/// The sockets bound at `from` and connected to `to` in a
/// /proc/net/tcp{,6} listing: `sl local remote st queues tr tm->when
/// retrnsmt uid timeout inode ...`.
fn find(table: &str, from: SocketAddr, to: SocketAddr) -> Vec<Listed> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (fields.get(1)?, fields.get(2)?);
            let matches = same_address(parse_endpoint(local)?, from)
                && same_address(parse_endpoint(remote)?, to);
            if !matches {
                return None;
            }
            Some(Listed {
                state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
                uid: fields.get(7)?.parse().ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// Equal, an IPv4 address and its IPv4-mapped IPv6 form being the same.
fn same_address(listed: SocketAddr, wanted: SocketAddr) -> bool {
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
    use crate::peer::listed::{owner_of, Unowned, ESTABLISHED};

    /// /proc/net/tcp as read on this machine while a client of a server at
    /// 127.0.0.1:40827 (9F7B) that had sent a request and closed its
    /// socket lingered: the client's end (port 56438, DC76) in FIN_WAIT2
    /// (05), an orphan listed with uid 0 and inode 0, the server's end in
    /// CLOSE_WAIT (08) with 23 unread bytes.
    const CLIENT_GONE: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9F7B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 39060 1 000000006f61e858 100 0 0 10 0
   6: 0100007F:9F7B 0100007F:DC76 08 00000000:00000017 00:00000000 00000000     0        0 39062 1 00000000d17bdf56 20 4 28 10 -1
   7: 0100007F:DC76 0100007F:9F7B 05 00000000:00000000 03:0000175E 00000000     0        0 0 3 000000000baf60c2
";

    /// The same connection while the client, uid 65534, still held it.
    const CLIENT_HERE: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9F7B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 39060 1 000000006f61e858 100 0 0 10 0
   6: 0100007F:9F7B 0100007F:DC76 01 00000000:00000000 00:00000000 00000000     0        0 39062 1 00000000d17bdf56 20 4 28 10 -1
   7: 0100007F:DC76 0100007F:9F7B 01 00000000:00000000 00:00000000 00000000 65534        0 39061 1 000000000baf60c2 20 4 30 10 -1
";

    fn address(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_orphan_listed_as_uid_0_is_no_ones_connection() {
        let (client, server) = (address("127.0.0.1:56438"), address("127.0.0.1:40827"));
        let listed = find(CLIENT_GONE, client, server);
        assert_eq!(
            listed,
            vec![Listed {
                state: 5,
                uid: 0,
                inode: 0
            }]
        );
        // uid 0 is listed, but an orphan's uid is not its sender's.
        assert_eq!(owner_of(&listed), Err(Unowned::NotEstablished(5)));
    }

    #[test]
    fn the_clients_established_end_names_its_owner() {
        let (client, server) = (address("127.0.0.1:56438"), address("127.0.0.1:40827"));
        let listed = find(CLIENT_HERE, client, server);
        assert_eq!(
            listed,
            vec![Listed {
                state: ESTABLISHED,
                uid: 65534,
                inode: 39061
            }]
        );
        assert_eq!(owner_of(&listed), Ok(65534));
        // The server's own end is not the client's.
        assert_eq!(find(CLIENT_HERE, server, client)[0].inode, 39062);
        let gone = address("127.0.0.1:40002");
        assert_eq!(
            owner_of(&find(CLIENT_HERE, gone, server)),
            Err(Unowned::NotFound)
        );
    }

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

    fn established(local: SocketAddr, remote: SocketAddr, uid: u32) -> String {
        format!(
            "header\n   0: {} {} 01 00000000:00000000 00:00000000 00000000 {uid:>5}        0 4242 1 0 20 4 30 10 -1\n",
            listed(local),
            listed(remote),
        )
    }

    #[test]
    fn ipv6_and_ipv4_mapped_addresses_are_read() {
        let (client, server) = (address("[::1]:40000"), address("[::1]:8765"));
        let text = established(client, server, 1000);
        assert_eq!(owner_of(&find(&text, client, server)), Ok(1000));

        let text = established(
            address("[::ffff:127.0.0.1]:40000"),
            address("[::ffff:127.0.0.1]:8765"),
            1002,
        );
        let (client, server) = (address("127.0.0.1:40000"), address("127.0.0.1:8765"));
        assert_eq!(owner_of(&find(&text, client, server)), Ok(1002));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert_eq!(parse_endpoint("nonsense"), None);
        assert_eq!(parse_endpoint("0100007F:ZZZZ"), None);
        assert_eq!(parse_endpoint("0100007:1F90"), None);
        let server = address("127.0.0.1:1");
        assert!(find("header\n garbage line\n", server, server).is_empty());
    }
}
