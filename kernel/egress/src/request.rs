//! What a sandbox asks the egress proxy for: the head of its first
//! request on a connection, `CONNECT host:port` (a tunnel, for TLS) or a
//! plain-HTTP request in absolute form (`GET http://host/path`), read with
//! bounds, since the sandbox's code may send anything.
//!
//! Every head the proxy reads (this one, and each inside an intercepted
//! tunnel) is checked against RFC 9112's grammar with none of the leniency
//! it allows a recipient: a head that a server could split into lines, or
//! frame, differently from the proxy is refused, so that what the proxy
//! decides on and adds to is what the server reads.

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
        /// How its body ends: nothing after it is forwarded.
        framing: Framing,
    },
}

/// How a request's body is delimited, as its head says (RFC 9112 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length`: this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl Framing {
    /// Whether a request of `method` may carry this body. GET, HEAD and
    /// OPTIONS may not (TRACE is refused whole): RFC 9110 gives a body
    /// there no meaning, and servers commonly ignore it, reading it as a
    /// request of its own, for whatever host it names.
    pub fn fits(self, method: &str) -> bool {
        let bodiless = ["GET", "HEAD", "OPTIONS"]
            .iter()
            .any(|name| method.eq_ignore_ascii_case(name));
        !bodiless || matches!(self, Framing::None | Framing::Length(0))
    }
}

/// Why a request head is refused. Each is a form that some HTTP/1.1
/// parsers take and others do not (RFC 9112 leaves most of them to the
/// recipient's leniency): a server reading such a head differently from
/// the proxy would find a request, or a body, where the proxy saw none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("a line ended by a bare LF, not CRLF")]
    BareLf,
    #[error("a bare CR, not followed by LF")]
    BareCr,
    #[error("a NUL byte in the request head")]
    Nul,
    #[error("a request head that is not text")]
    NotText,
    #[error("a request head longer than {MAX_HEAD_BYTES} bytes")]
    TooLong,
    #[error("a request line is `METHOD target HTTP/1.x`")]
    RequestLine,
    #[error("a request line without an HTTP version (HTTP/0.9)")]
    NoVersion,
    #[error("{0:?}: the proxy speaks HTTP/1.1")]
    Version(String),
    #[error("{0:?} is not an HTTP method")]
    Method(String),
    #[error("{0:?} is not a request target")]
    Target(String),
    #[error("a header line folded onto the one before (obs-fold)")]
    Folded,
    #[error("a header line without a colon")]
    NoColon,
    #[error("whitespace before a header's colon")]
    SpaceBeforeColon,
    #[error("{0:?} is not a header name")]
    FieldName(String),
    #[error("a control character in the value of {0}")]
    Control(String),
    #[error("more than one {0}")]
    MoreThanOne(&'static str),
    #[error("both Transfer-Encoding and Content-Length")]
    BothFramings,
    #[error("Content-Length {0:?} is not one plain decimal number")]
    Length(String),
    #[error("Transfer-Encoding {0:?}: only `chunked`, alone, is served")]
    Coding(String),
    #[error("Transfer-Encoding on an HTTP/1.0 request")]
    CodingOnHttp10,
}

impl HeadError {
    /// The HTTP status a refusal for it answers.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::TooLong => 431,
            HeadError::Version(_) => 505,
            _ => 400,
        }
    }
}

/// Why a request's target (a CONNECT's `host:port`, a plain request's
/// URL) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("an https:// URL goes through CONNECT, not as a plain request")]
    Https,
    #[error("{0:?}: a proxy request names its URL in full (http://host/path)")]
    NotAbsolute(String),
    #[error("a body on {0}: a server may read it as a request of its own; send it with POST")]
    BodyOn(String),
    #[error("credentials in a URL are refused: send them in a header")]
    Credentials,
    #[error("an IPv6 address without its ]")]
    Unclosed,
    #[error("[{0}] is not an IPv6 address")]
    NotV6(String),
    #[error("port {0:?} is not 1 to 65535")]
    Port(String),
    #[error("CONNECT names a host and its port")]
    NoPort,
    #[error("{0:?} is not a host name or address")]
    Host(String),
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

impl From<HeadError> for Head {
    fn from(error: HeadError) -> Head {
        Head::Refused(error.status(), error.to_string())
    }
}

