//! HTTP/1.1 request heads as the proxy rewrites them: a plain-HTTP
//! request in absolute form becomes origin form for the server, and a
//! request to a host with a credential gets the credential's header
//! (whatever the client sent under that name is dropped first).
//!
//! Inside an intercepted tunnel every request head is found by following
//! the bodies' framing: a `Content-Length` or chunked body is passed
//! through and the next head read after it. Every head is checked first
//! (`request::parse_head`) and every chunked body as it passes (`body`):
//! a head or chunk a server could read differently, which would let the
//! credential the proxy adds to the next head land in what the server
//! takes for a body, is refused. After an upgrade the rest of the
//! connection passes through untouched.
//!
//! Every request in a tunnel must be for the tunnel's host, and a target
//! that could name another is refused (`admit`), as is a body a server
//! may ignore (on GET, HEAD or OPTIONS). The client's `Connection` header,
//! and the headers it names, are the hop's: they are not forwarded.

use super::admit;
use super::body::Body;
pub use super::refusal::Refusal;
use crate::request::{self, HeadError, MAX_HEAD_BYTES};

/// A header to set on every request: name and value. The value is never
/// logged or shown; [`std::fmt::Debug`] leaves it out.
#[derive(Clone)]
pub struct SetHeader {
    pub name: String,
    pub value: String,
}

impl std::fmt::Debug for SetHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetHeader")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// `Host: authority`, as a header set on a request (replacing the
/// client's).
fn host_header(authority: &str) -> SetHeader {
    SetHeader {
        name: "Host".into(),
        value: authority.into(),
    }
}

/// Request lines and header lines of one head, without the final CRLF.
fn lines(head: &str) -> impl Iterator<Item = &str> {
    head.split("\r\n").filter(|line| !line.is_empty())
}

fn header_name(line: &str) -> &str {
    line.split_once(':').map_or(line, |(name, _)| name).trim()
}

/// Whether a client's header is one the proxy consumes, replaces or
/// decides itself; `hop` names (lowercased) the connection's own headers,
/// which are not forwarded either.
fn dropped(name: &str, set: &[SetHeader], hop: &[&str]) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("proxy-")
        || hop.contains(&lower.as_str())
        || set
            .iter()
            .any(|header| header.name.eq_ignore_ascii_case(name))
}

