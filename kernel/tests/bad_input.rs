//! Nothing a client sends may crash the kernel or grow its memory without
//! bound. Each case of the protocol's error model, against a real agentosd.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, Header, Opcode, MAGIC};
use common::{
    assert_closed, assert_usable, call_json, raise_fd_limit, recv, recv_json, send, Daemon,
};

#[test]
fn wrong_magic_gets_one_bad_magic_reply_then_close() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (header, reply) = recv_json(&mut stream);
    assert_eq!(
        header.opcode,
        Opcode::EXIT,
        "bad_magic is sent with opcode 0xFF"
    );
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "bad_magic");
    assert!(reply["error"].as_str().unwrap().contains("41474E54"));
    assert_closed(&mut stream);
    assert_usable(&mut daemon.raw());
}

#[test]
fn wrong_magic_after_good_frames_answers_them_first() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let mut bytes = encode_frame(Opcode::NOOP, 0, b"one");
    bytes.extend_from_slice(&(MAGIC ^ 1).to_le_bytes());
    bytes.extend_from_slice(&[0u8; 13]);
    stream.write_all(&bytes).unwrap();
    assert_eq!(recv(&mut stream).1, b"one");
    let (_, reply) = recv_json(&mut stream);
    assert_eq!(reply["code"], "bad_magic");
    assert_closed(&mut stream);
}

#[test]
fn oversized_length_is_refused_without_reading_or_allocating_the_payload() {
    let daemon = Daemon::start();
    let rss_before = daemon.rss_kib();
    let mut stream = daemon.raw();
    // Announce 1 GiB and send none of it: the reply must come anyway, which
    // proves the kernel did not wait for (read) the payload.
    let header = Header {
        agent_id: 0,
        opcode: Opcode::EXEC,
        payload_len: 1 << 30,
    };
    stream.write_all(&header.encode()).unwrap();
    let (reply_header, reply) = recv_json(&mut stream);
    assert_eq!(
        reply_header.opcode,
        Opcode::EXEC,
        "answered under the request's opcode"
    );
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "payload_too_large");
    assert!(reply["error"].as_str().unwrap().contains("1048576"));
    assert_closed(&mut stream);
    let growth = daemon.rss_kib().saturating_sub(rss_before);
    assert!(
        growth < 2048,
        "RSS grew by {growth} KiB for a refused 1 GiB frame"
    );
}

#[test]
fn length_one_over_a_configured_limit_is_refused() {
    let daemon = Daemon::start_with("max_request_bytes = 100\n");
    let mut stream = daemon.raw();
    send(&mut stream, Opcode::NOOP, &[0u8; 100]);
    assert_eq!(recv(&mut stream).1.len(), 100);
    send(&mut stream, Opcode::NOOP, &[0u8; 101]);
    let (_, reply) = recv_json(&mut stream);
    assert_eq!(reply["code"], "payload_too_large");
    assert_closed(&mut stream);
}

#[test]
fn frame_cut_short_then_eof_is_dropped_silently() {
    let daemon = Daemon::start();
    for cut in [3usize, 10, 17, 25] {
        let mut stream = daemon.raw();
        let frame = encode_frame(Opcode::NOOP, 0, &[9u8; 30]);
        stream.write_all(&frame[..cut]).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "cut at {cut}: got a reply {rest:?}");
    }
    assert_usable(&mut daemon.raw());
}

#[test]
fn invalid_json_is_a_bad_request_and_the_connection_stays_usable() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let cases: [(Opcode, &[u8], &str); 6] = [
        (Opcode::HELLO, b"{oops", "not valid JSON"),
        (Opcode::LIST, b"[1,2]", "LIST"),
        (Opcode::SPAWN, b"{\"name\": 42}", "`name`"),
        (
            Opcode::SPAWN,
            br#"{"name":"w","command":["/bin/true"],"limits":{"memory":"big"}}"#,
            "`limits.memory`",
        ),
        (Opcode::KILL, b"{}", "`id` or `name`"),
        (Opcode::EXEC, &[0xFF, 0xFE, 0x00], "not valid JSON"),
    ];
    for (opcode, payload, names) in cases {
        let reply = call_json(&mut stream, opcode, payload);
        assert_eq!(reply["success"], false, "{opcode}");
        assert_eq!(reply["code"], "bad_request", "{opcode}: {reply}");
        let error = reply["error"].as_str().unwrap();
        assert!(
            error.contains(names),
            "{opcode}: {error:?} should mention {names}"
        );
        assert_usable(&mut stream);
    }
}

#[test]
fn wrong_field_types_name_the_field() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = call_json(
        &mut stream,
        Opcode::TASK,
        br#"{"op":"wait","task_id":"t-1","timeout_ms":"soon"}"#,
    );
    assert_eq!(reply["code"], "bad_request");
    assert!(
        reply["error"].as_str().unwrap().contains("timeout_ms"),
        "{reply}"
    );
}

#[test]
fn unknown_opcode_is_refused_and_the_connection_stays_usable() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for opcode in [0x03u8, 0x42, 0x7F, 0x80, 0xFD] {
        let reply = call_json(&mut stream, Opcode(opcode), b"{}");
        assert_eq!(reply["success"], false);
        assert_eq!(reply["code"], "unknown_opcode");
        assert_usable(&mut stream);
    }
}

#[test]
fn a_thousand_concurrent_connections_are_all_served() {
    raise_fd_limit();
    let daemon = Daemon::start();
    let fds_before = daemon.fd_count();
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
fn unread_replies_beyond_the_buffer_limit_disconnect_the_client() {
    // Slow requests are all accepted while nothing is unsent; when their
    // 40 MiB of replies land on a client that reads none of them, the
    // buffer limit (its 16 MiB minimum) ends the connection.
    let daemon = Daemon::start_with(
        "write_buffer_limit = 16777233\nwrite_high_water = 1048576\n\
         [debug]\ndefer_opcodes = [\"noop\"]\ndefer_delay_ms = 300\n",
    );
    let mut stream = daemon.raw();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let frame = encode_frame(Opcode::NOOP, 0, &vec![0x5Au8; 1 << 20]);
    let mut batch = Vec::new();
    for _ in 0..40 {
        batch.extend_from_slice(&frame);
    }
    let _ = stream.write_all(&batch);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.log().contains("over the limit") {
        assert!(
            Instant::now() < deadline,
            "not disconnected:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whatever was delivered, the connection then ends.
    let mut sink = Vec::new();
    let _ = stream.read_to_end(&mut sink);
    assert!(sink.len() < batch.len());
    assert_usable(&mut daemon.raw());
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
