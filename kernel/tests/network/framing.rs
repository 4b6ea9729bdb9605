//! Request framing against a lenient server (one that, like many real
//! ones, takes a bare LF as a line's end and answers pipelined requests):
//! a head the proxy would read differently from such a server is refused
//! before a byte of it is sent, so the credential cannot be smuggled into
//! what the server reads as a body, and nothing after a plain request's
//! framed body reaches the server.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use agentos_egress::proxy::{Credential, ProxySettings};
use rustls::{ClientConnection, StreamOwned};

use crate::support::*;

const SECRET: &str = "Bearer smuggled-key-4567";
const POLICY: &str = r#"{"allow":["cred.test","allowed.test","127.0.0.0/8"]}"#;
/// A request for another host, pipelined behind the one the proxy decided on.
const NEXT: &str = "GET /second HTTP/1.1\r\nHost: other.test\r\n\r\n";

fn with_key() -> ProxySettings {
    ProxySettings {
        credentials: vec![Credential {
            host: "cred.test".into(),
            header: "Authorization".into(),
            value: SECRET.into(),
        }],
        ..settings()
    }
}

/// An intercepted tunnel to the credential host's server on `port`.
fn intercepted(served: &Served, port: u16) -> StreamOwned<ClientConnection, TcpStream> {
    let (stream, status, _) = connect(served.address, &format!("cred.test:{port}"));
    assert_eq!(status, 200);
    tls(stream, "cred.test", served.proxy.ca_certificate_pem())
}

/// A connection to the proxy for plain HTTP.
fn plain(served: &Served) -> TcpStream {
    let stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
}

/// Sends `text` in one write, as clients send a request: a refusal can
/// come (and the connection close) before a later write.
fn send(stream: &mut impl Write, text: &str) {
    stream.write_all(text.as_bytes()).unwrap();
}

/// The key never came back, and the proxy answered 400 saying `why`.
fn refused_without_the_key(response: &Response, why: &str) {
    assert!(
        !response.text().contains(SECRET),
        "the key came back in a body: {:?}",
        response.text()
    );
    assert_eq!(response.status, 400, "{}{}", response.head, response.text());
    assert!(
        response.head.contains("X-AgentOS-Refused: ") && response.text().contains(why),
        "{why:?}: {}{}",
        response.head,
        response.text()
    );
}

/// The proxy's next head after `first` as the server reads it, with the
/// key: what a server that ends `first`'s body early reads as a body.
fn keyed_next(port: u16) -> String {
    format!("GET /next HTTP/1.1\r\nHost: cred.test:{port}\r\nAuthorization: {SECRET}\r\n\r\n")
}

/// A request that, to a server reading it as one, is an echo whose body
/// is the proxy's next head, keyed.
fn echo_of_keyed_next(port: u16) -> String {
    format!(
        "POST /echo HTTP/1.1\r\nHost: cred.test\r\nContent-Length: {}\r\n\r\n",
        keyed_next(port).len()
    )
}

/// Everything the tunnel answered was one 400 saying `why`, and never the
/// key.
fn answered_400_without_the_key(answers: &str, why: &str) {
    assert!(!answers.contains(SECRET), "the key came back: {answers}");
    assert!(
        answers.starts_with("HTTP/1.1 400 ") && answers.contains(why),
        "{why:?}: {answers}"
    );
}

#[test]
fn a_content_length_hidden_behind_a_bare_lf_cannot_carry_the_key_into_a_body() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    // The second head as the proxy gives it the key: a server that honours
    // the hidden Content-Length reads it as the first request's body.
    let smuggled = keyed_next(server.port);
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: cred.test\r\nX-A: 1\nContent-Length: {}\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
        smuggled.len()
    );
    send(&mut tls, &request);
    let response = read_response(&mut tls);
    refused_without_the_key(&response, "bare LF");
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
    let attempt = &served.attempts()[0];
    assert!(!attempt.allowed);
    assert!(
        attempt
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("bare LF")),
        "{attempt:?}"
    );
}

