//! CONNECT tunnels: who gets one, what is checked in it, what is counted.

use std::io::{Read, Write};
use std::net::Shutdown;

use crate::support::*;

const LOOPBACK_POLICY: &str = r#"{"allow":["allowed.test","127.0.0.0/8"],"deny":["denied.test"]}"#;

#[test]
fn an_allowed_host_is_tunnelled_and_its_tls_is_the_servers_own() {
    let server = upstream(Kind::Https);
    let served = serve(settings(), LOOPBACK_POLICY);
    let target = format!("allowed.test:{}", server.port);
    let (stream, status, _) = connect(served.address, &target);
    assert_eq!(status, 200);
    // Trusting the test CA alone: an intercepted tunnel would fail here.
    let mut tls = tls(stream, "allowed.test", &test_ca().pem);
    write!(tls, "GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n").unwrap();
    let response = read_response(&mut tls);
    assert_eq!(response.status, 200);
    assert!(response.text().starts_with("GET /hello HTTP/1.1"));
    let seen = tls.conn.peer_certificates().unwrap()[0].clone();
    assert_eq!(seen, test_ca().leaf_der);
    drop(tls);
    served.wait_for("the tunnel's end", |r| r.totals().bytes_in > 0);
    let attempts = served.attempts();
    assert_eq!(attempts.len(), 1);
    assert!(attempts[0].allowed);
    assert_eq!(attempts[0].host, "allowed.test");
    assert_eq!(attempts[0].port, server.port);
    assert_eq!(attempts[0].address.as_deref(), Some("127.0.0.1"));
}

#[test]
fn a_denied_host_is_refused_with_403_and_its_reason_and_recorded() {
    let served = serve(settings(), LOOPBACK_POLICY);
    let (mut stream, status, head) = connect(served.address, "denied.test:443");
    assert_eq!(status, 403);
    // In the record before the client hears.
    assert_eq!(served.totals().refused, 1);
    assert!(
        head.contains("X-AgentOS-Refused: denied.test:443 is denied"),
        "{head}"
    );
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("denied.test:443 is denied by the policy's \"denied.test\""),
        "{rest}"
    );
    let (_, status, head) = connect(served.address, "public.test:443");
    assert_eq!(status, 403);
    assert!(head.contains("not in the policy's allow list"), "{head}");
    served.wait_for("two refusals", |r| r.totals().refused == 2);
    let attempts = served.attempts();
    assert!(attempts.iter().all(|a| !a.allowed && a.reason.is_some()));
    assert_eq!(attempts[0].host, "denied.test");
    // A name no entry allows is refused before it is looked up.
    assert_eq!(attempts[1].address, None);
}

