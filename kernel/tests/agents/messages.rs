//! REGISTER, SEND, RECV and BROADCAST: names and mailboxes, as the Clove
//! SDK calls them — an operator and its worker talking as Clove's IPC test
//! does, and what a hostile sender tries: a forged sender, a flood, a
//! squatted name, an agent outside its family, another uid's tree, a
//! `max` of 10^9, and an EXEC run passing itself off as its caller.

use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};
use agentos_test_support::{
    act, calls_as_another_uid, request, require_root, shared_dir, until, write_script, Daemon,
    PY_KERNEL,
};
use serde_json::{json, Value};

use super::refused;

const SEND: u8 = 0x20;
const RECV: u8 = 0x21;
const BROADCAST: u8 = 0x22;
const REGISTER: u8 = 0x23;

/// An agent that answers every message it receives, for `argv[1]`
/// seconds, with `{"echo": <message>, "saw": <the message as received>}`
/// to its sender's `from_id`, as Clove's IPC worker does.
const ECHO: &str = r#"
import time
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    _, body = call(0x21, json.dumps({"max": 10}).encode())
    for m in json.loads(body).get("messages", []):
        saw = {k: v for k, v in m.items() if k != "age_ms"}
        call(0x20, json.dumps({"to": m["from_id"], "message": {"echo": m["message"], "saw": saw}}).encode())
    time.sleep(0.05)
"#;

fn call(client: &mut Client, op: Opcode, body: Value) -> Value {
    request(client, op, &body)
}

