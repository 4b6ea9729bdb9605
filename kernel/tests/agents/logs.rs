//! LOGS (0x16) against a real agentosd: tails, reading on from an offset,
//! following until the agent ends, and agents that ask for logs that are
//! not theirs.

use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, act, request, shared_dir, wait_for_state, Daemon};
use serde_json::{json, Value};

const LOGS: u8 = 0x16;
const SOON: Duration = Duration::from_secs(20);

fn logs(daemon: &Daemon, body: Value) -> Value {
    request(&mut daemon.client(), Opcode::LOGS, &body)
}

/// Spawns `script` under `sh -c` as agent `name`; returns its id.
fn spawn_sh(daemon: &Daemon, name: &str, script: &str) -> u64 {
    let reply = request(
        &mut daemon.client(),
        Opcode::SPAWN,
        &json!({"name": name, "command": ["/bin/sh", "-c", script]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    reply["id"].as_u64().unwrap()
}

/// Waits until the agent's log holds `text`; returns the tail reply.
fn wait_for_text(daemon: &Daemon, name: &str, text: &str) -> Value {
    let deadline = Instant::now() + SOON;
    loop {
        let reply = logs(daemon, json!({"name": name, "lines": 1000}));
        if reply["text"].as_str().unwrap_or("").contains(text) {
            return reply;
        }
        assert!(
            Instant::now() < deadline,
            "{text:?} not in the log: {reply}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_tail_gives_the_last_lines_and_where_they_end() {
    let daemon = Daemon::start();
    let id = spawn_sh(
        &daemon,
        "counter",
        "for i in 1 2 3 4 5; do echo line $i; done; echo to stderr >&2; sleep 1000",
    );
    let all = wait_for_text(&daemon, "counter", "to stderr");
    assert_eq!(all["success"], true, "{all}");
    assert_eq!(all["id"], id);
    assert_eq!(all["name"], "counter");
    assert_eq!(all["state"], "running");
    assert_eq!(all["ended"], false);
    assert_eq!(all["truncated"], false);
    let text = all["text"].as_str().unwrap();
    assert!(
        text.contains("line 1\n") && text.contains("line 5\n"),
        "{text}"
    );
    let two = logs(&daemon, json!({"id": id, "lines": 2}));
    assert_eq!(two["text"], "line 5\nto stderr\n", "{two}");
    assert_eq!(two["offset"], all["offset"]);
    // Reading on from the end gives nothing new; from an earlier offset,
    // the rest.
    let end = all["offset"].as_u64().unwrap();
    let nothing = logs(&daemon, json!({"id": id, "after": end}));
    assert_eq!(nothing["text"], "", "{nothing}");
    let rest = logs(&daemon, json!({"id": id, "after": end - 10}));
    assert_eq!(rest["text"], "to stderr\n", "{rest}");
    // An offset beyond the end (the log was cut) starts again at its start.
    let cut = logs(&daemon, json!({"id": id, "after": end + 1000}));
    assert_eq!(cut["truncated"], true, "{cut}");
    assert!(cut["text"].as_str().unwrap().contains("line 1"), "{cut}");
}

#[test]
fn a_follow_ends_when_the_agent_ends() {
    let daemon = Daemon::start();
    let id = spawn_sh(
        &daemon,
        "talker",
        "echo first; sleep 0.5; echo second; sleep 0.5; echo third; exit 4",
    );
    let mut text = String::new();
    let mut after: Option<u64> = Some(0);
    let mut replies = 0;
    let started = Instant::now();
    loop {
        let reply = logs(&daemon, json!({"id": id, "after": after, "follow": true}));
        assert_eq!(reply["success"], true, "{reply}");
        replies += 1;
        text.push_str(reply["text"].as_str().unwrap());
        after = reply["offset"].as_u64();
        if reply["ended"] == true {
            assert_eq!(reply["state"], "exited", "{reply}");
            break;
        }
        assert!(started.elapsed() < SOON, "the follow never ended: {text}");
    }
    assert_eq!(text, "first\nsecond\nthird\n");
    // It waited for output rather than spinning: a few replies, not hundreds.
    assert!(replies <= 10, "{replies} replies for three lines");
    // Following an agent that has ended answers at once.
    let again = logs(&daemon, json!({"id": id, "follow": true}));
    assert_eq!(again["ended"], true, "{again}");
}

#[test]
fn a_follow_with_nothing_new_answers_when_its_wait_is_over() {
    let daemon = Daemon::start();
    let id = spawn_sh(&daemon, "quiet", "echo hello; sleep 1000");
    let tail = wait_for_text(&daemon, "quiet", "hello");
    let asked = Instant::now();
    let reply = logs(
        &daemon,
        json!({"id": id, "after": tail["offset"], "follow": true, "wait_ms": 300}),
    );
    let waited = asked.elapsed();
    assert_eq!(reply["text"], "", "{reply}");
    assert_eq!(reply["ended"], false, "{reply}");
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    // A follow whose agent is killed meanwhile ends.
    let mut follower = daemon.client();
    let body = json!({"id": id, "after": tail["offset"], "follow": true, "wait_ms": 30000});
    let waiting = std::thread::spawn(move || request(&mut follower, Opcode::LOGS, &body));
    std::thread::sleep(Duration::from_millis(200));
    let killed = request(
        &mut daemon.client(),
        Opcode::KILL,
        &json!({"id": id, "grace_ms": 100}),
    );
    assert_eq!(killed["killed"], true, "{killed}");
    let ended = waiting.join().unwrap();
    assert_eq!(ended["ended"], true, "{ended}");
    assert_eq!(ended["state"], "killed", "{ended}");
}

#[test]
fn missing_agents_and_bad_requests() {
    let daemon = Daemon::start();
    for body in [json!({"name": "nobody"}), json!({"id": 999_999})] {
        let reply = logs(&daemon, body.clone());
        assert_eq!(reply["success"], false, "{body}: {reply}");
        assert_eq!(reply["code"], "not_found", "{body}: {reply}");
    }
    for (body, code) in [
        (json!({}), "bad_request"),
        (json!({"id": 1, "name": "a"}), "bad_request"),
        (json!({"name": "../../etc/passwd"}), "bad_request"),
        (json!({"id": 1, "lines": 1_000_000}), "limit_exceeded"),
        (json!({"id": 1, "wait_ms": 3_600_000}), "limit_exceeded"),
    ] {
        let reply = logs(&daemon, body.clone());
        assert_eq!(reply["code"], code, "{body}: {reply}");
    }
    let raw = request(&mut daemon.client(), Opcode::LOGS, &json!("not an object"));
    assert_eq!(raw["code"], "bad_request", "{raw}");
}

#[test]
fn an_agent_reads_its_own_log_and_its_childs_but_no_one_elses() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let secret = spawn_sh(&daemon, "secret", "echo the operator secret; sleep 1000");
    wait_for_text(&daemon, "secret", "secret");
    let (_, replies) = act(
        &daemon,
        "snoop",
        json!({"permissions": {"spawn": true}}),
        json!([
            [0x10, {"name": "snoop-child", "command": ["/bin/sh", "-c", "echo child says hi; sleep 1000"]}],
            [LOGS, {"name": "secret"}],
            [LOGS, {"id": secret}],
            [LOGS, {"id": secret, "after": 0, "follow": true, "wait_ms": 100}],
            [LOGS, {"name": "snoop"}],
        ]),
    );
    let reply = |n: usize| &replies[n]["reply"];
    assert_eq!(reply(0)["success"], true, "{}", reply(0));
    for n in 1..=3 {
        assert_eq!(reply(n)["code"], "not_found", "{}", reply(n));
        assert!(!reply(n).to_string().contains("operator secret"));
    }
    // The same words as for an agent that does not exist, but for the id.
    assert_eq!(reply(1)["error"], "no agent named \"secret\"");
    assert_eq!(reply(4)["success"], true, "{}", reply(4));
    assert_eq!(reply(4)["name"], "snoop");
    // Its own child's log is its to read.
    let child = reply(0)["id"].as_u64().unwrap();
    let (_, replies) = act(
        &daemon,
        "parent",
        json!({"permissions": {"spawn": true}}),
        json!([[LOGS, {"id": child}]]),
    );
    assert_eq!(
        replies[0]["reply"]["code"], "not_found",
        "another agent's child"
    );
    wait_for_state(&mut client, child, &["running"], SOON);
    // Its own child's log is its to read: it follows it until the child
    // has written.
    let (_, replies) = act(
        &daemon,
        "guardian",
        json!({"permissions": {"spawn": true}}),
        json!([
            [0x10, {"name": "kid", "command": ["/bin/sh", "-c", "echo kid output; sleep 1000"]}],
            [LOGS, {"name": "kid", "after": 0, "follow": true, "wait_ms": 10000}],
        ]),
    );
    assert_eq!(replies[1]["reply"]["success"], true, "{}", replies[1]);
    assert_eq!(
        replies[1]["reply"]["text"], "kid output\n",
        "{}",
        replies[1]
    );
}

#[test]
fn one_caller_has_at_most_sixteen_follows_waiting() {
    use agentos_test_support::{recv_json, send};
    let daemon = Daemon::start();
    let id = spawn_sh(&daemon, "silent", "sleep 1000");
    let mut raw = daemon.raw();
    let follow = json!({"id": id, "follow": true, "wait_ms": 500}).to_string();
    for _ in 0..17 {
        send(&mut raw, Opcode::LOGS, follow.as_bytes());
    }
    let replies: Vec<Value> = (0..17).map(|_| recv_json(&mut raw).1).collect();
    for reply in &replies[..16] {
        assert_eq!(reply["success"], true, "{reply}");
        assert_eq!(reply["text"], "", "{reply}");
    }
    assert_eq!(replies[16]["code"], "busy", "{}", replies[16]);
    // Another connection is another operator, with follows of its own.
    let other = logs(&daemon, json!({"id": id, "follow": true, "wait_ms": 100}));
    assert_eq!(other["success"], true, "{other}");
}

#[test]
fn a_new_kernels_agent_never_reads_an_earlier_kernels_log() {
    let mut daemon = Daemon::start();
    let first = spawn_sh(
        &daemon,
        "payroll",
        "echo API_KEY=sk-very-secret; sleep 1000",
    );
    wait_for_text(&daemon, "payroll", "sk-very-secret");
    daemon.signal(libc::SIGTERM);
    // The next kernel numbers its agents from 1 again: the same name and id
    // name the same file.
    daemon.restart("");
    let second = spawn_sh(&daemon, "payroll", "sleep 1000");
    assert_eq!(first, second, "the test needs the id reused");
    for body in [
        json!({"id": second}),
        json!({"id": second, "after": 0}),
        json!({"name": "payroll", "lines": 100000}),
    ] {
        let reply = logs(&daemon, body.clone());
        assert_eq!(reply["success"], true, "{body}: {reply}");
        assert_eq!(reply["text"], "", "{body}: {reply}");
    }
    // The operator still has it, beside the new one.
    let kept = daemon
        .dir
        .path()
        .join(format!("logs/payroll-{first}.log.prev"));
    assert!(std::fs::read_to_string(kept)
        .unwrap()
        .contains("sk-very-secret"));
}

/// An agent that spawns a child, then waits on 16 follows of the child's
/// log from one connection and asks a 17th on another: an agent has one
/// allowance, however many connections it opens (its children's follows
/// count in it too: they are keyed by the family's eldest).
const FAMILY_FOLLOWS: &str = concat!(
    agentos_test_support::py_frames!(),
    r#"
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AGENTOS_SOCKET"])
    return s
def reply(s):
    return json.loads(recv(s)[2])
first, second = connect(), connect()
send(first, 0x10, {"name": "quiet-kid", "command": ["/bin/sleep", "60"]})
kid = reply(first)["id"]
follow = {"id": kid, "follow": True, "wait_ms": 1500}
for _ in range(16):
    send(first, 0x16, follow)
send(second, 0x16, follow)
print("SEVENTEENTH " + json.dumps(reply(second)), flush=True)
codes = [reply(first).get("code", "ok") for _ in range(16)]
print("FIRST16 " + json.dumps(codes), flush=True)
"#
);

#[test]
fn an_agent_has_one_follow_allowance_across_its_connections() {
    let daemon = Daemon::start();
    let dir = shared_dir();
    let script = support::write_script(dir.path(), "family.py", FAMILY_FOLLOWS);
    let reply = request(
        &mut daemon.client(),
        Opcode::SPAWN,
        &json!({"name": "family", "script": script, "permissions": {"spawn": true}}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let log = wait_for_text(&daemon, "family", "FIRST16");
    let text = log["text"].as_str().unwrap();
    let line = |prefix: &str| -> Value {
        let found = text.lines().find_map(|l| l.strip_prefix(prefix)).unwrap();
        serde_json::from_str(found).unwrap()
    };
    assert_eq!(line("SEVENTEENTH ")["code"], "busy", "{text}");
    assert_eq!(line("FIRST16 "), json!(vec!["ok"; 16]), "{text}");
    // The operator is not held back by the agents' follows.
    let kid = logs(
        &daemon,
        json!({"name": "quiet-kid", "follow": true, "wait_ms": 100}),
    );
    assert_eq!(kid["success"], true, "{kid}");
}

#[test]
fn an_agent_asking_for_extreme_offsets_and_sizes_gets_bounded_answers() {
    let daemon = Daemon::start();
    let (id, replies) = act(
        &daemon,
        "extremes",
        json!({}),
        json!([
            [LOGS, {"name": "extremes", "after": u64::MAX}],
            [LOGS, {"name": "extremes", "lines": 100_000}],
            [LOGS, {"name": "extremes", "follow": true, "wait_ms": 0}],
            [LOGS, {"id": u64::from(u32::MAX) + 1}],
            [LOGS, {"id": u32::MAX}],
            [LOGS, {"name": "extremes", "lines": -1}],
        ]),
    );
    let reply = |n: usize| &replies[n]["reply"];
    // An offset past any log: read again from its start, and said so.
    assert_eq!(reply(0)["success"], true, "{}", reply(0));
    assert_eq!(reply(0)["truncated"], true, "{}", reply(0));
    assert_eq!(reply(0)["id"], id);
    assert_eq!(reply(1)["success"], true, "{}", reply(1));
    // A follow with no time to wait answers at the next look.
    assert_eq!(reply(2)["success"], true, "{}", reply(2));
    assert_eq!(reply(2)["ended"], false, "{}", reply(2));
    assert_eq!(reply(3)["code"], "bad_request", "{}", reply(3));
    assert_eq!(reply(4)["code"], "not_found", "{}", reply(4));
    assert_eq!(reply(5)["code"], "bad_request", "{}", reply(5));
}
