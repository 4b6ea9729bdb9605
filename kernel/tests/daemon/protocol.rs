//! The wire contract, end to end against a real agentosd: every opcode's
//! reply, identity in reply headers, in-order pipelining and the worker
//! completion path.

use std::io::Write;
use std::time::Duration;

use agentos_proto::{encode_frame, Opcode};
use agentos_test_support::{
    self as support, assert_closed, assert_usable, call_json, recv, recv_json, send, Daemon,
};

#[test]
fn noop_echoes_its_payload_byte_for_byte() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for payload in [
        &b""[..],
        b"Hello!",
        &[0u8, 255, 1, 254],
        &vec![7u8; 100_000],
    ] {
        send(&mut stream, Opcode::NOOP, payload);
        let (header, echoed) = recv(&mut stream);
        assert_eq!(header.opcode, Opcode::NOOP);
        assert_eq!(echoed, payload);
    }
}

#[test]
fn noop_at_exactly_the_request_limit_is_served() {
    let daemon = Daemon::start_with("max_request_bytes = 4096\n");
    let mut stream = daemon.raw();
    send(&mut stream, Opcode::NOOP, &[1u8; 4096]);
    assert_eq!(recv(&mut stream).1.len(), 4096);
}

#[test]
fn hello_reports_protocol_identity_and_honest_features() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = call_json(&mut stream, Opcode::HELLO, b"");
    assert_eq!(reply["success"], true);
    assert_eq!(reply["protocol_version"], 1);
    assert_eq!(reply["kernel_version"], env!("CARGO_PKG_VERSION"));
    assert!(reply["agent_id"].as_u64().unwrap() >= 1_000_000);
    let features = &reply["features"];
    // Test daemons run without an LLM, and TASK does not exist yet: HELLO
    // must not claim them. EXEC works wherever namespaces do (as root).
    assert_eq!(features["think"], false);
    assert_eq!(reply["llm"]["provider"], "none");
    assert_eq!(reply["llm"]["ready"], false);
    if support::is_root() {
        assert_eq!(features["exec"], true);
    }
    assert_eq!(features["task"], true);
    assert_eq!(features["spawn"], true);
    if support::is_root() {
        assert!(
            matches!(features["cgroup"].as_str(), Some("v1" | "v2")),
            "{features}"
        );
    } else {
        assert!(features["cgroup"].is_null(), "{features}");
    }
    assert_eq!(reply["limits"]["max_request_bytes"], 1_048_576);
    // `{}` is as good as empty.
    assert_eq!(
        call_json(&mut stream, Opcode::HELLO, b"{}")["success"],
        true
    );
}

#[test]
fn operator_ids_come_from_the_socket_not_the_header() {
    let daemon = Daemon::start();
    let mut first = daemon.raw();
    let mut second = daemon.raw();
    // Claim to be agent 7 in the header: the kernel must not believe it.
    first
        .write_all(&encode_frame(Opcode::HELLO, 7, b""))
        .unwrap();
    let (header, reply) = recv_json(&mut first);
    let first_id = header.agent_id;
    assert!(first_id >= 1_000_000, "operator ids start at 1 000 000");
    assert_eq!(reply["agent_id"], first_id);

    send(&mut second, Opcode::NOOP, b"");
    let (header, _) = recv(&mut second);
    assert!(header.agent_id >= 1_000_000);
    assert_ne!(header.agent_id, first_id, "each connection has its own id");

    // Every reply on a connection carries the same id.
    send(&mut first, Opcode::NOOP, b"x");
    assert_eq!(recv(&mut first).0.agent_id, first_id);
}

#[test]
fn list_is_an_empty_json_array() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = call_json(&mut stream, Opcode::LIST, b"");
    assert_eq!(reply, serde_json::json!([]));
}

#[test]
fn exit_says_goodbye_then_closes() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    send(&mut stream, Opcode::EXIT, b"");
    let (header, payload) = recv(&mut stream);
    assert_eq!(header.opcode, Opcode::EXIT);
    assert_eq!(payload, b"goodbye");
    assert_closed(&mut stream);
}

#[test]
fn requests_pipelined_before_exit_are_answered_and_after_it_ignored() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let mut batch = encode_frame(Opcode::NOOP, 0, b"before");
    batch.extend(encode_frame(Opcode::EXIT, 0, b""));
    batch.extend(encode_frame(Opcode::NOOP, 0, b"after"));
    stream.write_all(&batch).unwrap();
    assert_eq!(recv(&mut stream).1, b"before");
    assert_eq!(recv(&mut stream).1, b"goodbye");
    assert_closed(&mut stream);
}