/// Spawns [`ECHO`] as `name` for `secs` seconds; returns its id, and the
/// directory its script lies in (removed when the caller drops it).
fn spawn_echo(daemon: &Daemon, name: &str, secs: u32) -> (u64, tempfile::TempDir) {
    let dir = shared_dir();
    let script = write_script(dir.path(), "echo.py", &format!("{PY_KERNEL}{ECHO}"));
    let mut client = daemon.client();
    let reply = call(
        &mut client,
        Opcode::SPAWN,
        json!({"name": name, "script": script, "args": [secs.to_string()]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    (reply["id"].as_u64().unwrap(), dir)
}

/// RECV until `n` messages have come (within ten seconds).
fn receive(client: &mut Client, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {got:?} came");
        let reply = call(client, Opcode::RECV, json!({"max": 10}));
        assert_eq!(reply["success"], true, "{reply}");
        got.extend(reply["messages"].as_array().unwrap().iter().cloned());
        std::thread::sleep(Duration::from_millis(50));
    }
    got
}

#[test]
fn an_operator_and_its_worker_talk_as_clove_ipc_test_does() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut main = daemon.client();
    let registered = call(&mut main, Opcode::REGISTER, json!({"name": "ipc-main"}));
    assert_eq!(registered["success"], true, "{registered}");
    assert_eq!(registered["name"], "ipc-main");
    let main_id = registered["agent_id"].as_u64().unwrap();
    assert!(
        main_id >= 1_000_000,
        "an operator connection's id: {main_id}"
    );
    let (worker, _script_dir) = spawn_echo(&daemon, "ipc-worker", 20);
    // Its SPAWN name reaches it before it registers anything.
    let by_name = call(
        &mut main,
        Opcode::SEND,
        json!({"message": {"task": "process", "data": [1, 2, 3]}, "to_name": "ipc-worker"}),
    );
    assert_eq!(
        by_name,
        json!({"success": true, "delivered_to": worker}),
        "{by_name}"
    );
    let by_id = call(
        &mut main,
        Opcode::SEND,
        json!({"message": {"task": "calculate", "value": 42}, "to": worker}),
    );
    assert_eq!(by_id["success"], true, "{by_id}");
    let answers = receive(&mut main, 2);
    for answer in &answers {
        assert_eq!(answer["from"], worker, "{answer}");
        assert_eq!(answer["from_id"], worker, "{answer}");
        assert_eq!(answer["from_name"], "ipc-worker", "{answer}");
        assert_eq!(answer["from_kind"], "agent", "{answer}");
        let saw = &answer["message"]["saw"];
        assert_eq!(saw["from_id"], main_id, "{answer}");
        assert_eq!(saw["from"], main_id, "{answer}");
        assert_eq!(saw["from_name"], "ipc-main", "{answer}");
        assert_eq!(saw["from_kind"], "operator", "{answer}");
    }
    assert_eq!(answers[0]["message"]["echo"]["task"], "process");
    assert_eq!(answers[1]["message"]["echo"]["value"], 42);
    let broadcast = call(
        &mut main,
        Opcode::BROADCAST,
        json!({"message": {"event": "shutdown_warning"}, "include_self": false}),
    );
    assert_eq!(
        broadcast,
        json!({"success": true, "delivered_count": 1, "full_count": 0})
    );
    let with_self = call(
        &mut main,
        Opcode::BROADCAST,
        json!({"message": {"event": "again"}, "include_self": true}),
    );
    assert_eq!(with_self["delivered_count"], 2, "{with_self}");
    let everything = receive(&mut main, 3);
    let own = everything
        .iter()
        .find(|m| m["from_id"] == main_id)
        .expect("its own copy");
    assert_eq!(own["message"], json!({"event": "again"}));
    // Nothing waits for a Clove client that sends nothing: `{}` and an
    // empty payload both answer at once.
    let empty = call(&mut main, Opcode::RECV, json!({}));
    assert_eq!(empty["success"], true, "{empty}");
}

#[test]
fn a_forged_sender_is_refused_and_a_huge_max_is_capped() {
    let daemon = Daemon::start();
    let mut main = daemon.client();
    let own_id = call(&mut main, Opcode::HELLO, json!({}))["agent_id"].clone();
    for forged in ["from", "from_id", "from_name", "sender"] {
        let mut body = json!({"message": 1, "to": own_id});
        body[forged] = json!(1);
        let reply = call(&mut main, Opcode::SEND, body);
        refused(&reply, "bad_request", forged);
    }
    for n in 0..150 {
        let sent = call(
            &mut main,
            Opcode::SEND,
            json!({"message": {"n": n}, "to": own_id}),
        );
        assert_eq!(sent["success"], true, "{sent}");
    }
    let taken = call(&mut main, Opcode::RECV, json!({"max": 1_000_000_000u64}));
    assert_eq!(taken["count"], 100, "RECV's `max` is capped");
    assert_eq!(taken["remaining"], 50, "{}", taken["remaining"]);
    assert_eq!(taken["messages"][0]["message"], json!({"n": 0}));
    assert_eq!(taken["messages"][0]["from_id"], own_id);
    let rest = call(&mut main, Opcode::RECV, json!({"max": -3}));
    assert_eq!(
        (rest["count"].clone(), rest["remaining"].clone()),
        (json!(0), json!(50))
    );
    let big = "x".repeat(70_000);
    let too_big = call(
        &mut main,
        Opcode::SEND,
        json!({"message": big, "to": own_id}),
    );
    refused(&too_big, "limit_exceeded", "message");
}

#[test]
fn a_flood_into_a_mailbox_is_refused_busy_and_memory_stays_bounded() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut main = daemon.client();
    // A worker that never reads its mailbox.
    let (sleeper, _) = act(&daemon, "sleeper", json!({}), json!([]));
    let mut delivered = 0;
    let mut busy = None;
    for n in 0..1100 {
        let reply = call(
            &mut main,
            Opcode::SEND,
            json!({"message": {"n": n}, "to": sleeper}),
        );
        if reply["success"] == true {
            delivered += 1;
        } else {
            busy = Some(reply);
            break;
        }
    }
    assert_eq!(delivered, 1000, "a mailbox holds 1000 messages");
    refused(&busy.unwrap(), "busy", "full");
    // Bytes are bounded too: big messages fill another agent's mailbox
    // long before 1000 of them, and the kernel holds no more than that.
    let (big_sink, _) = act(&daemon, "big-sink", json!({}), json!([]));
    let rss_before = daemon.rss_kib();
    let chunk = "y".repeat(60_000);
    let mut kept = 0;
    for _ in 0..200 {
        let reply = call(
            &mut main,
            Opcode::SEND,
            json!({"message": chunk, "to": big_sink}),
        );
        if reply["success"] != true {
            refused(&reply, "busy", "full");
            break;
        }
        kept += 1;
    }
    assert!(kept < 100, "{kept} messages of 60 kB fit in one mailbox");
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 << 10, "the kernel grew by {grown} KiB");
}

