//! The server name a TLS client asks for (SNI), read from the first bytes
//! it sends through a CONNECT tunnel, so that a tunnel opened for one host
//! cannot carry a TLS session for another (domain fronting through an
//! allowed name).
//!
//! Only what is needed is read, with every length checked against what
//! is there: the record header, the ClientHello's fixed fields and its
//! extensions, up to `server_name`.

/// What the first bytes of a tunnel say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// Not all of the ClientHello's record has arrived yet.
    Incomplete,
    /// The bytes are not a TLS handshake: not TLS at all.
    NotTls,
    /// A ClientHello without a server name.
    NoServerName,
    /// The server name asked for, lowercased.
    ServerName(String),
    /// A TLS record that is not a well-formed ClientHello.
    Malformed(Malformed),
}

/// What is wrong with a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("a record longer than TLS allows")]
    RecordTooLong,
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("two server names in one ClientHello")]
    TwoServerNames,
    #[error("a server name that is not text")]
    NameNotText,
    #[error("a server name with other than printable ASCII")]
    NameNotPrintable,
    #[error("a length past the end of its message")]
    PastTheEnd,
}

/// TLS record content type of a handshake.
const HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The `server_name` extension, and its one name type, `host_name`.
const SERVER_NAME: u16 = 0;
const HOST_NAME: u8 = 0;
/// The largest TLS record payload (2^14, plus the expansion TLS 1.2 allows
/// a compressed or protected record; a ClientHello is neither).
const MAX_RECORD: usize = 16384 + 2048;

/// Reads the ClientHello at the start of `bytes`.
pub fn read_client_hello(bytes: &[u8]) -> ClientHello {
    let Some(header) = bytes.get(..5) else {
        return match bytes.first() {
            Some(&kind) if kind != HANDSHAKE => ClientHello::NotTls,
            _ => ClientHello::Incomplete,
        };
    };
    if header[0] != HANDSHAKE || header[1] != 3 {
        return ClientHello::NotTls;
    }
    let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if length > MAX_RECORD {
        return ClientHello::Malformed(Malformed::RecordTooLong);
    }
    let Some(record) = bytes.get(5..5 + length) else {
        return ClientHello::Incomplete;
    };
    match server_name(&mut Reader(record)) {
        Ok(Some(name)) => ClientHello::ServerName(name),
        Ok(None) => ClientHello::NoServerName,
        Err(why) => ClientHello::Malformed(why),
    }
}

fn server_name(reader: &mut Reader<'_>) -> Result<Option<String>, Malformed> {
    if reader.u8()? != CLIENT_HELLO {
        return Err(Malformed::NotClientHello);
    }
    // The ClientHello must fit in this record: one split across records
    // is refused rather than reassembled (none of today's clients sends
    // one that large).
    let length = reader.u24()?;
    let mut hello = Reader(reader.take(length)?);
    hello.take(2 + 32)?; // client_version, random
    let session_id = usize::from(hello.u8()?);
    hello.take(session_id)?;
    let cipher_suites = usize::from(hello.u16()?);
    hello.take(cipher_suites)?;
    let compression = usize::from(hello.u8()?);
    hello.take(compression)?;
    if hello.0.is_empty() {
        return Ok(None); // no extensions at all
    }
    let extensions = usize::from(hello.u16()?);
    let mut extensions = Reader(hello.take(extensions)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let length = usize::from(extensions.u16()?);
        let mut body = Reader(extensions.take(length)?);
        if kind != SERVER_NAME {
            continue;
        }
        let list = usize::from(body.u16()?);
        let mut list = Reader(body.take(list)?);
        let mut found = None;
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let length = usize::from(list.u16()?);
            let name = list.take(length)?;
            if name_type == HOST_NAME {
                // RFC 6066: at most one name of a type. Servers differ in
                // which of two they would use, so two are refused.
                if found.is_some() {
                    return Err(Malformed::TwoServerNames);
                }
                let name = std::str::from_utf8(name).map_err(|_| Malformed::NameNotText)?;
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Malformed::NameNotPrintable);
                }
                let name = name.strip_suffix('.').unwrap_or(name);
                found = Some(name.to_ascii_lowercase());
            }
        }
        return Ok(found);
    }
    Ok(None)
}