/// A request head that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    pub target: &'a str,
    pub version: &'a str,
    pub framing: Framing,
    /// The request line and header lines, CRLF between them, without the
    /// final CRLF CRLF.
    pub text: &'a str,
}

/// Where the head at the start of `bytes` ends (just after its CRLF
/// CRLF), once it has; `from` is where bytes not scanned before begin (a
/// caller that reads more rescans the three before them). A byte no head
/// may hold refuses it at once, so a head that will never end in CRLF
/// CRLF is not waited for.
pub fn head_end(bytes: &[u8], from: usize) -> Result<Option<usize>, HeadError> {
    for (at, &byte) in bytes.iter().enumerate().skip(from) {
        match byte {
            0 => return Err(HeadError::Nul),
            b'\n' if at == 0 || bytes[at - 1] != b'\r' => return Err(HeadError::BareLf),
            b'\n' if at >= 3 && bytes[at - 3..at] == *b"\r\n\r" => return Ok(Some(at + 1)),
            b'\r' if bytes.get(at + 1).is_some_and(|&next| next != b'\n') => {
                return Err(HeadError::BareCr)
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Checks one whole request head (its final CRLF CRLF included) against
/// RFC 9112's grammar, with none of the leniency it allows a recipient,
/// and says how its body is framed.
pub fn parse_head(head: &[u8]) -> Result<RequestHead<'_>, HeadError> {
    let end = head_end(head, 0)?.unwrap_or(head.len());
    let text = std::str::from_utf8(&head[..end]).map_err(|_| HeadError::NotText)?;
    let text = text.strip_suffix("\r\n\r\n").unwrap_or(text);
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut words = line.split(' ');
    let (method, target, version) = match (words.next(), words.next(), words.next(), words.next()) {
        (Some(method), Some(target), Some(version), None) if !target.is_empty() => {
            (method, target, version)
        }
        (Some(method), Some(target), None, _) if !method.is_empty() && !target.is_empty() => {
            return Err(HeadError::NoVersion)
        }
        _ => return Err(HeadError::RequestLine),
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(HeadError::Version(version.to_owned()));
    }
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(HeadError::Method(method.to_owned()));
    }
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HeadError::Target(target.to_owned()));
    }
    let (mut lengths, mut codings) = (Vec::new(), Vec::new());
    for line in lines {
        // Folding, or whitespace between the request line and the first
        // field: some servers join the line to the one before, some take
        // it as a field of its own.
        if line.starts_with([' ', '\t']) {
            return Err(HeadError::Folded);
        }
        let (name, value) = field(line)?;
        if name.eq_ignore_ascii_case("content-length") {
            lengths.push(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            codings.push(value);
        }
    }
    let framing = match (lengths.as_slice(), codings.as_slice()) {
        ([], []) => Framing::None,
        (_, [_, _, ..]) => return Err(HeadError::MoreThanOne("Transfer-Encoding")),
        ([_, _, ..], _) => return Err(HeadError::MoreThanOne("Content-Length")),
        ([_], [_]) => return Err(HeadError::BothFramings),
        ([length], []) => {
            Framing::Length(decimal(length).ok_or_else(|| HeadError::Length((*length).to_owned()))?)
        }
        ([], [coding]) => {
            // Only `chunked` alone: a server that knows another coding, or
            // takes a list's first, would end the body elsewhere.
            if !coding.eq_ignore_ascii_case("chunked") {
                return Err(HeadError::Coding((*coding).to_owned()));
            }
            if version == "HTTP/1.0" {
                return Err(HeadError::CodingOnHttp10);
            }
            Framing::Chunked
        }
    };
    Ok(RequestHead {
        method,
        target,
        version,
        framing,
        text,
    })
}

/// A header line's name and value, the value without the whitespace
/// around it.
fn field(line: &str) -> Result<(&str, &str), HeadError> {
    let (name, value) = line.split_once(':').ok_or(HeadError::NoColon)?;
    if name.ends_with([' ', '\t']) {
        return Err(HeadError::SpaceBeforeColon);
    }
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(HeadError::FieldName(name.to_owned()));
    }
    // Only SP and HTAB are whitespace here: `str::trim` would also take
    // Unicode spaces, which a server reading bytes keeps.
    let value = value.trim_matches([' ', '\t']);
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HeadError::Control(name.to_owned()));
    }
    Ok((name, value))
}

