//! STORE, FETCH, DELETE and KEYS: the state store, as the Clove SDK calls
//! it — whose keys each caller reaches (its own, its tree's, never another
//! operator's), expiry across restarts, quotas, and what is refused.

use std::time::Duration;

use agentos_proto::{Client, Opcode};
use agentos_test_support::{
    act, agent_log_with_line, calls_as_another_uid, py_frames, request, require_root, shared_dir,
    until, write_script, Daemon, PY_KERNEL,
};
use serde_json::{json, Value};

use super::{refused, reply};

const STORE: u8 = 0x30;
const FETCH: u8 = 0x31;
const DELETE: u8 = 0x32;
const KEYS: u8 = 0x33;

fn store(client: &mut Client, body: Value) -> Value {
    request(client, Opcode::STORE, &body)
}

fn fetch(client: &mut Client, key: &str) -> Value {
    request(client, Opcode::FETCH, &json!({"key": key}))
}

/// Rows of the state store's table in `daemon`'s database for `space`.
fn rows_in(daemon: &Daemon, space: &str) -> i64 {
    let database = rusqlite::Connection::open(daemon.dir.path().join("state/tasks.db")).unwrap();
    database
        .query_row(
            "SELECT count(*) FROM state WHERE space = ?1",
            [space],
            |row| row.get(0),
        )
        .unwrap()
}

#[test]
fn each_call_answers_the_fields_the_clove_sdk_reads() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let value = json!({"message": "Hello from test", "number": 123, "nested": {"a": 1}});
    let stored = store(
        &mut client,
        json!({"key": "test:state:key", "value": value, "scope": "global"}),
    );
    assert_eq!(
        stored,
        json!({"success": true, "key": "test:state:key", "scope": "global"})
    );
    let lasting = store(
        &mut client,
        json!({"key": "test:ttl:key", "value": "expires soon", "ttl": 60}),
    );
    assert_eq!(lasting["success"], true, "{lasting}");
    assert!(lasting["expires_at"].as_str().unwrap().ends_with('Z'));
    let fetched = fetch(&mut client, "test:state:key");
    assert_eq!(fetched["success"], true, "{fetched}");
    assert_eq!(fetched["exists"], true, "{fetched}");
    assert_eq!(fetched["value"], value, "{fetched}");
    assert_eq!(fetched["scope"], "global", "{fetched}");
    let listed = request(&mut client, Opcode::KEYS, &json!({"prefix": "test:"}));
    assert_eq!(
        listed,
        json!({"success": true, "keys": ["test:state:key", "test:ttl:key"], "count": 2,
               "truncated": false})
    );
    // The SDK sends `{}` for no prefix; a raw client may send nothing.
    let everything = Client::call(&mut client, Opcode::KEYS, b"").unwrap();
    let everything: Value = serde_json::from_slice(&everything.payload).unwrap();
    assert_eq!(everything["count"], 2, "{everything}");
    let deleted = request(
        &mut client,
        Opcode::DELETE,
        &json!({"key": "test:state:key"}),
    );
    assert_eq!(
        deleted,
        json!({"success": true, "deleted": true, "scope": "global"})
    );
    let again = request(
        &mut client,
        Opcode::DELETE,
        &json!({"key": "test:state:key"}),
    );
    assert_eq!(again, json!({"success": true, "deleted": false}));
    let gone = fetch(&mut client, "test:state:key");
    assert_eq!(
        gone,
        json!({"success": true, "exists": false, "value": null})
    );
}

#[test]
fn an_agents_own_keys_are_its_alone_its_trees_are_shared_and_they_go_when_it_ends() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let (writer, wrote) = act(
        &daemon,
        "writer",
        json!({}),
        json!([
            [STORE, {"key": "k", "value": "writer's own", "scope": "agent"}],
            [STORE, {"key": "k", "value": "the tree's", "scope": "global"}],
            [STORE, {"key": "shared", "value": [1, 2], "scope": "global"}],
            [STORE, {"key": "note", "value": "session means agent", "scope": "session"}],
            [FETCH, {"key": "k"}],
            [FETCH, {"key": "k", "scope": "global"}],
            [KEYS, {}],
        ]),
    );
    assert_eq!(reply(&wrote, 3)["scope"], "agent", "{wrote:?}");
    // Its own key comes first: a shared one never hides it.
    assert_eq!(reply(&wrote, 4)["value"], "writer's own", "{wrote:?}");
    assert_eq!(reply(&wrote, 4)["scope"], "agent", "{wrote:?}");
    assert_eq!(reply(&wrote, 5)["value"], "the tree's", "{wrote:?}");
    assert_eq!(
        reply(&wrote, 6)["keys"],
        json!(["k", "note", "shared"]),
        "{wrote:?}"
    );
    let (_, sibling) = act(
        &daemon,
        "sibling",
        json!({}),
        json!([
            [FETCH, {"key": "k"}],
            [FETCH, {"key": "k", "scope": "agent"}],
            [FETCH, {"key": "note"}],
            [FETCH, {"key": "shared"}],
            [DELETE, {"key": "note"}],
        ]),
    );
    assert_eq!(reply(&sibling, 0)["value"], "the tree's", "{sibling:?}");
    assert_eq!(reply(&sibling, 0)["scope"], "global", "{sibling:?}");
    assert_eq!(reply(&sibling, 1)["exists"], false, "{sibling:?}");
    assert_eq!(reply(&sibling, 2)["exists"], false, "{sibling:?}");
    assert_eq!(reply(&sibling, 3)["value"], json!([1, 2]), "{sibling:?}");
    assert_eq!(reply(&sibling, 4)["deleted"], false, "{sibling:?}");
    // The operator that started the tree shares it, and not the agent's own.
    assert_eq!(fetch(&mut client, "shared")["value"], json!([1, 2]));
    assert_eq!(fetch(&mut client, "k")["value"], "the tree's");
    assert_eq!(fetch(&mut client, "note")["exists"], false);
    let space = format!("agent:{writer}");
    assert_eq!(rows_in(&daemon, &space), 2);
    let killed = request(&mut client, Opcode::KILL, &json!({"id": writer}));
    assert_eq!(killed["success"], true, "{killed}");
    until(
        "the ended agent's own keys are removed",
        Duration::from_secs(10),
        || rows_in(&daemon, &space) == 0,
    );
    assert_eq!(fetch(&mut client, "shared")["value"], json!([1, 2]));
}

