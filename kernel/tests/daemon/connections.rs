//! Nothing clients do with their connections may grow the kernel's memory
//! without bound or make one of them wait on another: thousands of them,
//! garbage from many, clients that never read, read a trickle, half-close,
//! die mid-frame or fill the work queue, and the descriptor limit.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, Header, Opcode, MAGIC};
use agentos_test_support::{
    self as support, assert_closed, assert_usable, raise_fd_limit, recv, recv_json, send, Daemon,
};

#[test]
fn a_thousand_concurrent_connections_are_all_served() {
    raise_fd_limit();
    let daemon = Daemon::start();
    let fds_before = support::settled_fd_count(&daemon);
    let mut streams: Vec<UnixStream> = (0..1000).map(|_| daemon.raw()).collect();
    for (i, stream) in streams.iter_mut().enumerate() {
        send(stream, Opcode::NOOP, format!("conn-{i}").as_bytes());
    }
    let mut ids = std::collections::HashSet::new();
    for (i, stream) in streams.iter_mut().enumerate() {
        let (header, payload) = recv(stream);
        assert_eq!(payload, format!("conn-{i}").as_bytes());
        ids.insert(header.agent_id);
    }
    assert_eq!(ids.len(), 1000, "every connection has its own id");
    assert!(daemon.fd_count() >= fds_before + 1000);
    drop(streams);
    // Every connection's descriptor is released once the clients are gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.fd_count() > fds_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        daemon.fd_count(),
        fds_before,
        "connection descriptors leaked"
    );
}

/// After a crowd of connections has come and gone, the kernel gives the
/// memory back: its resident size returns to near what it was at idle.
#[test]
fn memory_returns_near_idle_after_a_thousand_connections_come_and_go() {
    raise_fd_limit();
    let daemon = Daemon::start();
    let fds_idle = support::settled_fd_count(&daemon);
    let idle = daemon.rss_kib();
    let mut streams: Vec<UnixStream> = (0..1000).map(|_| daemon.raw()).collect();
    for (i, stream) in streams.iter_mut().enumerate() {
        send(stream, Opcode::NOOP, format!("conn-{i}").as_bytes());
    }
    for stream in &mut streams {
        recv(stream);
    }
    let loaded = daemon.rss_kib();
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.fd_count() > fds_idle && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Give the kernel an idle moment to shrink.
    std::thread::sleep(Duration::from_millis(1500));
    let after = daemon.rss_kib();
    eprintln!("RSS: idle {idle} KiB, under load {loaded} KiB, idle again {after} KiB");
    assert!(
        after <= idle + 2048,
        "RSS {after} KiB after the connections left, {idle} KiB before them"
    );
}

#[test]
fn a_client_that_never_reads_is_disconnected_and_memory_stays_bounded() {
    let daemon = Daemon::start_with("write_stall_timeout_ms = 500\n");
    let rss_before = daemon.rss_kib();
    let mut stream = daemon.raw();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let frame = encode_frame(Opcode::NOOP, 0, &[0xABu8; 256 * 1024]);
    let started = Instant::now();
    let mut sent = 0usize;
    // Keep sending, never reading. The kernel must stop reading (so our
    // writes block) and then, with nothing of its replies read for 500 ms,
    // drop the connection (so our writes fail).
    let outcome = loop {
        match stream.write_all(&frame) {
            Ok(()) => sent += frame.len(),
            Err(err) => break err,
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "still accepting after {sent} bytes"
        );
    };
    assert!(
        matches!(
            outcome.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ),
        "{outcome:?}"
    );
    let growth = daemon.rss_kib().saturating_sub(rss_before);
    assert!(
        growth < 32 * 1024,
        "RSS grew by {growth} KiB after {sent} bytes from a non-reading client"
    );
    assert!(daemon.log().contains("disconnecting"));
    assert_usable(&mut daemon.raw());
}

#[test]
fn random_garbage_from_many_connections_never_hurts_the_kernel() {
    let mut daemon = Daemon::start();
    let rss_before = daemon.rss_kib();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..300 {
        let mut stream = daemon.raw();
        let len = (next() % 4096) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 3 == 0 && bytes.len() >= 4 {
            // Valid magic with random rest: exercises length and opcode paths.
            bytes[..4].copy_from_slice(&MAGIC.to_le_bytes());
        }
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
    }
    assert!(daemon.is_running());
    assert_usable(&mut daemon.raw());
    let growth = daemon.rss_kib().saturating_sub(rss_before);
    assert!(growth < 8 * 1024, "RSS grew by {growth} KiB");
}

