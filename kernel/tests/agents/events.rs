//! SUBSCRIBE, UNSUBSCRIBE, POLL and EMIT: events, as the Clove SDK calls
//! them — the fields its test reads, what arrives of agents' lives, who
//! sees whose events (an agent its own tree, an operator its own uid's),
//! what a forged event gets, and the bounds of a queue and of a POLL.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};
use agentos_test_support::{
    act, agent_log_with_line, py_frames, request, require_root, shared_dir, wait_for_state,
    write_script, Daemon, PY_KERNEL,
};
use serde_json::{json, Value};

use super::{refused, reply};

const EMIT: u8 = 0x63;

fn poll(client: &mut Client, max: u64) -> Value {
    request(client, Opcode::POLL, &json!({ "max": max }))
}

/// Every event POLL returns within `within` until `done` holds of them.
fn poll_until(
    client: &mut Client,
    within: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    loop {
        let polled = poll(client, 100);
        events.extend(polled["events"].as_array().unwrap().iter().cloned());
        if done(&events) {
            return events;
        }
        assert!(Instant::now() < deadline, "never came: {events:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `events` has one of type `kind` about the agent named `name`.
fn has(events: &[Value], kind: &str, name: &str) -> bool {
    events
        .iter()
        .any(|e| e["type"] == kind && e["data"]["name"] == name)
}

#[test]
fn each_call_answers_the_fields_the_clove_sdk_reads() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let subscribed = request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]}),
    );
    assert_eq!(
        subscribed,
        json!({"success": true, "subscribed": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]})
    );
    let data = json!({"test_key": "test_value", "count": 42});
    let emit = client
        .call(
            Opcode::EMIT,
            &serde_json::to_vec(&json!({"event_type": "CUSTOM", "data": data})).unwrap(),
        )
        .unwrap();
    let me = emit.agent_id;
    let emitted: Value = serde_json::from_slice(&emit.payload).unwrap();
    assert_eq!(
        emitted,
        json!({"success": true, "event": "CUSTOM", "custom_type": "CUSTOM", "delivered_to": 1})
    );
    let polled = poll(&mut client, 10);
    assert_eq!(polled["success"], true, "{polled}");
    assert_eq!(
        (polled["count"].clone(), polled["dropped"].clone()),
        (json!(1), json!(0))
    );
    let event = &polled["events"][0];
    assert_eq!(event["type"], "CUSTOM", "{event}");
    assert_eq!(event["custom_type"], "CUSTOM", "{event}");
    assert_eq!(event["data"]["test_key"], "test_value", "{event}");
    assert_eq!(event["data"]["count"], 42, "{event}");
    assert_eq!(
        event["source_agent_id"], me,
        "the kernel's idea of the emitter"
    );
    assert!(
        event["timestamp"].as_u64().unwrap() > 1_700_000_000_000,
        "{event}"
    );
    let unsubscribed = request(
        &mut client,
        Opcode::UNSUBSCRIBE,
        &json!({"event_types": ["CUSTOM"]}),
    );
    assert_eq!(
        unsubscribed,
        json!({"success": true, "unsubscribed": ["CUSTOM"],
               "subscribed": ["AGENT_SPAWNED", "AGENT_EXITED"]})
    );
    let unheard = request(&mut client, Opcode::EMIT, &json!({"event_type": "CUSTOM"}));
    assert_eq!(unheard["delivered_to"], 0, "{unheard}");
    // A subscription is its connection's: another one hears nothing.
    let mut other = daemon.client();
    assert_eq!(poll(&mut other, 10)["count"], 0);
}