/// A Content-Length's value: digits only, without a sign or a leading
/// zero (a server may read `010` as octal), and within what a signed
/// 64-bit parser takes.
fn decimal(text: &str) -> Option<u64> {
    let plain = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    plain
        .then(|| text.parse::<u64>().ok())
        .flatten()
        .filter(|n| i64::try_from(*n).is_ok())
}

/// A `tchar` of RFC 9110's `token` (methods and header names).
pub(crate) fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Reads the request head at the start of `bytes`.
pub fn read_head(bytes: &[u8]) -> Head {
    let end = match head_end(bytes, 0) {
        Err(error) => return error.into(),
        Ok(Some(end)) if end <= MAX_HEAD_BYTES => end,
        Ok(None) if bytes.len() < MAX_HEAD_BYTES => return Head::Incomplete,
        Ok(_) => return HeadError::TooLong.into(),
    };
    let head = match parse_head(&bytes[..end]) {
        Ok(head) => head,
        Err(error) => return error.into(),
    };
    let method = head.method;
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return HeadError::Method(method.to_owned()).into();
    }
    let request = if method == "CONNECT" {
        authority(head.target, None).map(|(host, port)| ProxyRequest::Connect { host, port })
    } else {
        forward(method, head.target, head.framing)
    };
    match request {
        Ok(request) => Head::Complete(request, end),
        Err(why) => Head::Refused(400, why.to_string()),
    }
}

/// An absolute-form target's scheme and what follows its `://`, if it
/// has the form: a scheme is a letter, then letters, digits, `+`, `-` or
/// `.` (RFC 3986 3.1). Its case is the client's: schemes are compared
/// without it, as servers do (`HTTPS://` is `https://`).
pub fn absolute_form(target: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = target.split_once("://")?;
    let mut bytes = scheme.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    valid.then_some((scheme, rest))
}

/// A plain-HTTP request's absolute-form target.
fn forward(method: &str, target: &str, framing: Framing) -> Result<ProxyRequest, TargetError> {
    let rest = match absolute_form(target) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(TargetError::Https)
        }
        _ => return Err(TargetError::NotAbsolute(target.to_owned())),
    };
    let (authority_part, path) = match rest.find(['/', '?']) {
        Some(index) => (&rest[..index], &rest[index..]),
        None => (rest, "/"),
    };
    let (host, port) = authority(authority_part, Some(80))?;
    if !framing.fits(method) {
        return Err(TargetError::BodyOn(method.to_owned()));
    }
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
        framing,
    })
}