/// Writes the head's header lines (not the request line) minus dropped
/// ones, then the set headers, into `out`.
fn headers(head: &str, set: &[SetHeader], hop: &[&str], out: &mut Vec<u8>) {
    for line in lines(head).skip(1) {
        if !dropped(header_name(line), set, hop) {
            out.extend_from_slice(line.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    for header in set {
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The head of a plain-HTTP request in absolute form (`head` is the whole
/// head as the client sent it, final CRLF CRLF included), rewritten for
/// the origin server: `method target version`, no `Proxy-*` headers,
/// `Host` the request's own authority, `set` added, and `Connection: close`
/// so that each plain request is a connection of its own (a later request
/// on it could name another host).
pub fn forward_head(
    head: &[u8],
    method: &str,
    target: &str,
    authority: &str,
    set: &[SetHeader],
) -> Vec<u8> {
    let head = String::from_utf8_lossy(head);
    let version = lines(&head)
        .next()
        .and_then(|line| line.rsplit(' ').next())
        .unwrap_or("HTTP/1.1");
    let mut out = Vec::with_capacity(head.len() + 64);
    out.extend_from_slice(format!("{method} {target} {version}\r\n").as_bytes());
    // The host the request was decided on, whatever Host the client sent:
    // a server that routes by Host (a CDN's shared edge) must not be told
    // of another one.
    let mut set = set.to_vec();
    set.insert(0, host_header(authority));
    headers(&head, &set, &["connection", "keep-alive"], &mut out);
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Where a stream of requests (inside an intercepted tunnel) is.
#[derive(Debug)]
enum State {
    /// Reading a head (the bytes so far are buffered).
    Head,
    /// Passing a body through, to its end.
    Body(Body),
    /// Passing everything through: an upgrade was asked for.
    Through,
}

/// The requests a client sends through an intercepted tunnel, each head
/// rewritten with the credential's header.
#[derive(Debug)]
pub struct Requests {
    /// The tunnel's host (and port, unless 443): every request is for it.
    authority: String,
    set: Vec<SetHeader>,
    state: State,
    head: Vec<u8>,
    /// Request heads rewritten so far.
    pub count: u64,
}

impl Requests {
    /// The requests of a tunnel to `authority` (`host`, or `host:port`
    /// for another port than 443), each given the `set` headers.
    pub fn new(authority: String, mut set: Vec<SetHeader>) -> Requests {
        set.insert(0, host_header(&authority));
        Requests {
            authority,
            set,
            state: State::Head,
            head: Vec::new(),
            count: 0,
        }
    }

    /// Takes the next plaintext bytes from the client and appends what to
    /// send upstream to `out`. An error is a request the proxy refuses;
    /// `out` may hold part of what came before it, never any of it.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Refusal> {
        while !input.is_empty() {
            match &mut self.state {
                State::Through => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Body(body) => {
                    let n = body.take(input)?;
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if body.done() {
                        self.state = State::Head;
                    }
                }
                State::Head => {
                    // Look for the end across the old bytes and the new.
                    let from = self.head.len().saturating_sub(3);
                    let take = input.len().min(MAX_HEAD_BYTES + 1 - self.head.len());
                    self.head.extend_from_slice(&input[..take]);
                    let end = request::head_end(&self.head, from)?;
                    let Some(end) = end.filter(|end| *end <= MAX_HEAD_BYTES) else {
                        if self.head.len() > MAX_HEAD_BYTES {
                            return Err(HeadError::TooLong.into());
                        }
                        return Ok(());
                    };
                    // Bytes past the head's end go round again.
                    let extra = self.head.len() - end;
                    input = &input[take - extra..];
                    self.head.truncate(end);
                    let head = std::mem::take(&mut self.head);
                    self.state = self.rewrite(&head, out)?;
                    self.count += 1;
                }
            }
        }
        Ok(())
    }

    /// Rewrites one head into `out`; what follows it.
    fn rewrite(&self, head: &[u8], out: &mut Vec<u8>) -> Result<State, Refusal> {
        let parsed = request::parse_head(head)?;
        let (method, target, text) = (parsed.method, parsed.target, parsed.text);
        if matches!(method.to_ascii_uppercase().as_str(), "TRACE" | "CONNECT") {
            // TRACE would echo the credential back into the sandbox.
            return Err(Refusal::Method(method.to_owned()));
        }
        admit::target(&self.authority, method, target)?;
        admit::body(method, parsed.framing)?;
        let set_names: Vec<&str> = self.set.iter().map(|header| header.name.as_str()).collect();
        let options = admit::connection_options(text, &set_names)?;
        let upgrade = lines(text)
            .skip(1)
            .any(|line| header_name(line).eq_ignore_ascii_case("upgrade"));
        let mut hop = vec!["connection"];
        if upgrade {
            hop.push("keep-alive");
        }
        // The Upgrade header stays for an upgrade: the proxy's own
        // Connection names it.
        hop.extend(
            options
                .iter()
                .map(String::as_str)
                .filter(|option| *option != "upgrade"),
        );
        out.extend_from_slice(lines(text).next().unwrap_or_default().as_bytes());
        out.extend_from_slice(b"\r\n");
        headers(text, &self.set, &hop, out);
        let has = |option: &str| options.iter().any(|o| o == option);
        // The client's Connection is replaced by the proxy's, which keeps
        // what the client asked of the connection itself: the tunnel is
        // one connection to the server.
        let connection = if upgrade {
            // What follows is another protocol's, passed through.
            Some("upgrade")
        } else if has("close") {
            Some("close")
        } else if has("keep-alive") {
            Some("keep-alive")
        } else {
            None
        };
        if let Some(connection) = connection {
            out.extend_from_slice(format!("Connection: {connection}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        let body = Body::new(parsed.framing);
        Ok(if upgrade {
            State::Through
        } else if body.done() {
            State::Head
        } else {
            State::Body(body)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::BodyError;

    fn token() -> Vec<SetHeader> {
        vec![SetHeader {
            name: "Authorization".into(),
            value: "Bearer s3cret".into(),
        }]
    }

    #[test]
    fn keep_alive_requests_each_get_the_header_and_lose_the_clients() {
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        let stream = b"POST /a HTTP/1.1\r\nHost: h\r\nauthorization: mine\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: h\r\n\r\n";
        // Byte by byte, to cross every boundary.
        for byte in stream {
            requests.feed(&[*byte], &mut out).unwrap();
        }
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "POST /a HTTP/1.1\r\nContent-Length: 5\r\nHost: h\r\nAuthorization: Bearer s3cret\r\n\r\nhello\
             GET /b HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer s3cret\r\n\r\n"
        );
        assert_eq!(requests.count, 2);
    }

    #[test]
    fn a_chunked_request_is_followed_and_the_next_head_gets_the_header() {
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        let stream = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n";
        for byte in stream {
            requests.feed(&[*byte], &mut out).unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: h\r\nAuthorization: Bearer s3cret\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n\
             GET /x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer s3cret\r\n\r\n"
        );
        assert_eq!(requests.count, 2);
    }

    #[test]
    fn a_head_hiding_its_framing_is_refused_before_any_of_it_is_sent() {
        for (stream, refusal) in [
            (
                &b"POST / HTTP/1.1\r\nX-A: 1\nContent-Length: 80\r\n\r\nGET / HTTP/1.1\r\n\r\n"[..],
                Refusal::Head(HeadError::BareLf),
            ),
            (
                b"POST / HTTP/1.1\nContent-Length: 80\r\n\r\n",
                Refusal::Head(HeadError::BareLf),
            ),
            (
                b"POST / HTTP/1.1\r\nX-A: 1\nTransfer-Encoding: chunked\r\n\r\n",
                Refusal::Head(HeadError::BareLf),
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                Refusal::Head(HeadError::BothFramings),
            ),
            (b"GET /\r\n\r\n", Refusal::Head(HeadError::NoVersion)),
            // A chunk-size line, sent as if it were a head.
            (b"57\r\n\r\n", Refusal::Head(HeadError::RequestLine)),
        ] {
            let mut requests = Requests::new("h".into(), token());
            let mut out = Vec::new();
            assert_eq!(requests.feed(stream, &mut out), Err(refusal), "{stream:?}");
            assert!(out.is_empty(), "{stream:?}");
        }
    }

    #[test]
    fn a_malformed_chunk_is_refused_and_nothing_after_it_is_sent() {
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        let refused = requests.feed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            &mut out,
        );
        assert_eq!(refused, Err(Refusal::Body(BodyError::Extension)));
        let out = String::from_utf8(out).unwrap();
        assert!(out.ends_with("Bearer s3cret\r\n\r\n"), "{out}");
        assert_eq!(requests.count, 1);
    }

    #[test]
    fn a_request_for_another_host_or_a_trace_is_refused_inside_a_tunnel() {
        for head in [
            "GET http://attacker.example/ HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
            "GET https://h:8443/ HTTP/1.1\r\n\r\n",
            "TRACE / HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            let mut requests = Requests::new("h".into(), token());
            assert!(
                requests.feed(head.as_bytes(), &mut Vec::new()).is_err(),
                "{head}"
            );
        }
        // Whatever Host the client names, the server hears the tunnel's.
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        requests
            .feed(
                b"GET https://H/x HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
                &mut out,
            )
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("\r\nHost: h\r\n") && !out.contains("attacker"),
            "{out}"
        );
        let mut plus = Requests::new("h".into(), token());
        assert_eq!(
            plus.feed(
                b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                &mut Vec::new()
            ),
            Err(Refusal::Head(HeadError::Length("+5".into())))
        );
    }

    #[test]
    fn an_endless_head_is_refused() {
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        let line = vec![b'a'; 1024];
        let refused = (0..20).any(|_| requests.feed(&line, &mut out).is_err());
        assert!(refused);
    }

    #[test]
    fn absolute_form_becomes_origin_form_without_proxy_headers() {
        let head = b"GET http://h.test/x HTTP/1.1\r\nHost: h.test\r\nProxy-Authorization: x\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\n\r\n";
        let out = forward_head(head, "GET", "/x", "h.test", &token());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /x HTTP/1.1\r\nHost: h.test\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n"
        );
        let out = forward_head(
            b"GET http://h.test:81/ HTTP/1.0\r\n\r\n",
            "GET",
            "/",
            "h.test:81",
            &[],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET / HTTP/1.0\r\nHost: h.test:81\r\nConnection: close\r\n\r\n"
        );
    }
}