#[test]
fn a_forged_kernel_event_is_refused_and_a_claimed_source_is_unknown() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for kernel in [
        "AGENT_EXITED",
        "AGENT_SPAWNED",
        "AGENT_OOM_KILLED",
        "TASK_ENDED",
    ] {
        let forged = request(
            &mut client,
            Opcode::EMIT,
            &json!({"event_type": kernel, "data": {"agent_id": 1}}),
        );
        refused(&forged, "permission_denied", kernel);
    }
    let claimed = request(
        &mut client,
        Opcode::EMIT,
        &json!({"event_type": "x", "source_agent_id": 0}),
    );
    refused(&claimed, "bad_request", "source_agent_id");
    let huge = request(
        &mut client,
        Opcode::EMIT,
        &json!({"event_type": "x", "data": "y".repeat(70_000)}),
    );
    refused(&huge, "limit_exceeded", "`data`");
    let nothing = request(&mut client, Opcode::SUBSCRIBE, &json!({"event_types": []}));
    refused(&nothing, "bad_request", "event_types");
    let unknown = request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"types": ["CUSTOM"]}),
    );
    refused(&unknown, "bad_request", "types");
}

#[test]
fn a_full_queue_drops_the_oldest_with_a_count_and_poll_is_capped() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let subscribed = request(&mut client, Opcode::SUBSCRIBE, &json!({"event": "tick"}));
    assert_eq!(subscribed["subscribed"], json!(["tick"]), "{subscribed}");
    for n in 0..1005 {
        let emitted = request(
            &mut client,
            Opcode::EMIT,
            &json!({"event_type": "tick", "data": n}),
        );
        assert_eq!(emitted["delivered_to"], 1, "{emitted}");
    }
    let first = poll(&mut client, 1_000_000_000);
    assert_eq!(first["count"], 500, "POLL's max is capped");
    assert_eq!(first["dropped"], 5, "the queue holds 1000");
    assert_eq!(first["pending"], 500);
    assert_eq!(first["events"][0]["data"], 5, "the oldest went first");
    let second = poll(&mut client, 1_000_000_000);
    assert_eq!(
        (second["count"].clone(), second["dropped"].clone()),
        (json!(500), json!(0))
    );
    assert_eq!(second["events"][499]["data"], 1004);
    // Another type's events never reach a subscription to `tick`.
    request(&mut client, Opcode::EMIT, &json!({"event_type": "tock"}));
    assert_eq!(poll(&mut client, 10)["count"], 0);
}

#[test]
fn a_visible_agents_spawn_and_exit_arrive() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_SPAWNED", "AGENT_EXITED"]}),
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "brief", "command": ["/bin/sh", "-c", "exit 3"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].clone();
    let events = poll_until(&mut client, Duration::from_secs(10), |events| {
        has(events, "AGENT_EXITED", "brief")
    });
    let kinds: Vec<&Value> = events.iter().map(|e| &e["type"]).collect();
    assert_eq!(kinds, ["AGENT_SPAWNED", "AGENT_EXITED"], "{events:?}");
    assert_eq!(events[0]["data"]["agent_id"], id, "{events:?}");
    assert_eq!(events[0]["source_agent_id"], 0, "the kernel's own");
    assert_eq!(events[1]["data"]["exit_code"], 3, "{events:?}");
    assert_eq!(events[1]["data"]["state"], "exited", "{events:?}");
}