#[test]
fn a_bare_lf_in_the_request_line_cannot_carry_the_key_into_a_body() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    let smuggled = keyed_next(server.port);
    let request = format!(
        "POST /echo HTTP/1.1\nContent-Length: {}\r\nHost: cred.test\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
        smuggled.len()
    );
    send(&mut tls, &request);
    let response = read_response(&mut tls);
    refused_without_the_key(&response, "bare LF");
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

#[test]
fn a_transfer_encoding_hidden_behind_a_bare_lf_cannot_carry_the_key_into_a_body() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    // A "head" that is a chunk-size line: the lines the proxy adds to it
    // are that chunk's data for a server that saw the hidden chunked.
    let data = format!(
        "Host: cred.test:{}\r\nAuthorization: {SECRET}\r\n",
        server.port
    );
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: cred.test\r\nX-A: 1\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n\r\n0\r\n\r\n",
        data.len()
    );
    send(&mut tls, &request);
    let response = read_response(&mut tls);
    refused_without_the_key(&response, "bare LF");
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

#[test]
fn a_head_hiding_a_content_length_after_an_answered_request_is_refused_on_the_same_tunnel() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    send(&mut tls, "GET /one HTTP/1.1\r\nHost: cred.test\r\n\r\n");
    assert_eq!(read_response(&mut tls).status, 200);
    let smuggled = keyed_next(server.port);
    send(
        &mut tls,
        &format!(
            "POST /echo HTTP/1.1\r\nX-A: 1\nContent-Length: {}\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
            smuggled.len()
        ),
    );
    let response = read_response(&mut tls);
    refused_without_the_key(&response, "bare LF");
    assert_eq!(server.heads().len(), 1, "{:?}", server.heads());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

/// Requests no two parsers may read alike, each with a body and a request
/// for another host behind it, as `target` and `host` name the first:
/// the request and what the proxy's refusal says. The last two are
/// refused on their bodies, not their heads.
fn malformed(target: &str, host: &str) -> Vec<(String, &'static str)> {
    let chunked = "5\r\nhello\r\n0\r\n\r\n";
    let with = |version: &str, fields: &str, body: &str| {
        format!("POST {target} {version}\r\nHost: {host}\r\n{fields}\r\n\r\n{body}{NEXT}")
    };
    vec![
        (
            with("HTTP/1.1", "X-A: 1\nContent-Length: 5", "hello"),
            "bare LF",
        ),
        (
            format!("POST {target} HTTP/1.1\nContent-Length: 5\r\nHost: {host}\r\n\r\nhello{NEXT}"),
            "bare LF",
        ),
        (
            with("HTTP/1.1", "X-A: 1\rContent-Length: 5", "hello"),
            "bare CR",
        ),
        (
            with("HTTP/1.1", "X-A: 1\r\n Content-Length: 5", "hello"),
            "obs-fold",
        ),
        (
            with(
                "HTTP/1.1",
                "Transfer-Encoding: chunked\r\nContent-Length: 5",
                chunked,
            ),
            "both Transfer-Encoding and Content-Length",
        ),
        (
            with(
                "HTTP/1.1",
                "Content-Length: 5\r\nContent-Length: 5",
                "hello",
            ),
            "more than one Content-Length",
        ),
        (
            with("HTTP/1.1", "Content-Length: 5, 5", "hello"),
            "Content-Length \"5, 5\"",
        ),
        (
            with("HTTP/1.1", "Content-Length: +5", "hello"),
            "Content-Length \"+5\"",
        ),
        (
            with("HTTP/1.1", "Content-Length : 5", "hello"),
            "before a header's colon",
        ),
        (
            with("HTTP/1.1", "Transfer-Encoding: chunked, identity", chunked),
            "Transfer-Encoding \"chunked, identity\"",
        ),
        (
            with(
                "HTTP/1.1",
                "Transfer-Encoding: gzip\r\nContent-Length: 5",
                "hello",
            ),
            "both Transfer-Encoding and Content-Length",
        ),
        (
            with("HTTP/1.1", "Transfer-Encoding: gzip", "hello"),
            "Transfer-Encoding \"gzip\"",
        ),
        (
            with(
                "HTTP/1.1",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
                chunked,
            ),
            "more than one Transfer-Encoding",
        ),
        (
            with("HTTP/1.0", "Transfer-Encoding: chunked", chunked),
            "HTTP/1.0",
        ),
        (
            with("HTTP/1.1", "X-A: 1\0\r\nContent-Length: 5", "hello"),
            "NUL",
        ),
        (format!("GET {target}\r\n\r\n{NEXT}"), "HTTP/0.9"),
        (
            with(
                "HTTP/1.1",
                "Transfer-Encoding: chunked",
                "5\nhello\r\n0\r\n\r\n",
            ),
            "chunk-size line ended by a bare LF",
        ),
        (
            with(
                "HTTP/1.1",
                "Transfer-Encoding: chunked",
                "5;a=\"b\"\r\nhello\r\n0\r\n\r\n",
            ),
            "chunk extension",
        ),
    ]
}