/// `host:port` (`[v6]:port` for IPv6); `default_port` when it has none.
fn authority(text: &str, default_port: Option<u16>) -> Result<(String, u16), TargetError> {
    if text.contains('@') {
        return Err(TargetError::Credentials);
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(TargetError::Unclosed)?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(TargetError::NotV6(host.to_owned()));
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
            _ => return Err(TargetError::Port(written.to_owned())),
        },
        (None, Some(port)) => port,
        (None, None) => return Err(TargetError::NoPort),
    };
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    if !valid {
        return Err(TargetError::Host(host.to_owned()));
    }
    // One spelling of each name from here on: `a.com.` is `a.com` for the
    // policy, the resolver override, the credential and the TLS name.
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.ends_with('.') {
        return Err(TargetError::Host(text.to_owned()));
    }
    Ok((host.to_ascii_lowercase(), port))
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
                    target: "/a/b?c=d".into(),
                    framing: Framing::None,
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
    #[test]
    fn an_absolute_urls_scheme_is_read_in_any_case_and_only_http_is_forwarded() {
        assert_eq!(absolute_form("HTTPS://h/x"), Some(("HTTPS", "h/x")));
        assert_eq!(absolute_form("x://h/"), Some(("x", "h/")));
        assert_eq!(absolute_form("web+a.b-c://h"), Some(("web+a.b-c", "h")));
        for target in ["/a://b", "1x://h/", "://h/", "*", "http:/h/x", "h:443"] {
            assert_eq!(absolute_form(target), None, "{target}");
        }
        for (bytes, port, path) in [
            (
                &b"GET HTTP://A.example:8080/a HTTP/1.1\r\n\r\n"[..],
                8080,
                "/a",
            ),
            (b"GET Http://a.example HTTP/1.1\r\n\r\n", 80, "/"),
            (b"GET hTtP://a.example?q HTTP/1.1\r\n\r\n", 80, "/?q"),
        ] {
            assert!(
                matches!(
                    read_head(bytes),
                    Head::Complete(ProxyRequest::Forward { ref host, port: p, ref target, .. }, _)
                        if host == "a.example" && p == port && target == path
                ),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        for (bytes, why) in [
            (&b"GET HTTPS://a.example/ HTTP/1.1\r\n\r\n"[..], "CONNECT"),
            (b"GET Https://a.example/ HTTP/1.1\r\n\r\n", "CONNECT"),
            (b"GET ws://a.example/ HTTP/1.1\r\n\r\n", "in full"),
            (b"GET x://a.example/ HTTP/1.1\r\n\r\n", "in full"),
            (b"GET http:/a.example/ HTTP/1.1\r\n\r\n", "in full"),
        ] {
            assert!(
                matches!(read_head(bytes), Head::Refused(400, ref reason) if reason.contains(why)),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn a_head_ends_at_crlf_crlf_and_a_bare_lf_cr_or_nul_refuses_it_before_it_ends() {
        let head = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\nbody";
        assert_eq!(head_end(head, 0), Ok(Some(head.len() - 4)));
        for end in 0..head.len() - 4 {
            assert_eq!(head_end(&head[..end], 0), Ok(None), "{end} bytes");
        }
        // Resumed three bytes before the new ones, as the readers do.
        assert_eq!(head_end(head, 30), Ok(Some(head.len() - 4)));
        for (bytes, error) in [
            (&b"GET / HTTP/1.1\nHost: a\r\n"[..], HeadError::BareLf),
            (b"\n", HeadError::BareLf),
            (b"GET / HTTP/1.1\r\nX: 1\rY: 2", HeadError::BareCr),
            (b"GET / HTTP/1.1\r\nX: \0", HeadError::Nul),
        ] {
            assert_eq!(head_end(bytes, 0), Err(error), "{bytes:?}");
        }
        // A CR last is not bare yet: its LF may come next.
        assert_eq!(head_end(b"GET / HTTP/1.1\r", 0), Ok(None));
        // What follows the head (a body) is not the head's to judge.
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n\0\n", 0), Ok(Some(18)));
    }

    /// `GET / HTTP/1.1` and `Host: a`, with `fields` after them.
    fn head_with(fields: &str) -> String {
        format!("POST / HTTP/1.1\r\nHost: a\r\n{fields}\r\n\r\n")
    }

    #[test]
    fn every_form_two_parsers_may_read_apart_is_refused() {
        let length = |text: &str| HeadError::Length(text.into());
        let coding = |text: &str| HeadError::Coding(text.into());
        for (head, error) in [
            // A bare LF ending a header line, or the request line, or the
            // head; a bare CR; a NUL.
            (head_with("X-A: 1\nContent-Length: 5"), HeadError::BareLf),
            (
                "POST / HTTP/1.1\nContent-Length: 5\r\n\r\n".into(),
                HeadError::BareLf,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\n\n".into(),
                HeadError::BareLf,
            ),
            (head_with("X-A: 1\rContent-Length: 5"), HeadError::BareCr),
            (head_with("X-A: 1\0"), HeadError::Nul),
            // Folding, and whitespace before the first field.
            (head_with("X-A: 1\r\n Content-Length: 5"), HeadError::Folded),
            (
                head_with("X-A: 1\r\n\tContent-Length: 5"),
                HeadError::Folded,
            ),
            (
                "POST / HTTP/1.1\r\n Host: a\r\n\r\n".into(),
                HeadError::Folded,
            ),
            // Whitespace before a colon; a name that is not a token.
            (head_with("Content-Length : 5"), HeadError::SpaceBeforeColon),
            (
                head_with("Content-Length\t: 5"),
                HeadError::SpaceBeforeColon,
            ),
            (
                head_with("Content Length: 5"),
                HeadError::FieldName("Content Length".into()),
            ),
            (head_with(": 5"), HeadError::FieldName(String::new())),
            (head_with("Content-Length"), HeadError::NoColon),
            (head_with("X-A: 1\x0b"), HeadError::Control("X-A".into())),
            // Both framings, either twice, a Content-Length that is a
            // list, signed, padded or out of range.
            (
                head_with("Transfer-Encoding: chunked\r\nContent-Length: 5"),
                HeadError::BothFramings,
            ),
            (
                head_with("Content-Length: 5\r\nContent-Length: 5"),
                HeadError::MoreThanOne("Content-Length"),
            ),
            (
                head_with("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked"),
                HeadError::MoreThanOne("Transfer-Encoding"),
            ),
            (head_with("Content-Length: 5, 5"), length("5, 5")),
            (head_with("Content-Length: 5,5"), length("5,5")),
            (head_with("Content-Length: +5"), length("+5")),
            (head_with("Content-Length: -5"), length("-5")),
            (head_with("Content-Length: 05"), length("05")),
            (head_with("Content-Length: 0x5"), length("0x5")),
            (head_with("Content-Length: 5 5"), length("5 5")),
            (head_with("Content-Length: \u{a0}5"), length("\u{a0}5")),
            (head_with("Content-Length: "), length("")),
            (
                head_with("Content-Length: 9223372036854775808"),
                length("9223372036854775808"),
            ),
            // A Transfer-Encoding that is not `chunked` alone, or on 1.0.
            (
                head_with("Transfer-Encoding: chunked, identity"),
                coding("chunked, identity"),
            ),
            (
                head_with("Transfer-Encoding: gzip, chunked"),
                coding("gzip, chunked"),
            ),
            (head_with("Transfer-Encoding: identity"), coding("identity")),
            (head_with("Transfer-Encoding: xchunked"), coding("xchunked")),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".into(),
                HeadError::CodingOnHttp10,
            ),
            // HTTP/0.9, and request lines that are not three words.
            ("GET /\r\n\r\n".into(), HeadError::NoVersion),
            (
                "GET / HTTP/0.9\r\n\r\n".into(),
                HeadError::Version("HTTP/0.9".into()),
            ),
            ("GET  / HTTP/1.1\r\n\r\n".into(), HeadError::RequestLine),
            ("GET / HTTP/1.1 x\r\n\r\n".into(), HeadError::RequestLine),
            (
                "GET /\x7f HTTP/1.1\r\n\r\n".into(),
                HeadError::Target("/\x7f".into()),
            ),
            (
                "GET /\t HTTP/1.1\r\n\r\n".into(),
                HeadError::Target("/\t".into()),
            ),
            (
                "G(T / HTTP/1.1\r\n\r\n".into(),
                HeadError::Method("G(T".into()),
            ),
        ] {
            assert_eq!(parse_head(head.as_bytes()), Err(error.clone()), "{head:?}");
            // The proxy's own reading refuses it the same way.
            assert_eq!(read_head(head.as_bytes()), Head::from(error), "{head:?}");
        }
    }

    #[test]
    fn a_well_formed_head_says_how_its_body_is_framed() {
        for (head, framing) in [
            (head_with("Content-Length: 5"), Framing::Length(5)),
            (head_with("content-length:5 \t"), Framing::Length(5)),
            (head_with("Content-Length: 0"), Framing::Length(0)),
            (head_with("Transfer-Encoding: Chunked"), Framing::Chunked),
            (head_with("X-A: a value\twith tabs  "), Framing::None),
            (
                "GET / HTTP/1.0\r\nContent-Length: 9\r\n\r\n".into(),
                Framing::Length(9),
            ),
            ("GET / HTTP/1.1\r\n\r\n".into(), Framing::None),
        ] {
            let parsed = parse_head(head.as_bytes()).unwrap();
            assert_eq!(parsed.framing, framing, "{head:?}");
            assert_eq!(parsed.text, head.strip_suffix("\r\n\r\n").unwrap());
        }
        let bytes = b"POST http://a.example/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n";
        assert!(matches!(
            read_head(bytes),
            Head::Complete(ProxyRequest::Forward { framing: Framing::Chunked, .. }, n) if n == bytes.len() - 3
        ));
    }
}
