//! GET_AUDIT_LOG and SET_AUDIT_CONFIG: the audit log, as the Clove SDK
//! calls it — what is recorded, in which order, who reads which entries,
//! what may not be turned off, and that it lasts and stays bounded.

use std::time::Duration;

use agentos_proto::{Client, Opcode};
use agentos_test_support::{act, py_frames, request, require_root, until, Daemon};
use serde_json::{json, Value};

use super::{refused, reply};

const GET_AUDIT_LOG: u8 = 0x76;
const SET_AUDIT_CONFIG: u8 = 0x77;

fn audit_log(client: &mut Client, body: Value) -> Value {
    let log = request(client, Opcode::GET_AUDIT_LOG, &body);
    assert_eq!(log["success"], true, "{log}");
    log
}

fn entries(log: &Value) -> &Vec<Value> {
    log["entries"].as_array().unwrap()
}

fn ids(log: &Value) -> Vec<u64> {
    entries(log)
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect()
}

/// The entries of `log` about agent `id` of type `event_type`.
fn about<'a>(log: &'a Value, id: u64, event_type: &str) -> Vec<&'a Value> {
    entries(log)
        .iter()
        .filter(|e| e["agent_id"] == id && e["event_type"] == event_type)
        .collect()
}

#[test]
fn the_clove_sdks_calls_answer_and_a_spawn_and_a_kill_are_recorded() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let empty = audit_log(&mut client, json!({"limit": 10}));
    assert_eq!(
        empty,
        json!({"success": true, "count": 0, "entries": [], "more": false})
    );
    let set = request(
        &mut client,
        Opcode::SET_AUDIT_CONFIG,
        &json!({"log_lifecycle": true, "log_security": true, "log_syscalls": false,
                "max_entries": 1000}),
    );
    assert_eq!(
        set,
        json!({"success": true, "config": {"max_entries": 1000, "log_syscalls": false,
               "log_security": true, "log_lifecycle": true, "log_ipc": false,
               "log_state": false, "log_resource": true, "log_network": false,
               "log_world": false}})
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "audit-test-agent", "command": ["/bin/sleep", "30"],
                "sandboxed": false}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    let killed = request(
        &mut client,
        Opcode::KILL,
        &json!({"id": id, "grace_ms": 100}),
    );
    assert_eq!(killed["killed"], true, "{killed}");
    let mut lifecycle = Value::Null;
    until(
        "the agent's end is recorded",
        Duration::from_secs(10),
        || {
            lifecycle = audit_log(
                &mut client,
                json!({"category": "AGENT_LIFECYCLE", "limit": 20}),
            );
            !about(&lifecycle, id, "AGENT_EXITED").is_empty()
        },
    );
    let kinds: Vec<&Value> = entries(&lifecycle)
        .iter()
        .map(|e| &e["event_type"])
        .collect();
    assert_eq!(
        kinds,
        ["AGENT_SPAWNED", "AGENT_KILLED", "AGENT_EXITED"],
        "{lifecycle}"
    );
    let spawn = about(&lifecycle, id, "AGENT_SPAWNED")[0];
    for field in [
        "id",
        "timestamp",
        "category",
        "event_type",
        "principal",
        "success",
    ] {
        assert!(spawn.get(field).is_some(), "{field}: {spawn}");
    }
    assert_eq!(spawn["category"], "AGENT_LIFECYCLE", "{spawn}");
    assert_eq!(spawn["agent_name"], "audit-test-agent", "{spawn}");
    assert_eq!(spawn["principal"]["kind"], "operator", "{spawn}");
    assert!(
        spawn["timestamp"].as_str().unwrap().ends_with('Z'),
        "{spawn}"
    );
    let end = about(&lifecycle, id, "AGENT_EXITED")[0];
    assert_eq!(end["details"]["state"], "killed", "{end}");
    assert_eq!(end["principal"]["kind"], "agent", "{end}");
    // Clove's 13.5: by agent, only that agent's entries.
    let of_agent = audit_log(&mut client, json!({"agent_id": id, "limit": 10}));
    assert_eq!(of_agent["count"], 3, "{of_agent}");
    let everything = audit_log(&mut client, json!({}));
    assert_eq!(
        entries(&everything)[0]["event_type"],
        "AUDIT_CONFIG_CHANGED"
    );
    assert_eq!(entries(&everything)[0]["category"], "SECURITY");
}