#[test]
fn every_malformed_head_or_chunk_in_an_intercepted_tunnel_is_answered_400_and_never_carries_the_key(
) {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let requests = malformed("/x", "cred.test");
    let refused_on_heads = requests.len() - 2;
    for (number, (request, why)) in requests.iter().enumerate() {
        let mut tls = intercepted(&served, server.port);
        tls.write_all(request.as_bytes()).unwrap();
        let response = read_response(&mut tls);
        refused_without_the_key(&response, why);
        let heads = server.heads();
        if number < refused_on_heads {
            assert!(heads.is_empty(), "{request:?}: {heads:?}");
        }
        assert!(
            heads.iter().all(|(_, head)| !head.contains("other.test")),
            "{request:?}: {heads:?}"
        );
    }
    served.wait_for("every refusal", |r| {
        r.totals().refused == requests.len() as u64
    });
}

#[test]
fn every_malformed_plain_head_or_chunk_is_answered_400_recorded_and_never_reaches_the_server() {
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    let target = format!("http://allowed.test:{}/x", server.port);
    let requests = malformed(&target, "allowed.test");
    let refused_on_heads = requests.len() - 2;
    for (number, (request, why)) in requests.iter().enumerate() {
        let mut stream = plain(&served);
        stream.write_all(request.as_bytes()).unwrap();
        let response = read_response(&mut stream);
        assert_eq!(
            response.status,
            400,
            "{request:?}: {}{}",
            response.head,
            response.text()
        );
        assert!(
            response.text().contains(why),
            "{why:?}: {}",
            response.text()
        );
        let heads = server.heads();
        if number < refused_on_heads {
            assert!(heads.is_empty(), "{request:?}: {heads:?}");
        }
        assert!(
            heads.iter().all(|(_, head)| !head.contains("other.test")),
            "{request:?}: {heads:?}"
        );
    }
    served.wait_for("every refusal", |r| {
        r.totals().refused == requests.len() as u64
    });
    assert!(served
        .attempts()
        .iter()
        .all(|a| !a.allowed && a.reason.is_some()));
}

#[test]
fn a_chunked_request_in_a_tunnel_is_followed_and_the_next_request_gets_the_key() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    send(&mut tls, "POST /up HTTP/1.1\r\nHost: cred.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    let first = read_response(&mut tls);
    assert_eq!((first.status, first.text().as_str()), (200, "hello"));
    send(&mut tls, "GET /then HTTP/1.1\r\nHost: cred.test\r\n\r\n");
    let second = read_response(&mut tls);
    assert_eq!(second.status, 200);
    let heads = server.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for (_, head) in &heads {
        assert!(
            head.contains(&format!("\r\nAuthorization: {SECRET}\r\n")),
            "{head}"
        );
    }
}

#[test]
fn a_request_pipelined_behind_a_plain_request_never_reaches_the_server() {
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    let bodies = [
        ("", ""),
        ("Content-Length: 5\r\n", "hello"),
        ("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
    ];
    for (framing, body) in bodies {
        let mut stream = plain(&served);
        let request = format!(
            "POST http://allowed.test:{}/first HTTP/1.1\r\nHost: allowed.test\r\n{framing}\r\n{body}{NEXT}",
            server.port
        );
        send(&mut stream, &request);
        let response = read_response(&mut stream);
        assert_eq!(response.status, 200, "{framing}");
        let expected = if body.is_empty() { "" } else { "hello" };
        assert_eq!(response.text(), expected, "{framing}");
        // The client is done: whatever else the server answers comes now.
        stream.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "{framing}: {:?}",
            String::from_utf8_lossy(&rest)
        );
    }
    let heads = server.heads();
    assert_eq!(heads.len(), bodies.len(), "{heads:?}");
    assert!(
        heads.iter().all(|(_, head)| !head.contains("other.test")),
        "{heads:?}"
    );
}