/// An agent that subscribes, waits for a file `go` beside it, spawns a
/// child that exits 4, emits `from.watcher`, and prints what it heard
/// until its child's exit.
const WATCHER: &str = r#"
import time
here = os.path.dirname(os.path.abspath(__file__))
_, r = call(0x60, {"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]})
print("SUBSCRIBED " + r.decode(), flush=True)
while not os.path.exists(os.path.join(here, "go")):
    time.sleep(0.02)
_, r = call(0x10, {"name": "watched-child", "command": ["/bin/sh", "-c", "exit 4"]})
print("CHILD " + r.decode(), flush=True)
call(0x63, {"event_type": "from.watcher", "data": {"n": 1}})
events = []
deadline = time.time() + 15
while time.time() < deadline:
    _, r = call(0x62, {"max": 100})
    events += json.loads(r)["events"]
    if any(e["type"] == "AGENT_EXITED" and e["data"].get("name") == "watched-child" for e in events):
        break
    time.sleep(0.02)
print("EVENTS " + json.dumps(events), flush=True)
print("DONE", flush=True)
time.sleep(30)
"#;

#[test]
fn an_agent_hears_of_its_own_tree_only() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]}),
    );
    let dir = shared_dir();
    let script = write_script(dir.path(), "watcher.py", &format!("{PY_KERNEL}{WATCHER}"));
    let watcher = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "watcher", "script": script, "permissions": {"spawn": true}}),
    );
    assert_eq!(watcher["success"], true, "{watcher}");
    let watcher_id = watcher["id"].as_u64().unwrap();
    wait_for_line_starting(&daemon, "watcher", watcher_id, "SUBSCRIBED ");
    // A stranger (outside the watcher's tree) emits, tries to forge its
    // exit, and is killed: the watcher must hear none of it.
    let (stranger, replies) = act(
        &daemon,
        "stranger",
        json!({}),
        json!([
            [EMIT, {"event_type": "from.stranger", "data": {"secret": 1}}],
            [EMIT, {"event_type": "AGENT_EXITED", "data": {"agent_id": watcher_id, "name": "watcher"}}],
        ]),
    );
    assert_eq!(
        reply(&replies, 0)["delivered_to"],
        1,
        "the operator only: {replies:?}"
    );
    assert_eq!(replies[0]["agent_id"], stranger, "{replies:?}");
    refused(reply(&replies, 1), "permission_denied", "AGENT_EXITED");
    request(
        &mut client,
        Opcode::KILL,
        &json!({"id": stranger, "grace_ms": 0}),
    );
    wait_for_state(&mut client, stranger, &["killed"], Duration::from_secs(10));
    std::fs::write(dir.path().join("go"), "").unwrap();
    let log = agent_log_with_line(&daemon, "watcher", watcher_id, "DONE");
    let heard: Vec<Value> = log
        .lines()
        .find_map(|l| l.strip_prefix("EVENTS "))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap();
    assert!(has(&heard, "AGENT_SPAWNED", "watched-child"), "{heard:?}");
    let exit = heard.iter().find(|e| e["type"] == "AGENT_EXITED").unwrap();
    assert_eq!(exit["data"]["exit_code"], 4, "{heard:?}");
    let own = heard.iter().find(|e| e["type"] == "CUSTOM").unwrap();
    assert_eq!(own["custom_type"], "from.watcher", "{heard:?}");
    assert_eq!(own["source_agent_id"], watcher_id, "{heard:?}");
    let text = serde_json::to_string(&heard).unwrap();
    assert!(!text.contains("stranger"), "{heard:?}");
    assert_eq!(heard.len(), 3, "{heard:?}");
    // The operator of the tree heard all of it, the stranger's included,
    // and no forged exit.
    let all = poll_until(&mut client, Duration::from_secs(5), |events| {
        has(events, "AGENT_EXITED", "watched-child")
    });
    assert!(has(&all, "AGENT_SPAWNED", "stranger"), "{all:?}");
    assert!(has(&all, "AGENT_EXITED", "stranger"), "{all:?}");
    let exits: Vec<&Value> = all.iter().filter(|e| e["type"] == "AGENT_EXITED").collect();
    assert!(exits.iter().all(|e| e["source_agent_id"] == 0), "{all:?}");
    assert!(
        !exits.iter().any(|e| e["data"]["name"] == "watcher"),
        "{all:?}"
    );
    let custom: Vec<&Value> = all.iter().filter(|e| e["type"] == "CUSTOM").collect();
    assert_eq!(custom.len(), 2, "{all:?}");
    assert_eq!(custom[0]["source_agent_id"], stranger, "{all:?}");
}