#[test]
fn replies_parked_behind_a_slow_request_pause_reading_and_all_arrive() {
    // A slow HELLO, then 127 one-MiB NOOPs answered at once: the NOOP
    // replies wait behind the HELLO and count toward the high-water mark,
    // so the kernel stops reading instead of holding 127 MiB; once the
    // HELLO is answered everything flows to a client that reads.
    let daemon = Daemon::start_with("[debug]\ndefer_opcodes = [\"hello\"]\ndefer_delay_ms = 500\n");
    let rss_before = daemon.rss_kib();
    let mut stream = daemon.raw();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        send(&mut writer, Opcode::HELLO, b"");
        let payload = vec![0x33u8; 1 << 20];
        for _ in 0..127 {
            send(&mut writer, Opcode::NOOP, &payload);
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let peak = daemon.rss_kib().saturating_sub(rss_before);
    let (header, reply) = recv_json(&mut stream);
    assert_eq!(header.opcode, Opcode::HELLO);
    assert_eq!(reply["success"], true);
    for i in 0..127 {
        let (header, payload) = recv(&mut stream);
        assert_eq!(header.opcode, Opcode::NOOP, "reply {i}");
        assert_eq!(payload.len(), 1 << 20);
    }
    sender.join().unwrap();
    assert!(
        peak < 32 * 1024,
        "RSS grew by {peak} KiB while replies waited behind a slow one"
    );
}

#[test]
fn a_client_that_keeps_the_pipe_full_does_not_grow_memory() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let mut writer = stream.try_clone().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_writer = stop.clone();
    let sender = std::thread::spawn(move || {
        let frame = encode_frame(Opcode::NOOP, 0, &[1u8; 64 * 1024]);
        let mut sent = 0u64;
        while !stop_writer.load(std::sync::atomic::Ordering::Relaxed) {
            writer.write_all(&frame).unwrap();
            sent += 1;
        }
        sent
    });
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    std::thread::sleep(Duration::from_millis(500));
    let early = daemon.rss_kib();
    std::thread::sleep(Duration::from_secs(3));
    let late = daemon.rss_kib();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    assert!(sent > 1000, "only {sent} requests went through");
    assert!(
        late < early + 8 * 1024,
        "RSS went from {early} KiB to {late} KiB under a steady pipeline"
    );
    drop(reader);
}

#[test]
fn a_half_closed_client_gets_every_reply_then_the_close() {
    // Well over one read budget of requests, then EOF from the client.
    let daemon = Daemon::start_with("max_in_flight = 2\n");
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..600u32 {
        batch.extend(encode_frame(Opcode::NOOP, 0, &[i as u8; 1024]));
    }
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        writer.write_all(&batch).unwrap();
        writer.shutdown(std::net::Shutdown::Write).unwrap();
    });
    for i in 0..600u32 {
        let (_, payload) = recv(&mut stream);
        assert_eq!(payload, vec![i as u8; 1024], "reply {i}");
    }
    sender.join().unwrap();
    assert_closed(&mut stream);
}

