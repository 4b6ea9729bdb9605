//! Nothing a client sends may crash the kernel: each case of the protocol's
//! error model for a frame or a request, against a real agentosd; the
//! connection stays usable wherever the model says so.

use std::io::{Read, Write};

use agentos_proto::{encode_frame, Header, Opcode, MAGIC};
use agentos_test_support::{
    assert_closed, assert_usable, call_json, recv, recv_json, send, Daemon,
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
fn a_field_no_request_knows_is_refused_naming_it_at_any_depth() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for (opcode, body, field) in [
        (
            Opcode::SPAWN,
            r#"{"name":"a","command":["/bin/true"],"restart_polcy":"always"}"#,
            "restart_polcy",
        ),
        (
            Opcode::SPAWN,
            r#"{"name":"a","command":["/bin/true"],"permissions":{"thnk":false}}"#,
            "thnk",
        ),
        (
            Opcode::SPAWN,
            r#"{"name":"a","command":["/bin/true"],"limits":{"memroy":1048576}}"#,
            "memroy",
        ),
        (
            Opcode::EXEC,
            r#"{"code":"print(1)","timout_ms":5}"#,
            "timout_ms",
        ),
        (
            Opcode::EXEC,
            r#"{"code":"print(1)","permissions":{"spwn":true}}"#,
            "spwn",
        ),
        (Opcode::EXEC, r#"{"op":"sessions","sesion":"x"}"#, "sesion"),
        (Opcode::TASK, r#"{"op":"list","sate":"running"}"#, "sate"),
        (
            Opcode::TASK,
            r#"{"op":"dispatch","kind":"exec","request":{"code":"1","limits":{"cpu":1}}}"#,
            "cpu",
        ),
        (
            Opcode::TOOL,
            r#"{"op":"call","server":"kernel","tool":"list_agents","argumnets":{}}"#,
            "argumnets",
        ),
        (
            Opcode::THINK,
            r#"{"prompt":"hi","max_token":5}"#,
            "max_token",
        ),
        (Opcode::KILL, r#"{"name":"a","grace":1}"#, "grace"),
        (Opcode::LIST, r#"{"all":true}"#, "all"),
        (Opcode::LOGS, r#"{"name":"a","tail":5}"#, "tail"),
        (Opcode::HELLO, r#"{"version":2}"#, "version"),
    ] {
        let reply = call_json(&mut stream, opcode, body.as_bytes());
        assert_eq!(reply["success"], false, "{body} -> {reply}");
        assert_eq!(reply["code"], "bad_request", "{body} -> {reply}");
        assert!(
            reply["error"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}`")),
            "{body} -> {reply}"
        );
    }
    // The Clove SDK's shell form keeps its extra fields.
    let clove = call_json(
        &mut stream,
        Opcode::EXEC,
        br#"{"command":"echo hi","cwd":"/tmp","timeout":5,"async":false,"request_id":"r1"}"#,
    );
    assert_ne!(clove["code"], "bad_request", "{clove}");
    assert_usable(&mut stream);
}

#[test]
fn unknown_opcode_is_refused_and_the_connection_stays_usable() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for opcode in [0x06u8, 0x42, 0x7F, 0xA0, 0xB0, 0xFD] {
        let reply = call_json(&mut stream, Opcode(opcode), b"{}");
        assert_eq!(reply["success"], false);
        assert_eq!(reply["code"], "unknown_opcode");
        assert_usable(&mut stream);
    }
}
