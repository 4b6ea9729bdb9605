//! Plain-HTTP requests in absolute form.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::support::*;

#[test]
fn an_absolute_form_request_is_forwarded_in_origin_form_without_proxy_headers() {
    let server = upstream(Kind::Http);
    let served = serve(settings(), r#"{"allow":["allowed.test","127.0.0.0/8"]}"#);
    let mut stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "POST http://allowed.test:{}/submit?x=1 HTTP/1.1\r\nHost: allowed.test\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nContent-Length: 5\r\n\r\nhello",
        server.port
    )
    .unwrap();
    let response = read_response(&mut stream);
    assert_eq!(response.status, 200);
    let heads = server.heads();
    assert_eq!(heads.len(), 1);
    let head = &heads[0].1;
    assert!(head.starts_with("POST /submit?x=1 HTTP/1.1\r\n"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
    assert!(response.text().ends_with("hello"));
    // Each plain request is a connection of its own.
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    drop(stream);
    served.wait_for("the bytes", |r| {
        r.totals().bytes_in > 0 && r.attempts().0.count() == 1
    });
    let attempt = &served.attempts()[0];
    assert!(attempt.allowed);
    assert_eq!(
        attempt.bytes_in,
        response.head.len() as u64 + response.body.len() as u64
    );
}

#[test]
fn a_plain_request_to_a_denied_host_is_refused() {
    let served = serve(
        settings(),
        r#"{"allow":["allowed.test","127.0.0.0/8"],"deny":["denied.test"]}"#,
    );
    let mut stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"
    )
    .unwrap();
    let response = read_response(&mut stream);
    assert_eq!(response.status, 403);
    assert!(response.text().contains("denied.test:80 is denied"));
}

#[test]
fn bad_heads_get_their_status() {
    let served = serve(settings(), r#"{"allow":["*"]}"#);
    for (head, status) in [
        ("GET /relative HTTP/1.1\r\n\r\n".to_owned(), 400),
        ("GET http://a.test/ HTTP/2\r\n\r\n".to_owned(), 505),
        (
            format!(
                "GET http://a.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
                "a".repeat(20_000)
            ),
            431,
        ),
    ] {
        let mut stream = TcpStream::connect(served.address).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let _ = stream.write_all(head.as_bytes());
        let response = read_response(&mut stream);
        assert_eq!(response.status, status, "{}", &head[..30]);
    }
}

#[test]
fn a_plain_request_to_an_ipv6_literal_without_a_host_header_gets_one() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let server = upstream_on("[::1]:0", Kind::Http);
    let served = serve(settings(), r#"{"allow":["[::1]"]}"#);
    let mut stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "GET http://[::1]:{}/v6 HTTP/1.0\r\n\r\n",
        server.port
    )
    .unwrap();
    let response = read_response(&mut stream);
    assert_eq!(response.status, 200);
    let head = &server.heads()[0].1;
    assert!(head.starts_with("GET /v6 HTTP/1.0\r\n"), "{head}");
    assert!(
        head.contains(&format!("Host: [::1]:{}\r\n", server.port)),
        "{head}"
    );
}

#[test]
fn a_plain_urls_scheme_is_read_in_any_case_and_only_http_goes_to_the_host_it_names() {
    let server = upstream(Kind::Http);
    let served = serve(
        settings(),
        r#"{"allow":["allowed.test","127.0.0.0/8"],"deny":["denied.test"]}"#,
    );
    let ask = |target: String| {
        let mut stream = TcpStream::connect(served.address).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        write!(stream, "GET {target} HTTP/1.1\r\nHost: denied.test\r\n\r\n").unwrap();
        read_response(&mut stream)
    };
    let response = ask(format!("HTTP://Allowed.test:{}/x", server.port));
    assert_eq!(response.status, 200, "{}", response.text());
    let head = &server.heads()[0].1;
    assert!(head.starts_with("GET /x HTTP/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nHost: allowed.test:{}\r\n", server.port)),
        "{head}"
    );
    assert!(!head.contains("denied"), "{head}");
    assert_eq!(ask("Http://denied.test/".into()).status, 403);
    let https = ask(format!("HTTPS://allowed.test:{}/", server.port));
    assert_eq!(https.status, 400);
    assert!(https.text().contains("through CONNECT"), "{}", https.text());
    assert_eq!(ask("x://allowed.test/".into()).status, 400);
    assert_eq!(server.heads().len(), 1);
}