#[test]
fn a_client_that_dies_mid_frame_is_forgotten() {
    let daemon = Daemon::start();
    let fds_before = support::settled_fd_count(&daemon);
    // A large send buffer lets the whole partial frame leave at once, so the
    // kernel sees data and the hang-up in one go.
    let socket = daemon.socket.clone();
    let child = std::thread::spawn(move || {
        let mut stream = UnixStream::connect(&socket).unwrap();
        let size: libc::c_int = 4 << 20;
        // SAFETY: valid fd and a pointer to a c_int of the given length.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let header = Header {
            agent_id: 0,
            opcode: Opcode::NOOP,
            payload_len: 1 << 20,
        };
        stream.write_all(&header.encode()).unwrap();
        stream.write_all(&vec![0u8; 300 * 1024]).unwrap();
    });
    child.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.fd_count() > fds_before {
        assert!(
            Instant::now() < deadline,
            "the dead client's connection is still open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_frame_that_never_completes_times_out() {
    let daemon = Daemon::start_with("frame_timeout_ms = 300\n");
    let mut stream = daemon.raw();
    let frame = encode_frame(Opcode::NOOP, 0, &[0u8; 100]);
    stream.write_all(&frame[..50]).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_closed(&mut stream);
    assert!(daemon.log().contains("took over"), "{}", daemon.log());
    assert_usable(&mut daemon.raw());
}

#[test]
fn a_client_reading_a_trickle_is_disconnected() {
    let daemon = Daemon::start_with("write_stall_timeout_ms = 300\n");
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for _ in 0..16 {
        batch.extend(encode_frame(Opcode::NOOP, 0, &vec![9u8; 256 * 1024]));
    }
    let mut writer = stream.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = writer.write_all(&batch);
    });
    // A byte every 50 ms: progress, but far below the minimum drain. (What
    // the socket already holds keeps trickling in after the kernel hangs
    // up, so watch the kernel, not the stream.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut byte = [0u8; 1];
    while !daemon.log().contains("disconnecting") {
        assert!(
            Instant::now() < deadline,
            "still connected:\n{}",
            daemon.log()
        );
        let _ = stream.read(&mut byte);
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_full_work_queue_answers_busy_in_order() {
    let daemon = Daemon::start_with(
        "workers = 1\nmax_queued_jobs = 2\n[debug]\ndefer_opcodes = [\"noop\"]\ndefer_delay_ms = 200\n",
    );
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..10u8 {
        batch.extend(encode_frame(Opcode::NOOP, 0, &[i]));
    }
    stream.write_all(&batch).unwrap();
    let (mut served, mut busy) = (0, 0);
    for i in 0..10u8 {
        let (header, payload) = recv(&mut stream);
        assert_eq!(header.opcode, Opcode::NOOP);
        if payload == [i] {
            served += 1;
        } else {
            let reply: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            assert_eq!(reply["code"], "busy", "reply {i}: {reply}");
            busy += 1;
        }
    }
    assert!(served >= 2 && busy >= 1, "served {served}, busy {busy}");
}

#[test]
fn one_connections_backlog_does_not_delay_another() {
    // One worker, 20 ms per job: 50 queued jobs of one client would hold a
    // second client for a second in a FIFO; taking turns, it waits a job
    // or two.
    let daemon = Daemon::start_with(
        "workers = 1\n[debug]\ndefer_opcodes = [\"noop\"]\ndefer_delay_ms = 20\n",
    );
    let mut greedy = daemon.raw();
    let mut batch = Vec::new();
    for _ in 0..50 {
        batch.extend(encode_frame(Opcode::NOOP, 0, b"g"));
    }
    greedy.write_all(&batch).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut polite = daemon.raw();
    let started = Instant::now();
    assert_usable(&mut polite);
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(500), "waited {waited:?}");
    for _ in 0..50 {
        assert_eq!(recv(&mut greedy).1, b"g");
    }
}

#[test]
fn queued_work_of_a_departed_client_is_dropped() {
    let daemon = Daemon::start_with(
        "workers = 1\n[debug]\ndefer_opcodes = [\"noop\"]\ndefer_delay_ms = 100\n",
    );
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for _ in 0..30 {
        batch.extend(encode_frame(Opcode::NOOP, 0, b"x"));
    }
    stream.write_all(&batch).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(stream);
    let dropped = || {
        daemon
            .log()
            .lines()
            .filter_map(|line| {
                line.split(", ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .max()
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while dropped() < 20 {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_usable(&mut daemon.raw());
}

#[test]
fn max_connections_is_kept_within_the_descriptor_limit() {
    let daemon = Daemon::start_limited("", Some(100));
    assert!(
        daemon
            .log()
            .contains("max_connections lowered from 8192 to 36"),
        "{}",
        daemon.log()
    );
    let mut streams: Vec<UnixStream> = (0..36).map(|_| daemon.raw()).collect();
    for stream in &mut streams {
        assert_usable(stream);
    }
    let mut extra = daemon.raw();
    let (_, reply) = recv_json(&mut extra);
    assert_eq!(reply["code"], "busy");
}

#[test]
fn connections_beyond_the_limit_are_told_busy() {
    let daemon = Daemon::start_with("max_connections = 2\n");
    let mut first = daemon.raw();
    let mut second = daemon.raw();
    assert_usable(&mut first);
    assert_usable(&mut second);
    let mut third = daemon.raw();
    let (header, reply) = recv_json(&mut third);
    assert_eq!(header.opcode, Opcode::EXIT);
    assert_eq!(reply["code"], "busy");
    assert_closed(&mut third);
    drop(first);
    // A slot frees up once a client leaves.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut next = daemon.raw();
        send(&mut next, Opcode::NOOP, b"in");
        let (header, payload) = recv(&mut next);
        if header.opcode == Opcode::NOOP {
            assert_eq!(payload, b"in");
            break;
        }
        assert!(Instant::now() < deadline, "no slot freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}