#[test]
fn a_tls_server_name_other_than_the_connect_host_is_refused() {
    let server = upstream(Kind::Https);
    let served = serve(settings(), LOOPBACK_POLICY);
    let (stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    // Domain fronting: a tunnel for allowed.test carrying TLS for another.
    let mut tls = tls(stream, "other.test", &test_ca().pem);
    let sent = write!(tls, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n").and_then(|()| tls.flush());
    let mut buf = [0u8; 64];
    let read = tls.read(&mut buf);
    assert!(sent.is_err() || !matches!(read, Ok(n) if n > 0), "{read:?}");
    served.wait_for("the refusal", |r| r.totals().refused == 1);
    let attempt = &served.attempts()[0];
    assert_eq!(
        attempt.reason.as_deref(),
        Some("TLS server name other.test does not match CONNECT host allowed.test")
    );
    assert!(server.heads().is_empty());
}

#[test]
fn a_name_connect_without_a_server_name_is_refused_but_an_ip_literal_may_have_none() {
    let server = upstream(Kind::Echo);
    let served = serve(settings(), LOOPBACK_POLICY);
    // A ClientHello without the server_name extension.
    let hello = client_hello_without_sni();
    let (mut stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    stream.write_all(&hello).unwrap();
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    assert!(buf.is_empty());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
    assert!(served.attempts()[0]
        .reason
        .as_deref()
        .unwrap()
        .contains("without a server name"));

    let (mut stream, status, _) = connect(served.address, &format!("127.0.0.1:{}", server.port));
    assert_eq!(status, 200);
    stream.write_all(&hello).unwrap();
    let mut echoed = vec![0; hello.len()];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, hello);
}

/// The smallest well-formed ClientHello: no extensions at all.
fn client_hello_without_sni() -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([7u8; 32]); // random
    body.push(0); // session id
    body.extend([0, 2, 0x13, 0x01]); // one cipher suite
    body.extend([1, 0]); // null compression
    body.extend([0, 0]); // no extensions
    let mut handshake = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
    handshake.extend(body);
    let mut record = vec![
        0x16,
        3,
        1,
        (handshake.len() >> 8) as u8,
        handshake.len() as u8,
    ];
    record.extend(handshake);
    record
}

#[test]
fn ip_literals_in_special_ranges_are_refused_unless_named() {
    let served = serve(settings(), r#"{"allow":["*"]}"#);
    for (target, kind) in [
        ("10.0.0.1:443", "private"),
        ("169.254.169.254:80", "link-local"),
        ("127.0.0.1:22", "loopback"),
        ("[::1]:443", "loopback"),
        ("[fd00::1]:443", "unique-local"),
    ] {
        let (_, status, head) = connect(served.address, target);
        assert_eq!(status, 403, "{target}");
        assert!(head.contains(kind), "{target}: {head}");
    }
    served.wait_for("five refusals", |r| r.totals().refused == 5);
    assert_eq!(served.totals().allowed, 0);
}

#[test]
fn names_resolving_to_loopback_or_metadata_are_refused_unless_their_range_is_named() {
    let served = serve(settings(), r#"{"allow":["sneaky.test","meta.test"]}"#);
    let (_, status, head) = connect(served.address, "sneaky.test:80");
    assert_eq!(status, 403);
    assert!(
        head.contains("resolves to 127.0.0.1, a loopback address"),
        "{head}"
    );
    let (_, status, head) = connect(served.address, "meta.test:80");
    assert_eq!(status, 403);
    assert!(head.contains("169.254.169.254"), "{head}");
    served.wait_for("two refusals", |r| r.totals().refused == 2);
    let attempts = served.attempts();
    assert_eq!(attempts[1].address.as_deref(), Some("169.254.169.254"));
}

#[test]
fn ipv6_literals_are_tunnelled_when_their_range_is_named() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let server = upstream_on("[::1]:0", Kind::Echo);
    let served = serve(settings(), r#"{"allow":["[::1]"]}"#);
    let (mut stream, status, _) = connect(served.address, &format!("[::1]:{}", server.port));
    assert_eq!(status, 200);
    stream.write_all(b"ping").unwrap();
    let mut echoed = [0u8; 4];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"ping");
    let attempts = served.attempts();
    assert_eq!(attempts[0].host, "::1");
    assert_eq!(attempts[0].address.as_deref(), Some("::1"));
}

#[test]
fn a_tunnel_counts_its_bytes_each_way_and_half_closes() {
    let server = upstream(Kind::Echo);
    let served = serve(settings(), LOOPBACK_POLICY);
    let (mut stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 7) as u8).collect();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        let sent = sent.clone();
        std::thread::spawn(move || {
            stream.write_all(&sent).unwrap();
            // Half-close: the echo still comes back after it.
            stream.shutdown(Shutdown::Write).unwrap();
        })
    };
    let mut echoed = Vec::new();
    stream.read_to_end(&mut echoed).unwrap();
    writer.join().unwrap();
    assert_eq!(echoed, sent);
    served.wait_for("the bytes", |r| r.totals().bytes_in == sent.len() as u64);
    let totals = served.totals();
    assert_eq!((totals.bytes_out, totals.bytes_in), (300_000, 300_000));
    let attempt = &served.attempts()[0];
    assert_eq!((attempt.bytes_out, attempt.bytes_in), (300_000, 300_000));
}

#[test]
fn a_splice_moves_100_mb_intact() {
    const TOTAL: u64 = 100 * 1024 * 1024;
    let server = upstream(Kind::Source(TOTAL));
    let served = serve(settings(), LOOPBACK_POLICY);
    let (mut stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (i, byte) in buf[..n].iter().enumerate() {
            let at = got + i as u64;
            assert_eq!(u64::from(*byte), (at % 65536) % 251, "byte {at}");
        }
        got += n as u64;
    }
    assert_eq!(got, TOTAL);
    drop(stream);
    served.wait_for("the bytes", |r| r.totals().bytes_in == TOTAL);
}