#[test]
fn names_are_reserved_and_squatting_is_refused() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut boss = daemon.client();
    let mut rival = daemon.client();
    assert_eq!(
        call(&mut boss, Opcode::REGISTER, json!({"name": "boss"}))["success"],
        true
    );
    let squat = call(&mut rival, Opcode::REGISTER, json!({"name": "boss"}));
    refused(&squat, "already_exists", "boss");
    let (keeper, _) = act(&daemon, "keeper", json!({}), json!([]));
    let (squatter, replies) = act(
        &daemon,
        "squatter",
        json!({}),
        json!([
            [REGISTER, {"name": "keeper"}],
            [REGISTER, {"name": "boss"}],
            [REGISTER, {"name": "squatter"}],
            [REGISTER, {"name": "nick"}],
        ]),
    );
    refused(&replies[0]["reply"], "already_exists", "SPAWN name");
    refused(&replies[1]["reply"], "already_exists", "boss");
    assert_eq!(replies[2]["reply"]["agent_id"], squatter, "{replies:?}");
    assert_eq!(replies[3]["reply"]["replaced"], "squatter", "{replies:?}");
    // The operator cannot take an agent's SPAWN name either.
    let taken = call(&mut rival, Opcode::REGISTER, json!({"name": "keeper"}));
    refused(&taken, "already_exists", &keeper.to_string());
    // A name sent to reaches its holder: "nick" is the squatter's now.
    let sent = call(
        &mut boss,
        Opcode::SEND,
        json!({"message": 1, "to_name": "nick"}),
    );
    assert_eq!(sent["delivered_to"], squatter, "{sent}");
    // Registering again replaces one's own name, and a closed connection's
    // name is free.
    let renamed = call(&mut boss, Opcode::REGISTER, json!({"name": "chief"}));
    assert_eq!(renamed["replaced"], "boss", "{renamed}");
    assert_eq!(
        call(&mut rival, Opcode::REGISTER, json!({"name": "boss"}))["success"],
        true
    );
    drop(boss);
    until(
        "a closed connection's name is free",
        Duration::from_secs(5),
        || call(&mut rival, Opcode::REGISTER, json!({"name": "chief"}))["success"] == true,
    );
    // An agent's name goes when it ends.
    let killed = call(
        &mut rival,
        Opcode::KILL,
        json!({"id": squatter, "grace_ms": 0}),
    );
    assert_eq!(killed["success"], true, "{killed}");
    until(
        "an ended agent's name is free",
        Duration::from_secs(10),
        || call(&mut rival, Opcode::REGISTER, json!({"name": "nick"}))["success"] == true,
    );
    let gone = call(
        &mut rival,
        Opcode::SEND,
        json!({"message": 1, "to": squatter}),
    );
    refused(&gone, "not_found", "no live agent");
}

#[test]
fn an_agent_messages_its_family_and_its_whole_tree_only_with_ipc() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut main = daemon.client();
    let main_id = call(&mut main, Opcode::REGISTER, json!({"name": "main"}))["agent_id"].clone();
    let (cousin, _) = act(&daemon, "cousin", json!({}), json!([]));
    let (_, plain) = act(
        &daemon,
        "plain",
        json!({}),
        json!([
            [SEND, {"message": "hi", "to_name": "cousin"}],
            [SEND, {"message": "hi", "to": cousin}],
            [SEND, {"message": "hi", "to_name": "main"}],
            [BROADCAST, {"message": "all"}],
        ]),
    );
    refused(&plain[0]["reply"], "permission_denied", "permissions.ipc");
    refused(&plain[1]["reply"], "permission_denied", "permissions.ipc");
    assert_eq!(plain[2]["reply"]["delivered_to"], main_id, "{plain:?}");
    assert_eq!(plain[3]["reply"]["delivered_count"], 1, "the operator only");
    let (_, widened) = act(
        &daemon,
        "widened",
        json!({"permissions": {"ipc": true}}),
        json!([
            [SEND, {"message": "hi", "to": cousin}],
            [0x40, {}],
        ]),
    );
    assert_eq!(widened[0]["reply"]["delivered_to"], cousin, "{widened:?}");
    assert_eq!(
        widened[1]["reply"]["permissions"]["ipc"], true,
        "{widened:?}"
    );
    // A child is held to its parent's: no `ipc` it does not have.
    let (_, parent) = act(
        &daemon,
        "parent",
        json!({"permissions": {"spawn": true}}),
        json!([[0x10, {"name": "kid", "command": ["/bin/sleep", "5"],
                       "permissions": {"ipc": true}}]]),
    );
    refused(&parent[0]["reply"], "permission_denied", "permissions.ipc");
}