/// A cursor over bytes whose every read is checked against what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], Malformed> {
        if count > self.0.len() {
            return Err(Malformed::PastTheEnd);
        }
        let (taken, rest) = self.0.split_at(count);
        self.0 = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u24(&mut self) -> Result<usize, Malformed> {
        let bytes = self.take(3)?;
        Ok(usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record with `extensions` (each a type and its body).
    fn client_hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7; 32]); // random
        body.push(32);
        body.extend([9; 32]); // session id
        body.extend(4u16.to_be_bytes());
        body.extend([0x13, 0x01, 0x13, 0x02]); // cipher suites
        body.extend([1, 0]); // compression: null
        let mut all = Vec::new();
        for (kind, data) in extensions {
            all.extend(kind.to_be_bytes());
            all.extend((data.len() as u16).to_be_bytes());
            all.extend(data);
        }
        body.extend((all.len() as u16).to_be_bytes());
        body.extend(all);
        let mut handshake = vec![CLIENT_HELLO];
        handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend(body);
        let mut record = vec![HANDSHAKE, 3, 1];
        record.extend((handshake.len() as u16).to_be_bytes());
        record.extend(handshake);
        record
    }

    fn server_name_extension(name: &[u8]) -> (u16, Vec<u8>) {
        let mut entry = vec![HOST_NAME];
        entry.extend((name.len() as u16).to_be_bytes());
        entry.extend(name);
        let mut list = (entry.len() as u16).to_be_bytes().to_vec();
        list.extend(entry);
        (SERVER_NAME, list)
    }

    #[test]
    fn the_server_name_is_read_among_other_extensions() {
        let record = client_hello(&[
            (10, vec![0, 2, 0, 29]),
            server_name_extension(b"API.GitHub.com"),
        ]);
        assert_eq!(
            read_client_hello(&record),
            ClientHello::ServerName("api.github.com".into())
        );
        assert_eq!(
            read_client_hello(&client_hello(&[(10, vec![0, 2, 0, 29])])),
            ClientHello::NoServerName
        );
    }

    #[test]
    fn a_trailing_dot_is_dropped_and_two_names_are_refused() {
        let record = client_hello(&[server_name_extension(b"a.example.")]);
        assert_eq!(
            read_client_hello(&record),
            ClientHello::ServerName("a.example".into())
        );
        let (kind, mut list) = server_name_extension(b"a.example");
        let second = server_name_extension(b"b.example").1;
        list.extend(&second[2..]);
        let total = (list.len() - 2) as u16;
        list[..2].copy_from_slice(&total.to_be_bytes());
        assert!(matches!(
            read_client_hello(&client_hello(&[(kind, list)])),
            ClientHello::Malformed(_)
        ));
    }

    #[test]
    fn every_prefix_is_incomplete_and_other_protocols_are_not_tls() {
        let record = client_hello(&[server_name_extension(b"a.example")]);
        for end in 0..record.len() {
            assert_eq!(
                read_client_hello(&record[..end]),
                ClientHello::Incomplete,
                "{end} bytes"
            );
        }
        assert_eq!(
            read_client_hello(b"GET / HTTP/1.1\r\n"),
            ClientHello::NotTls
        );
        assert_eq!(read_client_hello(b"SSH-2.0-OpenSSH"), ClientHello::NotTls);
    }

    #[test]
    fn lying_lengths_and_odd_names_are_malformed_never_a_panic() {
        let record = client_hello(&[server_name_extension(b"a.example")]);
        // Every byte after the record header set to every value: whatever
        // it says, the answer is one of the enum's, never a panic.
        for index in 5..record.len() {
            for value in [0u8, 1, 0x7f, 0xff] {
                let mut bent = record.clone();
                bent[index] = value;
                let _ = read_client_hello(&bent);
            }
        }
        let mut oversized = record.clone();
        oversized[3..5].copy_from_slice(&0xffffu16.to_be_bytes());
        assert!(matches!(
            read_client_hello(&oversized),
            ClientHello::Malformed(_)
        ));
        let spaced = client_hello(&[server_name_extension(b"a.example evil.example")]);
        assert!(matches!(
            read_client_hello(&spaced),
            ClientHello::Malformed(_)
        ));
    }
}
