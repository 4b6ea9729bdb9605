//! Hosts with a credential: their TLS is intercepted and every request
//! gets the header; no other host's is.

use std::io::{Read, Write};
use std::net::TcpStream;

use agentos_egress::proxy::{Credential, ProxySettings};

use crate::support::*;

const SECRET: &str = "Bearer not-for-the-sandbox-0123";
const POLICY: &str = r#"{"allow":["cred.test","allowed.test","127.0.0.0/8"]}"#;

fn with_credential() -> ProxySettings {
    ProxySettings {
        credentials: vec![Credential {
            host: "CRED.test".into(),
            header: "Authorization".into(),
            value: SECRET.into(),
        }],
        ..settings()
    }
}

#[test]
fn a_credential_is_added_to_every_request_inside_intercepted_tls() {
    let server = upstream(Kind::Https);
    let served = serve(with_credential(), POLICY);
    assert!(served.proxy.intercepts());
    let ca = served.proxy.ca_certificate_pem().to_owned();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    let (stream, status, _) = connect(served.address, &format!("cred.test:{}", server.port));
    assert_eq!(status, 200);
    // Verified against the proxy's CA only.
    let mut tls = tls(stream, "cred.test", &ca);
    write!(tls, "GET /one HTTP/1.1\r\nHost: cred.test\r\n\r\n").unwrap();
    let first = read_response(&mut tls);
    write!(
        tls,
        "POST /two HTTP/1.1\r\nHost: cred.test\r\nauthorization: Basic c2FuZGJveA==\r\nContent-Length: 4\r\n\r\nbody"
    )
    .unwrap();
    let second = read_response(&mut tls);
    assert_eq!((first.status, second.status), (200, 200));
    assert_ne!(tls.conn.peer_certificates().unwrap()[0], test_ca().leaf_der);

    let heads = server.heads();
    assert_eq!(heads.len(), 2);
    assert_eq!(
        heads[0].0, heads[1].0,
        "two requests on one upstream connection"
    );
    for (_, head) in &heads {
        let lines: Vec<&str> = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("authorization"))
            .collect();
        assert_eq!(
            lines,
            vec![format!("Authorization: {SECRET}").as_str()],
            "{head}"
        );
    }
    assert!(second.text().ends_with("body"));
    drop(tls);

    served.wait_for("the end", |r| r.totals().bytes_in > 0);
    let attempts = served.attempts();
    assert!(attempts[0].allowed);
    let shown = format!("{attempts:?} {:?} {:?}", served.proxy, with_credential());
    assert!(!shown.contains("not-for-the-sandbox"), "{shown}");
}

#[test]
fn a_host_without_a_credential_is_not_intercepted() {
    let server = upstream(Kind::Https);
    let served = serve(with_credential(), POLICY);
    let (stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    let mut tls = tls(stream, "allowed.test", &test_ca().pem);
    write!(tls, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n").unwrap();
    let response = read_response(&mut tls);
    assert_eq!(response.status, 200);
    assert_eq!(tls.conn.peer_certificates().unwrap()[0], test_ca().leaf_der);
    assert!(!server.heads()[0].1.contains(SECRET));
}

#[test]
fn a_plain_request_never_carries_the_credential_and_names_its_own_host() {
    let server = upstream(Kind::Http);
    let served = serve(with_credential(), POLICY);
    let mut stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    // A Host naming another site behind the same address (a CDN's shared
    // edge routes by it) must not reach the server, and the key goes only
    // inside TLS the proxy verified, never in the clear.
    write!(
        stream,
        "GET http://cred.test:{}/x HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
        server.port
    )
    .unwrap();
    let response = read_response(&mut stream);
    assert_eq!(response.status, 200);
    let head = &server.heads()[0].1;
    assert!(!head.contains(SECRET), "{head}");
    assert!(
        head.contains(&format!("Host: cred.test:{}\r\n", server.port)),
        "{head}"
    );
    assert!(!head.contains("attacker"), "{head}");
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
}

#[test]
fn an_upstream_that_fails_verification_is_not_reached() {
    // The proxy trusts the public roots only: the test CA's server fails.
    let server = upstream(Kind::Https);
    let served = serve(
        ProxySettings {
            extra_roots_pem: Vec::new(),
            ..with_credential()
        },
        POLICY,
    );
    let ca = served.proxy.ca_certificate_pem().to_owned();
    let (stream, status, _) = connect(served.address, &format!("cred.test:{}", server.port));
    assert_eq!(status, 200);
    let mut tls = tls(stream, "cred.test", &ca);
    let _ = write!(tls, "GET / HTTP/1.1\r\nHost: cred.test\r\n\r\n");
    let mut buf = [0u8; 16];
    assert!(!matches!(tls.read(&mut buf), Ok(n) if n > 0));
    assert!(server.heads().is_empty());
    served.wait_for("the failure", |r| {
        r.attempts().0.any(|a| a.reason.is_some())
    });
}

#[test]
fn a_client_hello_sent_with_the_connect_head_is_not_lost() {
    let server = upstream(Kind::Https);
    let served = serve(with_credential(), POLICY);
    let ca = served.proxy.ca_certificate_pem().to_owned();
    for host in ["cred.test", "allowed.test"] {
        let mut stream = TcpStream::connect(served.address).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let trust = if host == "cred.test" {
            &ca
        } else {
            &test_ca().pem
        };
        let mut tls = tls(stream.try_clone().unwrap(), host, trust);
        // The CONNECT head and the ClientHello in one write.
        let mut first = format!("CONNECT {host}:{} HTTP/1.1\r\n\r\n", server.port).into_bytes();
        tls.conn.write_tls(&mut first).unwrap();
        stream.write_all(&first).unwrap();
        let (status, _) = read_head(&mut stream);
        assert_eq!(status, 200, "{host}");
        write!(tls, "GET /early HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
        let response = read_response(&mut tls);
        assert_eq!(response.status, 200, "{host}");
        assert!(response.text().starts_with("GET /early"), "{host}");
    }
}

#[test]
fn an_intercepted_tunnel_without_a_handshake_is_closed_at_the_timeout() {
    let server = upstream(Kind::Https);
    let served = serve(
        ProxySettings {
            head_timeout: std::time::Duration::from_millis(300),
            ..with_credential()
        },
        POLICY,
    );
    let (mut stream, status, _) = connect(served.address, &format!("cred.test:{}", server.port));
    assert_eq!(status, 200);
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty());
    served.wait_for("the reason", |r| {
        r.attempts()
            .0
            .any(|a| a.reason.as_deref() == Some("no TLS handshake within 300 ms"))
    });
}