#[test]
fn a_plain_get_carrying_a_body_for_another_host_is_refused_before_any_of_it_is_sent() {
    // A server that ignores a GET's body reads it as a request of its own:
    // here, one for another host, which the proxy never decided on.
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    for method in ["GET", "HEAD", "OPTIONS"] {
        let mut stream = plain(&served);
        let request = format!(
            "{method} http://allowed.test:{}/first HTTP/1.1\r\nHost: allowed.test\r\n\
             Content-Length: {}\r\n\r\n{NEXT}",
            server.port,
            NEXT.len()
        );
        send(&mut stream, &request);
        let response = read_response(&mut stream);
        assert_eq!(response.status, 400, "{method}: {}", response.text());
        assert!(response.text().contains("send it with POST"), "{method}");
    }
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    served.wait_for("the refusals", |r| r.totals().refused == 3);
}

#[test]
fn a_request_sent_after_a_plain_requests_response_never_reaches_the_server() {
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    let mut stream = plain(&served);
    let request = format!(
        "POST http://allowed.test:{}/first HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhel",
        server.port
    );
    send(&mut stream, &request);
    std::thread::sleep(std::time::Duration::from_millis(50));
    stream.write_all(b"lo").unwrap();
    let response = read_response(&mut stream);
    assert_eq!((response.status, response.text().as_str()), (200, "hello"));
    stream.write_all(NEXT.as_bytes()).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    let heads = server.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
}

