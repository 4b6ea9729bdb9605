//! What the kernel does to a sandbox's endpoint while it is served: a
//! new policy, and forgetting it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::*;

fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(stream.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn set_policy_closes_a_tunnel_it_now_refuses_and_keeps_the_others() {
    let server = upstream(Kind::Echo);
    let served = serve(
        settings(),
        r#"{"allow":["allowed.test","other.test","127.0.0.0/8"]}"#,
    );
    let (mut kept, status, _) = connect(served.address, &format!("other.test:{}", server.port));
    assert_eq!(status, 200);
    let (mut refused, status, _) =
        connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    refused.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    refused.read_exact(&mut one).unwrap();

    served.proxy.set_policy(
        1,
        policy(r#"{"allow":["allowed.test","other.test","127.0.0.0/8"],"deny":["allowed.test"]}"#),
    );
    assert!(closed(&mut refused));
    kept.write_all(b"y").unwrap();
    kept.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"y");
    served.wait_for("the reason", |r| {
        r.attempts()
            .0
            .any(|a| a.reason.as_deref() == Some("policy changed"))
    });
    let attempt = served
        .attempts()
        .into_iter()
        .find(|a| a.host == "allowed.test")
        .unwrap();
    assert_eq!(attempt.reason.as_deref(), Some("policy changed"));
    assert_eq!(attempt.bytes_out, 1);
}

#[test]
fn forget_closes_the_endpoint_and_every_connection() {
    let server = upstream(Kind::Echo);
    let served = serve(settings(), r#"{"allow":["allowed.test","127.0.0.0/8"]}"#);
    let (mut tunnel, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    let mut waiting = TcpStream::connect(served.address).unwrap();
    waiting.set_read_timeout(Some(WAIT)).unwrap();
    waiting
        .write_all(b"CONNECT allowed.test:1 HTTP/1.1\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));

    served.proxy.forget(1);
    assert!(closed(&mut tunnel));
    assert!(closed(&mut waiting));
    // The endpoint itself is closed: nothing listens there any more.
    let late = TcpStream::connect(served.address);
    assert_eq!(
        late.map(drop).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
}
