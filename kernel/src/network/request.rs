//! What a sandbox asks the egress proxy for: the head of its first
//! request on a connection, `CONNECT host:port` (a tunnel, for TLS) or a
//! plain-HTTP request in absolute form (`GET http://host/path`), read with
//! bounds, since the sandbox's code may send anything.

/// The longest request head read: a request line and headers longer than
/// this are refused, not buffered.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A request to the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// `CONNECT host:port`: a tunnel once allowed.
    Connect { host: String, port: u16 },
    /// A plain-HTTP request to forward: sent upstream as
    /// `method target` (origin form) with the headers that followed.
    Forward {
        method: String,
        host: String,
        port: u16,
        /// The path and query, as the origin server takes them.
        target: String,
    },
}

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// The head has not ended yet (and is within bounds).
    Incomplete,
    /// A request, and how many bytes its head took (the rest is its body,
    /// or the tunnel's first bytes).
    Complete(ProxyRequest, usize),
    /// Refused, with the HTTP status to answer and why.
    Refused(u16, String),
}

/// Reads the request head at the start of `bytes`.
pub fn read_head(bytes: &[u8]) -> Head {
    let Some(end) = find(bytes, b"\r\n\r\n") else {
        return if bytes.len() >= MAX_HEAD_BYTES {
            Head::Refused(
                431,
                format!("a request head longer than {MAX_HEAD_BYTES} bytes"),
            )
        } else {
            Head::Incomplete
        };
    };
    let head_len = end + 4;
    if head_len > MAX_HEAD_BYTES {
        return Head::Refused(
            431,
            format!("a request head longer than {MAX_HEAD_BYTES} bytes"),
        );
    }
    let Ok(head) = std::str::from_utf8(&bytes[..end]) else {
        return Head::Refused(400, "a request head that is not text".into());
    };
    let line = head.split("\r\n").next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Head::Refused(400, "a request line is `METHOD target HTTP/1.x`".into());
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Head::Refused(505, format!("{version:?}: the proxy speaks HTTP/1.1"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Head::Refused(400, format!("{method:?} is not an HTTP method"));
    }
    let request = if method == "CONNECT" {
        authority(target, None).map(|(host, port)| ProxyRequest::Connect { host, port })
    } else {
        forward(method, target)
    };
    match request {
        Ok(request) => Head::Complete(request, head_len),
        Err(why) => Head::Refused(400, why),
    }
}

/// A plain-HTTP request's absolute-form target.
fn forward(method: &str, target: &str) -> Result<ProxyRequest, String> {
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(if target.starts_with("https://") {
            "an https:// URL goes through CONNECT, not as a plain request".into()
        } else {
            format!("{target:?}: a proxy request names its URL in full (http://host/path)")
        });
    };
    let (authority_part, path) = match rest.find(['/', '?']) {
        Some(index) => (&rest[..index], &rest[index..]),
        None => (rest, "/"),
    };
    let (host, port) = authority(authority_part, Some(80))?;
    let target = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    Ok(ProxyRequest::Forward {
        method: method.to_owned(),
        host,
        port,
        target,
    })
}

/// `host:port` (`[v6]:port` for IPv6); `default_port` when it has none.
fn authority(text: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    if text.contains('@') {
        return Err("credentials in a URL are refused: send them in a header".into());
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address without its ]")?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("[{host}] is not an IPv6 address"));
        }
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match (port, default_port) {
        // Plain decimal only: no `+443`, no `0443`.
        (Some(written), _) => match written.parse::<u16>() {
            Ok(port) if port > 0 && port.to_string() == written => port,
            _ => return Err(format!("port {written:?} is not 1 to 65535")),
        },
        (None, Some(port)) => port,
        (None, None) => return Err("CONNECT names a host and its port".into()),
    };
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    if !valid {
        return Err(format!("{host:?} is not a host name or address"));
    }
    // One spelling of each name from here on: `a.com.` is `a.com` for the
    // policy, the resolver override, the credential and the TLS name.
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.ends_with('.') {
        return Err(format!("{text:?} is not a host name or address"));
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// Where `needle` first stands in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_and_absolute_form_requests_are_read() {
        let bytes =
            b"CONNECT API.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n\r\n\x16\x03\x01";
        assert_eq!(
            read_head(bytes),
            Head::Complete(
                ProxyRequest::Connect {
                    host: "api.github.com".into(),
                    port: 443
                },
                bytes.len() - 3
            )
        );
        let bytes = b"GET http://example.com:8080/a/b?c=d HTTP/1.1\r\nHost: example.com\r\n\r\n";
        assert_eq!(
            read_head(bytes),
            Head::Complete(
                ProxyRequest::Forward {
                    method: "GET".into(),
                    host: "example.com".into(),
                    port: 8080,
                    target: "/a/b?c=d".into()
                },
                bytes.len()
            )
        );
        // One spelling of a name: its trailing dot goes.
        assert!(matches!(
            read_head(b"CONNECT A.example.:443 HTTP/1.1\r\n\r\n"),
            Head::Complete(ProxyRequest::Connect { ref host, port: 443 }, _) if host == "a.example"
        ));
        assert!(matches!(
            read_head(b"CONNECT a..:443 HTTP/1.1\r\n\r\n"),
            Head::Refused(400, _)
        ));
        let bytes = b"HEAD http://[::1]?x HTTP/1.0\r\n\r\n";
        assert!(matches!(
            read_head(bytes),
            Head::Complete(ProxyRequest::Forward { ref host, port: 80, ref target, .. }, _)
                if host == "::1" && target == "/?x"
        ));
    }

    #[test]
    fn partial_heads_wait_and_oversized_ones_are_refused() {
        let bytes = b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n";
        for end in 0..bytes.len() {
            assert_eq!(read_head(&bytes[..end]), Head::Incomplete, "{end} bytes");
        }
        let endless = vec![b'a'; MAX_HEAD_BYTES];
        assert!(matches!(read_head(&endless), Head::Refused(431, _)));
    }

    #[test]
    fn odd_requests_are_refused_with_a_reason() {
        for bytes in [
            &b"CONNECT a.example HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a.example:0 HTTP/1.1\r\n\r\n",
            b"CONNECT a.example:99999 HTTP/1.1\r\n\r\n",
            b"CONNECT user:pw@a.example:443 HTTP/1.1\r\n\r\n",
            b"CONNECT [not-v6]:443 HTTP/1.1\r\n\r\n",
            b"GET /relative HTTP/1.1\r\n\r\n",
            b"GET https://a.example/ HTTP/1.1\r\n\r\n",
            b"GET http://a b.example/ HTTP/1.1\r\n\r\n",
            b"get http://a.example/ HTTP/1.1\r\n\r\n",
            b"GET http://a.example/ HTTP/2\r\n\r\n",
            b"GET http://a\xff.example/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(read_head(bytes), Head::Refused(_, _)),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