/// Waits until agent `id`'s log has a line starting with `prefix`.
fn wait_for_line_starting(daemon: &Daemon, name: &str, id: u64, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = agentos_test_support::agent_log(daemon, name, id);
        if log.lines().any(|l| l.starts_with(prefix)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never wrote {prefix:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn another_operator_uid_hears_nothing_of_a_tree_and_is_heard_by_no_other() {
    require_root!("a client as another user");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]}),
    );
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    // Subscribes, says so, waits for a line on stdin, then emits and polls.
    let script = format!(
        "{}\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
         def call(op, body):\n    send(s, op, body)\n    print(recv(s)[2].decode(), flush=True)\n\
         call(0x60, {{'event_types': ['AGENT_SPAWNED', 'AGENT_EXITED', 'CUSTOM']}})\n\
         sys.stdin.readline()\n\
         call(0x63, {{'event_type': 'from.nobody'}})\n\
         call(0x62, {{'max': 100}})\n",
        py_frames!()
    );
    let mut nobody = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&daemon.socket)
        .uid(65534)
        .gid(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(nobody.stdout.take().unwrap()).lines();
    let subscribed: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(subscribed["success"], true, "{subscribed}");
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "roots", "command": ["/bin/sh", "-c", "exit 0"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let mine = poll_until(&mut client, Duration::from_secs(10), |events| {
        has(events, "AGENT_EXITED", "roots")
    });
    let emitted = request(
        &mut client,
        Opcode::EMIT,
        &json!({"event_type": "from.root"}),
    );
    assert_eq!(emitted["delivered_to"], 1, "root's own only: {emitted}");
    assert_eq!(poll(&mut client, 10)["count"], 1);
    nobody.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let theirs: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(theirs["delivered_to"], 1, "its own only: {theirs}");
    let heard: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(heard["count"], 1, "{heard}");
    assert_eq!(heard["events"][0]["custom_type"], "from.nobody", "{heard}");
    assert!(nobody.wait().unwrap().success());
    assert_eq!(
        poll(&mut client, 10)["count"],
        0,
        "root hears nothing of it"
    );
    assert_eq!(mine.len(), 2, "{mine:?}");
}

/// An EXEC run's code: subscribes on its own kernel connection, waits
/// while the test makes events, emits, tries to forge, and polls.
const RUN: &str = r#"
import json, os, socket, struct, time
s = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
def call(op, body):
    p = json.dumps(body).encode()
    s.sendall(struct.pack("<IIBQ", 0x41474E54, 0, op, len(p)) + p)
    h = b""
    while len(h) < 17: h += s.recv(17 - len(h))
    n = struct.unpack("<Q", h[9:17])[0]
    b = b""
    while len(b) < n: b += s.recv(n - len(b))
    return json.loads(b)
out = {"sub": call(0x60, {"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]})}
print("subscribed", flush=True)
time.sleep(3)
out["emit"] = call(0x63, {"event_type": "from.run", "data": 1})
out["forged"] = call(0x63, {"event_type": "AGENT_SPAWNED"})
out["poll"] = call(0x62, {"max": 1000000000})
print(json.dumps(out))
"#;

#[test]
fn a_run_hears_only_what_a_sandboxed_agent_of_its_caller_would() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_SPAWNED", "AGENT_EXITED", "CUSTOM"]}),
    );
    let mut runner = daemon.client();
    let run = json!({"code": RUN, "timeout_ms": 30000});
    runner
        .send(Opcode::EXEC, run.to_string().as_bytes())
        .unwrap();
    // The caller's own agent and the caller's own event: the run hears
    // neither.
    std::thread::sleep(Duration::from_millis(500));
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "callers", "command": ["/bin/sh", "-c", "exit 0"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    request(
        &mut client,
        Opcode::EMIT,
        &json!({"event_type": "from.caller"}),
    );
    let mut heard = poll_until(&mut client, Duration::from_secs(10), |events| {
        has(events, "AGENT_EXITED", "callers")
    });
    let done: Value = serde_json::from_slice(&runner.recv().unwrap().payload).unwrap();
    assert_eq!(done["success"], true, "{done}");
    let stdout = done["stdout"].as_str().unwrap();
    let got: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(got["sub"]["success"], true, "{got}");
    assert_eq!(
        got["emit"]["delivered_to"], 2,
        "itself and its caller's uid: {got}"
    );
    refused(&got["forged"], "permission_denied", "AGENT_SPAWNED");
    let polled = &got["poll"];
    assert_eq!(polled["count"], 1, "its own event only: {got}");
    assert_eq!(polled["events"][0]["custom_type"], "from.run", "{got}");
    // The caller heard the run's event after its agent had ended: the run
    // polled once everything it must not hear had happened.
    heard.extend(
        poll(&mut client, 100)["events"]
            .as_array()
            .unwrap()
            .iter()
            .cloned(),
    );
    let order: Vec<String> = heard
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["custom_type"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(order.last().unwrap(), "CUSTOM from.run", "{heard:?}");
    let mut rest = order[..order.len() - 1].to_vec();
    rest.sort();
    assert_eq!(
        rest,
        ["AGENT_EXITED ", "AGENT_SPAWNED ", "CUSTOM from.caller"],
        "{heard:?}"
    );
}

#[test]
fn a_tasks_end_arrives_at_its_owners_connections() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let mut other = daemon.client();
    for connection in [&mut client, &mut other] {
        let subscribed = request(
            connection,
            Opcode::SUBSCRIBE,
            &json!({"event": "TASK_ENDED"}),
        );
        assert_eq!(subscribed["success"], true, "{subscribed}");
    }
    let dispatched = request(
        &mut client,
        Opcode::TASK,
        &json!({"op": "dispatch", "kind": "exec", "label": "brief",
                "request": {"code": "print(1)"}}),
    );
    assert_eq!(dispatched["success"], true, "{dispatched}");
    let id = dispatched["task_id"].clone();
    // Another connection of the same uid is the same owner.
    let heard = poll_until(&mut other, Duration::from_secs(20), |events| {
        !events.is_empty()
    });
    assert_eq!(heard[0]["type"], "TASK_ENDED", "{heard:?}");
    assert_eq!(
        heard[0]["data"],
        json!({"task_id": id, "kind": "exec", "label": "brief", "state": "completed"})
    );
    assert_eq!(poll(&mut client, 10)["count"], 1);
}

#[test]
fn pause_and_resume_are_told_with_who_asked() {
    require_root!("the cgroup freezer");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_PAUSED", "AGENT_RESUMED"]}),
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "frozen", "command": ["/bin/sleep", "30"]}),
    );
    let id = spawned["id"].clone();
    let paused = client
        .call(Opcode::PAUSE, json!({"id": id}).to_string().as_bytes())
        .unwrap();
    let me = paused.agent_id;
    let resumed = request(&mut client, Opcode::RESUME, &json!({"name": "frozen"}));
    assert_eq!(resumed["state"], "running", "{resumed}");
    let heard = poll(&mut client, 10);
    let kinds: Vec<&Value> = heard["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["type"])
        .collect();
    assert_eq!(kinds, ["AGENT_PAUSED", "AGENT_RESUMED"], "{heard}");
    assert_eq!(heard["events"][0]["data"]["agent_id"], id, "{heard}");
    assert_eq!(heard["events"][0]["data"]["by"], me, "{heard}");
    assert_eq!(heard["events"][1]["data"]["state"], "running", "{heard}");
}

#[test]
fn an_oom_kill_is_told_once_then_the_exit() {
    require_root!("cgroup memory limits");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    request(
        &mut client,
        Opcode::SUBSCRIBE,
        &json!({"event_types": ["AGENT_OOM_KILLED", "AGENT_EXITED"]}),
    );
    let dir = shared_dir();
    let hog = write_script(
        dir.path(),
        "hog.py",
        "hoard = []\nwhile True:\n    hoard.append(bytearray(10 << 20))\n",
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "hog", "script": hog, "limits": {"memory": 50u64 << 20}}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let heard = poll_until(&mut client, Duration::from_secs(10), |events| {
        has(events, "AGENT_EXITED", "hog")
    });
    let kinds: Vec<&Value> = heard.iter().map(|e| &e["type"]).collect();
    assert_eq!(kinds, ["AGENT_OOM_KILLED", "AGENT_EXITED"], "{heard:?}");
    assert_eq!(heard[1]["data"]["state"], "oom_killed", "{heard:?}");
}
