//! What a hostile sandbox cannot do to the proxy: hold it with a flood of
//! connections, or with heads that never end.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;

const POLICY: &str = r#"{"allow":["allowed.test","127.0.0.0/8"]}"#;

#[test]
fn a_connect_flood_is_bounded_and_the_proxy_still_answers() {
    const MAX: usize = 64;
    let flood_size = descriptors_for_a_flood(10_000);
    let server = upstream(Kind::Echo);
    let served = serve(
        agentos_egress::proxy::ProxySettings {
            max_connections: MAX,
            ..settings()
        },
        POLICY,
    );
    let target = format!("allowed.test:{}", server.port);
    let mut flood = Vec::with_capacity(flood_size);
    for _ in 0..flood_size {
        let mut stream = TcpStream::connect(served.address).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        // Refused at once, a connection may be closed before this is sent.
        let _ = write!(stream, "CONNECT {target} HTTP/1.1\r\n\r\n");
        flood.push(stream);
    }
    let mut statuses = std::collections::BTreeMap::new();
    for stream in &mut flood {
        // 0: reset before the answer could be read (the client wrote to a
        // connection already answered and closed).
        let mut answer = [0u8; 12];
        let status = match stream.read_exact(&mut answer) {
            Ok(()) => String::from_utf8_lossy(&answer[9..12]).parse().unwrap_or(1),
            Err(_) => 0,
        };
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(statuses.get(&200), Some(&MAX), "{statuses:?}");
    let refused = statuses.get(&503).copied().unwrap_or(0) + statuses.get(&0).copied().unwrap_or(0);
    assert_eq!(refused, flood_size - MAX, "{statuses:?}");
    assert!(statuses.get(&503).is_some_and(|n| *n > 0), "{statuses:?}");

    // Another sandbox is served at once while the flood is held.
    let (other, _) = endpoint(&served.proxy, 2, POLICY);
    let started = Instant::now();
    let (mut stream, status, _) = connect(other, &target);
    assert_eq!(status, 200);
    stream.write_all(b"still here").unwrap();
    let mut echoed = [0u8; 10];
    stream.read_exact(&mut echoed).unwrap();
    assert!(started.elapsed() < WAIT);

    // Once the flood is gone, the flooding sandbox is served again.
    drop(flood);
    let until = Instant::now() + WAIT;
    loop {
        let (_, status, _) = connect(served.address, &target);
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < until,
            "still {status} after the flood closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let totals = served.totals();
    assert!(totals.refused >= (flood_size - MAX) as u64, "{totals:?}");
    assert!(totals.allowed > MAX as u64, "{totals:?}");
    let (kept, dropped) = {
        let record = served.record.lock().unwrap();
        let (kept, dropped) = record.attempts();
        (kept.count(), dropped)
    };
    assert!(kept <= agentos_egress::record::KEPT_ATTEMPTS && dropped > 0);
}

/// Raises this process's descriptor limit to its hard limit (the test
/// holds the flood's client ends and the proxy's ends alike); how many
/// connections the flood can then be, up to `wanted`.
fn descriptors_for_a_flood(wanted: usize) -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let size = wanted.min(
        usize::try_from(soft)
            .unwrap_or(usize::MAX)
            .saturating_sub(1_000),
    );
    assert!(
        size >= 500,
        "a descriptor limit of {soft} is too low for a flood"
    );
    size
}

#[test]
fn a_slow_head_is_closed_at_the_timeout_and_recorded() {
    let served = serve(
        agentos_egress::proxy::ProxySettings {
            head_timeout: Duration::from_millis(300),
            ..settings()
        },
        POLICY,
    );
    let mut stream = TcpStream::connect(served.address).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let started = Instant::now();
    // A byte every 50 ms: never the whole head.
    let mut answer = Vec::new();
    for byte in b"CONNECT allowed.test:443 HTTP/1.1\r\nX-Slow: "
        .iter()
        .cycle()
    {
        if stream.write_all(&[*byte]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        stream.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let read = stream.read(&mut buf);
        stream.set_nonblocking(false).unwrap();
        match read {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        assert!(started.elapsed() < WAIT, "the slow head was never closed");
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    served.wait_for("the refusal", |r| r.totals().refused == 1);
    let attempt = &served.attempts()[0];
    assert!(!attempt.allowed);
    assert_eq!(
        attempt.reason.as_deref(),
        Some("no whole request head within 300 ms")
    );
}

#[test]
fn a_tunnel_whose_client_hello_never_ends_is_closed_at_the_timeout() {
    let server = upstream(Kind::Echo);
    let served = serve(
        agentos_egress::proxy::ProxySettings {
            head_timeout: Duration::from_millis(300),
            ..settings()
        },
        POLICY,
    );
    let (mut stream, status, _) = connect(served.address, &format!("allowed.test:{}", server.port));
    assert_eq!(status, 200);
    // A TLS record header promising more than is sent.
    stream.write_all(&[0x16, 3, 1, 1, 0, 1]).unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty());
    served.wait_for("the refusal", |r| r.totals().refused == 1);
}

/// The proxy thread's `stat` file, opened while descriptors are there.
fn proxy_thread_stat() -> std::fs::File {
    // A new thread names itself once it runs: look until it has.
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let Ok(task) = task else { continue };
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() == "proxy" {
                return std::fs::File::open(task.path().join("stat")).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no proxy thread");
}

/// The CPU time (in clock ticks) the proxy's thread has used.
fn ticks(stat: &std::fs::File) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 1024];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let stat = String::from_utf8_lossy(&buf[..n]);
    // After the command's closing parenthesis: utime and stime are the
    // 12th and 13th fields.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn a_descriptor_shortage_pauses_accepting_and_the_waiting_client_is_served_after() {
    let server = upstream(Kind::Echo);
    let served = serve_alone(settings(), POLICY);
    let stat = proxy_thread_stat();
    // Take every descriptor but a few, connect, then take what is left:
    // the proxy's accept fails with EMFILE.
    let mut hoard = Vec::new();
    let hoard_all = |hoard: &mut Vec<std::fs::File>| {
        while let Ok(file) = std::fs::File::open("/dev/null") {
            hoard.push(file);
        }
    };
    hoard_all(&mut hoard);
    hoard.truncate(hoard.len() - 8);
    let stream = TcpStream::connect(served.address);
    hoard_all(&mut hoard);
    let mut stream = stream.unwrap();
    let before = ticks(&stat);
    std::thread::sleep(Duration::from_millis(600));
    let spent = ticks(&stat) - before;
    // Clock ticks are 10 ms: a spinning loop would show some 60.
    assert!(
        spent < 20,
        "the proxy spent {spent} ticks while it could not accept"
    );
    drop(hoard);
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "CONNECT allowed.test:{} HTTP/1.1\r\n\r\n",
        server.port
    )
    .unwrap();
    let (status, _) = read_head(&mut stream);
    assert_eq!(status, 200);
}

#[test]
fn an_upstream_that_refuses_the_connection_is_answered_502() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let served = serve(settings(), POLICY);
    let (_, status, head) = connect(served.address, &format!("allowed.test:{closed_port}"));
    assert_eq!(status, 502);
    assert!(
        head.contains("could not be reached: Connection refused"),
        "{head}"
    );
    served.wait_for("the failure", |r| {
        r.attempts().0.any(|a| a.reason.is_some())
    });
    let attempt = &served.attempts()[0];
    assert!(attempt.allowed, "allowed by the policy, then failed");
}