/// An agent that counts its own starts in its own key, and fails on its
/// first.
const COUNTER: &str = r#"
seen = json.loads(call(0x31, {"key": "starts", "scope": "agent"})[1])
starts = (seen["value"] or 0) + 1
call(0x30, {"key": "starts", "value": starts, "scope": "agent"})
print(f"START {starts}", flush=True)
if starts == 1:
    sys.exit(3)
time.sleep(30)
"#;

#[test]
fn an_agents_own_keys_last_across_its_restarts_and_go_at_its_end() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = shared_dir();
    let script = write_script(
        dir.path(),
        "counter.py",
        &format!("{PY_KERNEL}\nimport time\n{COUNTER}"),
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "counter", "script": script, "restart_policy": "on-failure",
                "max_restarts": 2}),
    );
    let id = spawned["id"].as_u64().unwrap();
    agent_log_with_line(&daemon, "counter", id, "START 2");
    let space = format!("agent:{id}");
    assert_eq!(rows_in(&daemon, &space), 1, "kept across the restart");
    let killed = request(&mut client, Opcode::KILL, &json!({"id": id}));
    assert_eq!(killed["success"], true, "{killed}");
    until(
        "the ended agent's own keys are removed",
        Duration::from_secs(10),
        || rows_in(&daemon, &space) == 0,
    );
}

#[test]
fn another_operator_uid_sees_nothing_of_a_tree_and_keeps_its_own() {
    require_root!("a client as another user");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let stored = store(&mut client, json!({"key": "secret", "value": "root's"}));
    assert_eq!(stored["success"], true, "{stored}");
    let own = store(
        &mut client,
        json!({"key": "mine", "value": "root's own", "scope": "agent"}),
    );
    assert_eq!(own["success"], true, "{own}");
    // Nobody with the socket's group (root's) is an operator of its own
    // uid: the kernel's own check is what decides.
    let calls = json!([
        [FETCH, {"key": "secret"}],
        [FETCH, {"key": "mine"}],
        [KEYS, {}],
        [STORE, {"key": "theirs", "value": 65534}],
        [FETCH, {"key": "theirs"}],
    ]);
    let replies = calls_as_another_uid(&daemon, &calls);
    assert_eq!(replies[0]["exists"], false, "{replies:?}");
    assert_eq!(replies[1]["exists"], false, "{replies:?}");
    assert_eq!(replies[2]["keys"], json!([]), "{replies:?}");
    assert_eq!(replies[3]["success"], true, "{replies:?}");
    assert_eq!(replies[4]["value"], 65534, "{replies:?}");
    assert_eq!(fetch(&mut client, "theirs")["exists"], false);
    assert_eq!(fetch(&mut client, "secret")["value"], "root's");
}

#[test]
fn a_ttl_expires_and_is_kept_as_a_time_across_a_restart() {
    let mut daemon = Daemon::start();
    let mut client = daemon.client();
    let short = store(&mut client, json!({"key": "short", "value": 1, "ttl": 0.3}));
    assert_eq!(short["success"], true, "{short}");
    assert_eq!(fetch(&mut client, "short")["exists"], true);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(fetch(&mut client, "short")["exists"], false);
    assert_eq!(
        request(&mut client, Opcode::KEYS, &json!({}))["keys"],
        json!([])
    );
    let long = store(
        &mut client,
        json!({"key": "long", "value": "l", "ttl": 3600}),
    );
    let soon = store(&mut client, json!({"key": "soon", "value": "s", "ttl": 2}));
    let lasting = store(&mut client, json!({"key": "lasting", "value": {"v": 1}}));
    assert!(soon["success"] == true && lasting["success"] == true);
    drop(client);
    daemon.signal(libc::SIGTERM);
    daemon.restart("");
    let mut client = daemon.client();
    let kept = fetch(&mut client, "long");
    assert_eq!(kept["value"], "l", "{kept}");
    assert_eq!(kept["expires_at"], long["expires_at"], "{kept}");
    assert_eq!(fetch(&mut client, "lasting")["value"], json!({"v": 1}));
    until(
        "the key stored before the restart expires after it",
        Duration::from_secs(5),
        || fetch(&mut client, "soon")["exists"] == false,
    );
}

