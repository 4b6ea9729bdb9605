//! HTTP/1.1 request heads as the proxy rewrites them: a plain-HTTP
//! request in absolute form becomes origin form for the server, and a
//! request to a host with a credential gets the credential's header
//! (whatever the client sent under that name is dropped first).
//!
//! Inside an intercepted tunnel every request head is found by following
//! the bodies' framing: a `Content-Length` body is passed through and the
//! next head read after it. A chunked body (or an upgrade) is not parsed:
//! that request is sent with `Connection: close`, the rest of the
//! connection passes through untouched, and the server ends it after its
//! reply, so no later request can go out without the credential.

use crate::network::request::{find, MAX_HEAD_BYTES};

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
/// decides itself.
fn dropped(name: &str, set: &[SetHeader], forwarding: bool) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("proxy-")
        || (forwarding && matches!(lower.as_str(), "connection" | "keep-alive"))
        || set
            .iter()
            .any(|header| header.name.eq_ignore_ascii_case(name))
}

/// Writes the head's header lines (not the request line) minus dropped
/// ones, then the set headers, into `out`.
fn headers(head: &str, set: &[SetHeader], forwarding: bool, out: &mut Vec<u8>) {
    for line in lines(head).skip(1) {
        if !dropped(header_name(line), set, forwarding) {
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
    headers(&head, &set, true, &mut out);
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// Where a stream of requests (inside an intercepted tunnel) is.
#[derive(Debug)]
enum State {
    /// Reading a head (the bytes so far are buffered).
    Head,
    /// Passing a body through: this many bytes of it are left.
    Body(u64),
    /// Passing everything through: a chunked body or an upgrade was seen.
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
    /// send upstream to `out`. An error is a head the proxy refuses.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        while !input.is_empty() {
            match &mut self.state {
                State::Through => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Body(left) => {
                    let n = (*left).min(input.len() as u64) as usize;
                    out.extend_from_slice(&input[..n]);
                    *left -= n as u64;
                    if *left == 0 {
                        self.state = State::Head;
                    }
                    input = &input[n..];
                }
                State::Head => {
                    // Look for the end across the old bytes and the new.
                    let from = self.head.len().saturating_sub(3);
                    let take = input.len().min(MAX_HEAD_BYTES + 1 - self.head.len());
                    self.head.extend_from_slice(&input[..take]);
                    let Some(end) = find(&self.head[from..], b"\r\n\r\n").map(|i| from + i + 4)
                    else {
                        if self.head.len() > MAX_HEAD_BYTES {
                            return Err(format!(
                                "a request head longer than {MAX_HEAD_BYTES} bytes"
                            ));
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
    fn rewrite(&self, head: &[u8], out: &mut Vec<u8>) -> Result<State, String> {
        let text = std::str::from_utf8(head).map_err(|_| "a request head that is not text")?;
        let request_line = lines(text).next().unwrap_or_default();
        let mut words = request_line.split(' ');
        let (method, target) = (
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default(),
        );
        if matches!(method.to_ascii_uppercase().as_str(), "TRACE" | "CONNECT") {
            // TRACE would echo the credential back into the sandbox.
            return Err(format!(
                "{method} is not served inside an intercepted tunnel"
            ));
        }
        if let Some(rest) = target
            .strip_prefix("https://")
            .or_else(|| target.strip_prefix("http://"))
        {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let same = authority.eq_ignore_ascii_case(&self.authority)
                || authority.eq_ignore_ascii_case(&format!("{}:443", self.authority));
            if !same {
                return Err(format!(
                    "a request for {authority} inside a tunnel to {}",
                    self.authority
                ));
            }
        }
        let mut length = None;
        let mut through = false;
        for line in lines(text).skip(1) {
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                let n: u64 = value
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| value.parse().ok())
                    .flatten()
                    .ok_or_else(|| format!("Content-Length {value:?} is not a number"))?;
                if length.is_some_and(|old| old != n) {
                    return Err("two different Content-Lengths".into());
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                || name.eq_ignore_ascii_case("upgrade")
            {
                through = true;
            }
        }
        out.extend_from_slice(request_line.as_bytes());
        out.extend_from_slice(b"\r\n");
        headers(text, &self.set, through, out);
        if through {
            // Not followed: the server closes after this request, so that
            // every request on a connection carries the credential.
            let upgrade = lines(text)
                .skip(1)
                .any(|line| header_name(line).eq_ignore_ascii_case("upgrade"));
            if upgrade {
                out.extend_from_slice(b"Connection: upgrade\r\n");
            } else {
                out.extend_from_slice(b"Connection: close\r\n");
            }
        }
        out.extend_from_slice(b"\r\n");
        Ok(match (through, length) {
            (true, _) => State::Through,
            (false, Some(n)) if n > 0 => State::Body(n),
            _ => State::Head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_chunked_request_is_the_connections_last() {
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        requests
            .feed(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
                &mut out,
            )
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: h\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n5\r\nhello"), "{out}");
        assert!(!out.contains("keep-alive"));
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
        assert!(plus
            .feed(
                b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
                &mut Vec::new()
            )
            .is_err());
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