#[test]
fn a_keep_alive_hidden_behind_a_bare_lf_cannot_carry_a_request_for_another_host() {
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    let mut stream = plain(&served);
    let request = format!(
        "GET http://allowed.test:{}/ HTTP/1.1\r\nHost: allowed.test\r\nX-A: 1\nConnection: keep-alive\r\n\r\n{NEXT}",
        server.port
    );
    send(&mut stream, &request);
    let response = read_response(&mut stream);
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    assert_eq!(response.status, 400, "{}{}", response.head, response.text());
    assert!(response.text().contains("bare LF"), "{}", response.text());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

#[test]
fn a_malformed_chunk_after_the_head_went_on_is_answered_400_and_nothing_after_it_is_sent() {
    let server = upstream(Kind::Lenient);
    let served = serve(settings(), POLICY);
    let mut stream = plain(&served);
    let request = format!(
        "POST http://allowed.test:{}/up HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        server.port
    );
    send(&mut stream, &request);
    let until = std::time::Instant::now() + WAIT;
    while server.heads().is_empty() {
        assert!(std::time::Instant::now() < until, "the head never went on");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // A lenient server ends the body here and reads the next request.
    send(&mut stream, &format!("3\nabc\r\n0\r\n\r\n{NEXT}"));
    let response = read_response(&mut stream);
    assert_eq!(response.status, 400, "{}{}", response.head, response.text());
    assert!(
        response
            .text()
            .contains("a chunk-size line ended by a bare LF"),
        "{}",
        response.text()
    );
    served.wait_for("the refusal", |r| r.totals().refused == 1);
    let attempt = &served.attempts()[0];
    assert!(!attempt.allowed, "{attempt:?}");
    let heads = server.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
}

/// Everything the tunnel brings back until it ends, or is quiet for a
/// second: every answer, the proxy's or the server's.
fn everything(tls: &mut StreamOwned<ClientConnection, TcpStream>) -> String {
    tls.sock
        .set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .unwrap();
    let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
    while let Ok(n @ 1..) = tls.read(&mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn a_url_for_another_host_in_any_scheme_or_case_never_carries_the_key_there() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let port = server.port;
    let targets = [
        (
            "HTTPS://other.test/x".to_owned(),
            "a request for other.test ",
        ),
        ("Http://other.test/x".into(), "a request for other.test "),
        (
            format!("hTtPs://other.test:{port}/x"),
            "a request for other.test:",
        ),
        (
            "x://other.test/".into(),
            "\"x://other.test/\" is not a path",
        ),
        (
            "ws://other.test/".into(),
            "\"ws://other.test/\" is not a path",
        ),
    ];
    for (target, why) in &targets {
        let mut tls = intercepted(&served, port);
        send(
            &mut tls,
            &format!("GET {target} HTTP/1.1\r\nHost: cred.test\r\n\r\n"),
        );
        let response = read_response(&mut tls);
        // A server takes the host from the URL, not from Host.
        let heads = server.heads();
        assert!(heads.is_empty(), "the key went to {target}: {heads:?}");
        refused_without_the_key(&response, why);
    }
    served.wait_for("every refusal", |r| {
        r.totals().refused == targets.len() as u64
    });
    // The tunnel's own host, its scheme in any case, still gets the key.
    let mut tls = intercepted(&served, port);
    send(
        &mut tls,
        &format!("GET HTTPS://CRED.test:{port}/own HTTP/1.1\r\n\r\n"),
    );
    assert_eq!(read_response(&mut tls).status, 200);
    let heads = server.heads();
    assert!(heads[0].1.contains(SECRET), "{heads:?}");
}

#[test]
fn a_connection_header_naming_content_length_cannot_carry_the_key_into_a_body() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    // A hop that honours `Connection` drops the Content-Length: the body
    // is a request to it, whose body is the proxy's next head, keyed.
    let inner = echo_of_keyed_next(server.port);
    send(
        &mut tls,
        &format!(
            "POST /a HTTP/1.1\r\nHost: cred.test\r\nConnection: Content-Length\r\nContent-Length: {}\r\n\r\n{inner}GET /next HTTP/1.1\r\nHost: cred.test\r\n\r\n",
            inner.len()
        ),
    );
    answered_400_without_the_key(&everything(&mut tls), "Connection names Content-Length");
    assert!(server.heads().is_empty(), "{:?}", server.heads());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

#[test]
fn a_body_on_a_get_or_options_cannot_carry_the_key_into_a_body() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    for method in ["GET", "OPTIONS"] {
        let mut tls = intercepted(&served, server.port);
        // A server that ignores the body reads it as a request, whose
        // body is the proxy's next head, keyed.
        let inner = echo_of_keyed_next(server.port);
        send(
            &mut tls,
            &format!(
                "{method} /a HTTP/1.1\r\nHost: cred.test\r\nContent-Length: {}\r\n\r\n{inner}GET /next HTTP/1.1\r\nHost: cred.test\r\n\r\n",
                inner.len()
            ),
        );
        let why = format!("a {method} request with a body");
        answered_400_without_the_key(&everything(&mut tls), &why);
        assert!(server.heads().is_empty(), "{:?}", server.heads());
    }
    served.wait_for("the refusals", |r| r.totals().refused == 2);
}

#[test]
fn the_clients_connection_header_and_the_headers_it_names_never_reach_the_server() {
    let server = upstream(Kind::LenientTls);
    let served = serve(with_key(), POLICY);
    let mut tls = intercepted(&served, server.port);
    send(
        &mut tls,
        "POST /a HTTP/1.1\r\nHost: cred.test\r\nConnection: X-Hop, close\r\nX-Hop: 1\r\nX-Kept: 2\r\nContent-Length: 5\r\n\r\nhello",
    );
    let response = read_response(&mut tls);
    assert_eq!((response.status, response.text().as_str()), (200, "hello"));
    let heads = server.heads();
    let head = &heads[0].1;
    assert!(!head.contains("X-Hop"), "{head}");
    assert!(head.contains("\r\nX-Kept: 2\r\n"), "{head}");
    assert!(head.contains(SECRET), "{head}");
    // What the client asked of the connection, in the proxy's own words.
    assert_eq!(head.matches("Connection:").count(), 1, "{head}");
    assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
}