#[test]
fn since_id_is_exclusive_and_entries_come_in_ascending_order() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for _ in 0..7 {
        let set = request(&mut client, Opcode::SET_AUDIT_CONFIG, &json!({}));
        assert_eq!(set["success"], true, "{set}");
    }
    let first = audit_log(&mut client, json!({"limit": 5}));
    let first_ids = ids(&first);
    assert_eq!(first_ids.len(), 5, "{first}");
    assert!(first_ids.windows(2).all(|w| w[0] < w[1]), "{first}");
    assert_eq!(first["more"], true, "{first}");
    let last = *first_ids.last().unwrap();
    let second = audit_log(&mut client, json!({"since_id": last, "limit": 5}));
    let second_ids = ids(&second);
    assert_eq!(second_ids.len(), 2, "{second}");
    assert!(second_ids[0] > last, "{second}");
    assert!(second_ids.windows(2).all(|w| w[0] < w[1]), "{second}");
    assert_eq!(second["more"], false, "{second}");
    let none = audit_log(&mut client, json!({"since_id": second_ids[1]}));
    assert_eq!(none["count"], 0, "{none}");
    let capped = audit_log(&mut client, json!({"limit": 5000}));
    assert_eq!(capped["count"], 7, "{capped}");
    for bad in [
        json!({"limit": 0}),
        json!({"since": 1}),
        json!({"category": "EVERYTHING"}),
        json!({"since_id": -1}),
    ] {
        let answer = request(&mut client, Opcode::GET_AUDIT_LOG, &bad);
        assert_eq!(answer["code"], "bad_request", "{bad} -> {answer}");
    }
}

#[test]
fn security_and_lifecycle_logging_cannot_be_turned_off_and_the_bound_is_a_ceiling() {
    let daemon = Daemon::start_with("[audit]\nmax_entries = 50\n");
    let mut client = daemon.client();
    for field in ["log_security", "log_lifecycle"] {
        let off = request(
            &mut client,
            Opcode::SET_AUDIT_CONFIG,
            &json!({field: false}),
        );
        refused(&off, "permission_denied", field);
    }
    let over = request(
        &mut client,
        Opcode::SET_AUDIT_CONFIG,
        &json!({"max_entries": 51}),
    );
    refused(&over, "limit_exceeded", "audit.max_entries");
    let unknown = request(
        &mut client,
        Opcode::SET_AUDIT_CONFIG,
        &json!({"log_all": true}),
    );
    refused(&unknown, "bad_request", "log_all");
    // The refusals of an operator are its own entries.
    let denied = audit_log(&mut client, json!({"category": "SECURITY"}));
    let kinds: Vec<&Value> = entries(&denied).iter().map(|e| &e["event_type"]).collect();
    assert_eq!(
        kinds,
        ["PERMISSION_DENIED", "PERMISSION_DENIED"],
        "{denied}"
    );
    assert_eq!(entries(&denied)[0]["success"], false, "{denied}");
    assert_eq!(entries(&denied)[0]["details"]["opcode"], "SET_AUDIT_CONFIG");
}