#[test]
fn think_without_a_provider_answers_unavailable_after_validating_the_request() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = call_json(&mut stream, Opcode::THINK, b"What is 2+2?");
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "unavailable", "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("THINK"),
        "{reply}"
    );
    // A malformed request is told so first.
    let bad = call_json(&mut stream, Opcode::THINK, br#"{"prompt": 7}"#);
    assert_eq!(bad["code"], "bad_request", "{bad}");
    let hello = call_json(&mut stream, Opcode::HELLO, b"");
    assert_eq!(hello["features"]["think"], false, "{hello}");
}

#[test]
fn two_hundred_pipelined_noops_come_back_in_order() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..200u32 {
        batch.extend(encode_frame(
            Opcode::NOOP,
            0,
            format!("noop-{i}").as_bytes(),
        ));
    }
    stream.write_all(&batch).unwrap();
    for i in 0..200u32 {
        let (header, payload) = recv(&mut stream);
        assert_eq!(header.opcode, Opcode::NOOP);
        assert_eq!(payload, format!("noop-{i}").as_bytes(), "reply {i}");
    }
}

#[test]
fn replies_completed_on_workers_keep_request_order() {
    // HELLO goes through the worker pool and the waker, slowly; NOOP is
    // answered at once. Replies must still follow request order.
    let daemon = Daemon::start_with("[debug]\ndefer_opcodes = [\"hello\"]\ndefer_delay_ms = 100\n");
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.extend(encode_frame(Opcode::HELLO, 0, b""));
        batch.extend(encode_frame(Opcode::NOOP, 0, format!("n{i}").as_bytes()));
    }
    stream.write_all(&batch).unwrap();
    for i in 0..5 {
        let (header, reply) = recv_json(&mut stream);
        assert_eq!(header.opcode, Opcode::HELLO, "reply {}", 2 * i);
        assert_eq!(reply["success"], true);
        let (header, payload) = recv(&mut stream);
        assert_eq!(header.opcode, Opcode::NOOP);
        assert_eq!(payload, format!("n{i}").as_bytes());
    }
}

#[test]
fn noops_completed_concurrently_on_four_workers_stay_in_order() {
    let daemon = Daemon::start_with("workers = 4\n[debug]\ndefer_opcodes = [\"noop\"]\n");
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..500u32 {
        batch.extend(encode_frame(Opcode::NOOP, 0, &i.to_le_bytes()));
    }
    stream.write_all(&batch).unwrap();
    for i in 0..500u32 {
        assert_eq!(recv(&mut stream).1, i.to_le_bytes(), "reply {i}");
    }
}

#[test]
fn in_flight_cap_applies_backpressure_without_dropping_requests() {
    // Four requests in flight at most, each taking 20 ms on a worker: the
    // kernel must stop reading, not drop or refuse, and resume as replies go.
    let daemon = Daemon::start_with(
        "max_in_flight = 4\nworkers = 2\n[debug]\ndefer_opcodes = [\"noop\"]\ndefer_delay_ms = 20\n",
    );
    let mut stream = daemon.raw();
    let mut batch = Vec::new();
    for i in 0..40u32 {
        batch.extend(encode_frame(Opcode::NOOP, 0, &i.to_le_bytes()));
    }
    stream.write_all(&batch).unwrap();
    for i in 0..40u32 {
        assert_eq!(recv(&mut stream).1, i.to_le_bytes(), "reply {i}");
    }
    assert_usable(&mut stream);
}

#[test]
fn connections_do_not_wait_on_each_other() {
    // One connection's slow request must not delay another connection.
    let daemon = Daemon::start_with(
        "workers = 2\n[debug]\ndefer_opcodes = [\"hello\"]\ndefer_delay_ms = 3000\n",
    );
    let mut slow = daemon.raw();
    send(&mut slow, Opcode::HELLO, b"");
    let mut fast = daemon.raw();
    fast.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    // Would time out (and panic) if the fast connection queued behind the
    // slow one's 3 s reply.
    assert_usable(&mut fast);
    let (_, reply) = recv_json(&mut slow);
    assert_eq!(reply["success"], true);
}

#[test]
fn payload_contents_are_not_logged_at_info() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    send(&mut stream, Opcode::NOOP, b"secret-payload-4242");
    recv(&mut stream);
    drop(stream);
    let log = daemon.log();
    let info_and_above: String = log
        .lines()
        .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
        .collect();
    assert!(!info_and_above.contains("secret-payload-4242"));
}
