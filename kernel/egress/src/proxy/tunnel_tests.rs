//! Requests driven through a tunnel's rewriter (`http::Requests`), for
//! what `admit` lets on: the bytes the server gets, or the refusal.

use super::http::{Refusal, Requests, SetHeader};

const SECRET_LINE: &str = "\r\nAuthorization: Bearer s3cret\r\n";

fn token() -> Vec<SetHeader> {
    vec![SetHeader {
        name: "Authorization".into(),
        value: "Bearer s3cret".into(),
    }]
}

/// What `stream` sent through a tunnel to `authority` becomes: the
/// bytes for the server, or the refusal.
fn through(authority: &str, stream: &str) -> Result<String, Refusal> {
    let mut requests = Requests::new(authority.into(), token());
    let mut out = Vec::new();
    requests.feed(stream.as_bytes(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn an_absolute_url_for_another_host_is_refused_whatever_the_case_of_its_scheme() {
    let other = |asked: &str, tunnel: &str| Refusal::OtherHost {
        asked: asked.into(),
        tunnel: tunnel.into(),
    };
    for (tunnel, head, refusal) in [
        (
            "h",
            "GET HTTPS://victim.example/x HTTP/1.1\r\nHost: h\r\n\r\n",
            other("victim.example", "h"),
        ),
        (
            "h",
            "GET Http://victim.example/x HTTP/1.1\r\n\r\n",
            other("victim.example", "h"),
        ),
        (
            "h",
            "GET hTTpS://victim.example HTTP/1.1\r\n\r\n",
            other("victim.example", "h"),
        ),
        (
            "h",
            "GET https://h@victim.example/ HTTP/1.1\r\n\r\n",
            other("h@victim.example", "h"),
        ),
        (
            "h",
            "GET https://h#@victim.example/ HTTP/1.1\r\n\r\n",
            other("h#@victim.example", "h"),
        ),
        (
            "h",
            "GET https://h:8443/ HTTP/1.1\r\n\r\n",
            other("h:8443", "h"),
        ),
        (
            "h",
            "GET https://h:0443/ HTTP/1.1\r\n\r\n",
            other("h:0443", "h"),
        ),
        (
            "h:8443",
            "GET https://h/ HTTP/1.1\r\n\r\n",
            other("h", "h:8443"),
        ),
        (
            "h:8443",
            "GET https://h:8443:443/ HTTP/1.1\r\n\r\n",
            other("h:8443:443", "h:8443"),
        ),
        // Any other scheme, or a target that is no path: a server may
        // take a host from it all the same.
        (
            "h",
            "GET ws://victim.example/ HTTP/1.1\r\n\r\n",
            Refusal::Target("ws://victim.example/".into()),
        ),
        (
            "h",
            "GET x://victim.example/ HTTP/1.1\r\n\r\n",
            Refusal::Target("x://victim.example/".into()),
        ),
        (
            "h",
            "GET x://h/ HTTP/1.1\r\n\r\n",
            Refusal::Target("x://h/".into()),
        ),
        (
            "h",
            "GET victim.example:443 HTTP/1.1\r\n\r\n",
            Refusal::Target("victim.example:443".into()),
        ),
        (
            "h",
            "GET http:victim.example HTTP/1.1\r\n\r\n",
            Refusal::Target("http:victim.example".into()),
        ),
        ("h", "GET * HTTP/1.1\r\n\r\n", Refusal::Target("*".into())),
        ("h", "GET x HTTP/1.1\r\n\r\n", Refusal::Target("x".into())),
    ] {
        assert_eq!(through(tunnel, head), Err(refusal), "{head:?}");
    }
    // The tunnel's own host, in any case and scheme, with its port
    // or without it when that is 443; a path; `*` for OPTIONS.
    for (tunnel, head) in [
        ("h", "GET HTTPS://H/x HTTP/1.1\r\n\r\n"),
        ("h", "GET Http://h:443?q HTTP/1.1\r\n\r\n"),
        ("h:8443", "GET https://H:8443/x HTTP/1.1\r\n\r\n"),
        ("h", "OPTIONS * HTTP/1.1\r\n\r\n"),
        ("h", "GET /x HTTP/1.1\r\n\r\n"),
    ] {
        let out = through(tunnel, head).unwrap();
        let line = head.split("\r\n").next().unwrap();
        assert!(out.starts_with(line) && out.contains(SECRET_LINE), "{out}");
    }
}

#[test]
fn the_clients_connection_header_and_the_headers_it_names_are_not_forwarded() {
    let out = through(
        "h",
        "GET /a HTTP/1.1\r\nConnection: X-Hop, , keep-alive\r\nconnection: x-other\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Other: 2\r\nX-End: 3\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        out,
        "GET /a HTTP/1.1\r\nX-End: 3\r\nHost: h\r\nAuthorization: Bearer s3cret\r\nConnection: keep-alive\r\n\r\n"
    );
    // What the client asked of the connection stays: close wins.
    let out = through(
        "h",
        "GET /a HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n",
    )
    .unwrap();
    assert!(out.ends_with("\r\nConnection: close\r\n\r\n"), "{out}");
    assert_eq!(out.matches("Connection").count(), 1, "{out}");
    // An upgrade keeps its Upgrade header, under the proxy's Connection.
    let out = through(
        "h",
        "GET /ws HTTP/1.1\r\nConnection: Upgrade, X-Hop\r\nUpgrade: websocket\r\nX-Hop: 1\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        out,
        "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nHost: h\r\nAuthorization: Bearer s3cret\r\nConnection: upgrade\r\n\r\n"
    );
}

#[test]
fn a_connection_header_naming_framing_host_or_the_key_is_refused() {
    for (fields, refusal) in [
        (
            "Connection: Content-Length\r\nContent-Length: 5",
            Refusal::HopByHop("Content-Length".into()),
        ),
        (
            "Connection: close, transfer-encoding\r\nTransfer-Encoding: chunked",
            Refusal::HopByHop("transfer-encoding".into()),
        ),
        ("Connection: HOST", Refusal::HopByHop("HOST".into())),
        (
            "Connection: authorization",
            Refusal::HopByHop("authorization".into()),
        ),
        (
            "Connection: close\r\nConnection: Content-Length",
            Refusal::HopByHop("Content-Length".into()),
        ),
        (
            "Connection: close; x",
            Refusal::ConnectionList("close; x".into()),
        ),
        (
            "Connection: \"close\"",
            Refusal::ConnectionList("\"close\"".into()),
        ),
        (
            "Connection: Content Length",
            Refusal::ConnectionList("Content Length".into()),
        ),
    ] {
        let head = format!("POST /a HTTP/1.1\r\n{fields}\r\n\r\nhello");
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        assert_eq!(
            requests.feed(head.as_bytes(), &mut out),
            Err(refusal),
            "{head:?}"
        );
        assert!(out.is_empty(), "{head:?}");
    }
}

#[test]
fn a_body_on_a_get_head_or_options_is_refused_before_any_of_it_is_sent() {
    let smuggled = "POST /echo HTTP/1.1\r\nContent-Length: 60\r\n\r\n";
    for (method, framing, body) in [
        (
            "GET",
            format!("Content-Length: {}", smuggled.len()),
            smuggled.to_owned(),
        ),
        (
            "get",
            format!("Content-Length: {}", smuggled.len()),
            smuggled.to_owned(),
        ),
        ("HEAD", "Content-Length: 1".into(), "x".into()),
        (
            "OPTIONS",
            "Transfer-Encoding: chunked".into(),
            "0\r\n\r\n".into(),
        ),
        (
            "GET",
            "Transfer-Encoding: chunked".into(),
            format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len()),
        ),
    ] {
        let stream =
            format!("{method} /x HTTP/1.1\r\n{framing}\r\n\r\n{body}GET /next HTTP/1.1\r\n\r\n");
        let mut requests = Requests::new("h".into(), token());
        let mut out = Vec::new();
        assert_eq!(
            requests.feed(stream.as_bytes(), &mut out),
            Err(Refusal::BodyOnMethod(method.into())),
            "{stream:?}"
        );
        assert!(out.is_empty(), "{stream:?}");
    }
    // An empty Content-Length is no body; POST's body is followed.
    let out = through(
        "h",
        "GET /a HTTP/1.1\r\nContent-Length: 0\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
    )
    .unwrap();
    assert_eq!(out.matches(SECRET_LINE).count(), 2, "{out}");
    assert!(out.ends_with("\r\n\r\nhi"), "{out}");
}