#[test]
fn an_agent_may_not_change_the_audit_config_and_reads_only_about_itself() {
    require_root!("sandboxed agents");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let set = request(&mut client, Opcode::SET_AUDIT_CONFIG, &json!({}));
    assert_eq!(set["success"], true, "{set}");
    // A hostile agent refused in a loop gets only its share of the log.
    let refused_again = vec![json!([SET_AUDIT_CONFIG, {"log_syscalls": true}]); 100];
    let (other, tried) = act(&daemon, "other", json!({}), Value::Array(refused_again));
    assert_eq!(tried.len(), 100);
    let (one, read) = act(
        &daemon,
        "one",
        json!({}),
        json!([
            [SET_AUDIT_CONFIG, {}],
            [GET_AUDIT_LOG, {"limit": 1000}],
            [GET_AUDIT_LOG, {"agent_id": other}],
        ]),
    );
    refused(reply(&read, 0), "permission_denied", "operators");
    let seen = reply(&read, 1);
    assert_eq!(seen["success"], true, "{seen}");
    let kinds: Vec<&Value> = entries(seen).iter().map(|e| &e["event_type"]).collect();
    assert_eq!(kinds, ["AGENT_SPAWNED", "PERMISSION_DENIED"], "{seen}");
    for entry in entries(seen) {
        assert_eq!(entry["agent_id"], one, "only its own: {entry}");
    }
    assert_eq!(reply(&read, 2)["count"], 0, "another tree's: {read:?}");
    // The operator reads both agents' refusals.
    let all = audit_log(&mut client, json!({"category": "SECURITY", "limit": 1000}));
    let flood = about(&all, other, "PERMISSION_DENIED").len();
    assert!(
        (20..100).contains(&flood),
        "{flood} of 100 refusals recorded"
    );
    assert_eq!(about(&all, one, "PERMISSION_DENIED").len(), 1, "{all}");
    let config = request(&mut client, Opcode::SET_AUDIT_CONFIG, &json!({}));
    assert_eq!(config["config"]["log_syscalls"], false, "{config}");
}

#[test]
fn an_exec_run_reads_only_what_it_caused() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let set = request(&mut client, Opcode::SET_AUDIT_CONFIG, &json!({}));
    assert_eq!(set["success"], true, "{set}");
    let code = format!(
        "{}\ns = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))\n\
         for op, body in [(0x77, {{}}), (0x76, {{}})]:\n    send(s, op, body)\n    \
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
    refused(&replies[0], "permission_denied", "operators");
    let kinds: Vec<&Value> = entries(&replies[1])
        .iter()
        .map(|e| &e["event_type"])
        .collect();
    assert_eq!(kinds, ["PERMISSION_DENIED"], "{ran}");
    assert_eq!(entries(&replies[1])[0]["principal"]["kind"], "run", "{ran}");
}

#[test]
fn entries_survive_a_restart_and_the_bound_removes_the_oldest() {
    let config = "[audit]\nmax_entries = 5\n";
    let mut daemon = Daemon::start_with(config);
    let mut client = daemon.client();
    for _ in 0..8 {
        let set = request(&mut client, Opcode::SET_AUDIT_CONFIG, &json!({}));
        assert_eq!(set["success"], true, "{set}");
    }
    let before = audit_log(&mut client, json!({}));
    assert_eq!(ids(&before), [4, 5, 6, 7, 8], "{before}");
    drop(client);
    daemon.signal(libc::SIGTERM);
    daemon.restart(config);
    let mut client = daemon.client();
    let after = audit_log(&mut client, json!({}));
    assert_eq!(after["entries"], before["entries"]);
    let set = request(
        &mut client,
        Opcode::SET_AUDIT_CONFIG,
        &json!({"max_entries": 3}),
    );
    assert_eq!(set["config"]["max_entries"], 3, "{set}");
    assert_eq!(ids(&audit_log(&mut client, json!({}))), [7, 8, 9]);
}

#[test]
fn a_pause_and_a_resume_are_recorded() {
    require_root!("the cgroup freezer");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "frozen", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    for opcode in [Opcode::PAUSE, Opcode::RESUME] {
        let done = request(&mut client, opcode, &json!({"id": id}));
        assert_eq!(done["success"], true, "{done}");
    }
    let log = audit_log(&mut client, json!({"agent_id": id}));
    let kinds: Vec<&Value> = entries(&log).iter().map(|e| &e["event_type"]).collect();
    assert_eq!(
        kinds,
        ["AGENT_SPAWNED", "AGENT_PAUSED", "AGENT_RESUMED"],
        "{log}"
    );
}