#[test]
fn another_uids_tree_is_out_of_reach() {
    require_root!("a client as another user");
    let daemon = Daemon::start();
    let mut main = daemon.client();
    let main_id = call(&mut main, Opcode::REGISTER, json!({"name": "main"}))["agent_id"].clone();
    let (worker, _) = act(&daemon, "worker", json!({}), json!([]));
    let calls = json!([
        [SEND, {"message": "x", "to": worker}],
        [SEND, {"message": "x", "to_name": "worker"}],
        [SEND, {"message": "x", "to": main_id}],
        [SEND, {"message": "x", "to_name": "main"}],
        [BROADCAST, {"message": "x"}],
        [REGISTER, {"name": "main"}],
    ]);
    let replies = calls_as_another_uid(&daemon, &calls);
    for reply in &replies[..4] {
        refused(reply, "not_found", "in this tree");
    }
    assert_eq!(replies[4]["delivered_count"], 0, "{replies:?}");
    // Its own tree has its own names.
    assert_eq!(replies[5]["success"], true, "{replies:?}");
    let nothing = call(&mut main, Opcode::RECV, json!({}));
    assert_eq!(nothing["count"], 0, "{nothing}");
}

/// Python on an EXEC run's own kernel connection: `call(op, payload)`.
const RUN_CALL: &str = r#"
import json, os, socket, struct
_k = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))
def call(op, payload):
    data = json.dumps(payload).encode()
    _k.sendall(struct.pack('<IIBQ', 0x41474E54, 0, op, len(data)) + data)
    head = b''
    while len(head) < 17:
        head += _k.recv(17 - len(head))
    n = struct.unpack('<IIBQ', head)[3]
    body = b''
    while len(body) < n:
        body += _k.recv(n - len(body))
    return json.loads(body)
"#;

#[test]
fn a_runs_messages_carry_the_runs_identity_not_its_callers() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut main = daemon.client();
    let main_id = call(&mut main, Opcode::REGISTER, json!({"name": "main"}))["agent_id"].clone();
    let (worker, _) = act(&daemon, "worker", json!({}), json!([]));
    let code = format!(
        "{RUN_CALL}\nprint(json.dumps([\
         call({SEND}, {{'message': 'from the run', 'to': {main_id}}}),\
         call({SEND}, {{'message': 'x', 'to': {worker}}}),\
         call({SEND}, {{'message': 'x', 'to': {main_id}, 'from_id': {main_id}}}),\
         call({REGISTER}, {{'name': 'runner'}}),\
         call({RECV}, {{}})]))\n"
    );
    let ran = call(&mut main, Opcode::EXEC, json!({"code": code}));
    let tries: Value = serde_json::from_str(ran["stdout"].as_str().unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}: {ran}"));
    assert_eq!(tries[0]["delivered_to"], main_id, "{tries}");
    refused(&tries[1], "permission_denied", "EXEC run");
    refused(&tries[2], "bad_request", "from_id");
    refused(&tries[3], "permission_denied", "EXEC run");
    assert_eq!(tries[4]["count"], 0, "{tries}");
    let got = call(&mut main, Opcode::RECV, json!({}));
    let message = &got["messages"][0];
    assert_eq!(message["message"], "from the run", "{got}");
    assert_eq!(message["from_kind"], "run", "{got}");
    assert_ne!(message["from_id"], main_id, "a run is never its caller");
    assert!(message["from_id"].as_u64().unwrap() >= 1_000_000, "{got}");
    assert_eq!(got["count"], 1, "{got}");
}