#[test]
fn an_owners_quotas_refuse_with_limit_exceeded_naming_the_setting() {
    let daemon = Daemon::start_with(
        "[state]\nmax_keys_per_owner = 3\nmax_bytes_per_owner = 200\nmax_value_bytes = 100\n",
    );
    let mut client = daemon.client();
    for key in ["a", "b", "c"] {
        let stored = store(&mut client, json!({"key": key, "value": 1}));
        assert_eq!(stored["success"], true, "{stored}");
    }
    let fourth = store(
        &mut client,
        json!({"key": "d", "value": 1, "scope": "agent"}),
    );
    refused(&fourth, "limit_exceeded", "state.max_keys_per_owner");
    // Replacing a key adds none.
    let text = "x".repeat(88);
    for key in ["a", "b"] {
        let replaced = store(&mut client, json!({"key": key, "value": text}));
        assert_eq!(replaced["success"], true, "{replaced}");
    }
    let over = store(&mut client, json!({"key": "c", "value": text}));
    refused(&over, "limit_exceeded", "state.max_bytes_per_owner");
    assert_eq!(
        fetch(&mut client, "c")["value"],
        1,
        "a refused STORE changes nothing"
    );
    let big = store(&mut client, json!({"key": "c", "value": "y".repeat(120)}));
    refused(&big, "limit_exceeded", "state.max_value_bytes");
    let deleted = request(&mut client, Opcode::DELETE, &json!({"key": "a"}));
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let room = store(&mut client, json!({"key": "c", "value": text}));
    assert_eq!(room["success"], true, "room again after a DELETE: {room}");
}

#[test]
fn bad_keys_scopes_ttls_fields_and_deep_values_are_refused_by_name() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let nested = |depth: usize| -> Value { (0..depth).fold(json!(1), |inner, _| json!([inner])) };
    for (body, code, naming) in [
        (
            json!({"key": "k", "value": 1, "scope": "world"}),
            "bad_request",
            "scope",
        ),
        (
            json!({"key": "k", "value": 1, "ttl": -1}),
            "bad_request",
            "ttl",
        ),
        (
            json!({"key": "k", "value": 1, "ttl": "60"}),
            "bad_request",
            "ttl",
        ),
        (
            json!({"key": "k", "value": 1, "tll": 60}),
            "bad_request",
            "tll",
        ),
        (json!({"key": "", "value": 1}), "bad_request", "key"),
        (json!({"key": "a\u{7}b", "value": 1}), "bad_request", "key"),
        (
            json!({"key": "k".repeat(257), "value": 1}),
            "bad_request",
            "key",
        ),
        (json!({"key": "k"}), "bad_request", "value"),
        (
            json!({"key": "k", "value": nested(33)}),
            "limit_exceeded",
            "value",
        ),
    ] {
        let reply = store(&mut client, body.clone());
        assert_eq!(reply["code"], code, "{body} -> {reply}");
        let error = reply["error"].as_str().unwrap();
        assert!(error.contains(naming), "{body} -> {error}");
    }
    let deepest = store(&mut client, json!({"key": "deep", "value": nested(32)}));
    assert_eq!(deepest["success"], true, "{deepest}");
    // A value's own objects may have any fields.
    let free = store(
        &mut client,
        json!({"key": "free", "value": {"anything": {"at": "all"}}}),
    );
    assert_eq!(free["success"], true, "{free}");
    let scoped = request(
        &mut client,
        Opcode::FETCH,
        &json!({"key": "k", "scope": "tree"}),
    );
    refused(&scoped, "bad_request", "scope");
    let keys = request(&mut client, Opcode::KEYS, &json!({"prefx": "a"}));
    refused(&keys, "bad_request", "prefx");
}

#[test]
fn an_exec_runs_code_is_refused_the_state_store() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let stored = store(&mut client, json!({"key": "operator", "value": "secret"}));
    assert_eq!(stored["success"], true, "{stored}");
    let code = format!(
        "{}\ns = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))\n\
         for op, body in [(0x30, {{'key': 'k', 'value': 1}}), (0x31, {{'key': 'operator'}}), \
         (0x32, {{'key': 'operator'}}), (0x33, {{}})]:\n    send(s, op, body)\n    \
         print(recv(s)[2].decode(), flush=True)\n",
        py_frames!()
    );
    let ran = request(&mut client, Opcode::EXEC, &json!({"code": code}));
    assert_eq!(ran["exit_code"], 0, "{ran}");
    let replies: Vec<Value> = ran["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(replies.len(), 4, "{ran}");
    for refusal in &replies {
        refused(refusal, "permission_denied", "session");
    }
    assert_eq!(fetch(&mut client, "operator")["value"], "secret");
}
