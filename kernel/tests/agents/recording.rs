//! RECORD_* and REPLAY_*: what a recording keeps (the caller's calls, a
//! filter's agents, never a secret), and a replay that runs as its caller
//! whatever the recording says, re-issuing only NOOP and the state store.

use agentos_proto::{Client, Opcode};
use agentos_test_support::{request, Daemon};
use serde_json::{json, Value};

fn call(client: &mut Client, opcode: u8, body: Value) -> Value {
    request(client, Opcode(opcode), &body)
}

#[test]
fn a_recording_keeps_the_callers_calls_redacted_and_a_filter_narrows_it() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let idle = call(&mut client, 0x72, json!({}));
    assert_eq!(
        (idle["state"].clone(), idle["entry_count"].clone()),
        (json!("IDLE"), json!(0))
    );
    let started = call(&mut client, 0x70, json!({"max_entries": 1_000_000_000u64}));
    assert_eq!(started["state"], "RECORDING", "{started}");
    assert_eq!(started["max_entries"], 1000, "{started}");
    call(
        &mut client,
        0x30,
        json!({"key": "r1", "value": {"token": "sk-secret", "n": 1}}),
    );
    call(&mut client, 0x31, json!({"key": "r1"}));
    let stopped = call(&mut client, 0x71, json!({}));
    assert_eq!(stopped["entry_count"], 2, "{stopped}");
    let exported = call(&mut client, 0x72, json!({"export": true}));
    let recording = exported["recording"].as_str().unwrap();
    assert!(!recording.contains("sk-secret"), "{recording}");
    let entries: Vec<Value> = serde_json::from_str(recording).unwrap();
    assert_eq!(entries[0]["opcode_name"], "STORE");
    assert_eq!(entries[0]["principal"], "operator:0");
    assert_eq!(entries[0]["payload"]["value"]["n"], 1);

    call(&mut client, 0x70, json!({"filter_agents": [999]}));
    call(&mut client, 0x30, json!({"key": "filtered", "value": 1}));
    let filtered = call(&mut client, 0x72, json!({}));
    assert_eq!(filtered["entry_count"], 0, "{filtered}");
    let unknown = call(&mut client, 0x70, json!({"record_everything": true}));
    assert_eq!(unknown["code"], "bad_request", "{unknown}");
}

#[test]
fn a_replay_runs_as_its_caller_and_reissues_only_noop_and_the_state_store() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    // A recording that claims to be another agent's, with a SPAWN in it.
    let recording = json!([
        {"opcode": 0x30, "principal": "agent:7", "agent_id": 7,
         "payload": {"key": "claimed", "value": "x", "scope": "agent"}},
        {"opcode": 0x00, "payload": "ping"},
        {"opcode": 0x10, "agent_id": 7,
         "payload": {"name": "from-a-replay", "command": ["/bin/sleep", "30"]}},
        {"opcode": 0x30, "truncated": true, "payload": "{\"key\":\"cut"},
    ]);
    let replayed = call(
        &mut client,
        0x73,
        json!({"recording": recording.to_string()}),
    );
    assert_eq!(replayed["state"], "COMPLETED", "{replayed}");
    assert_eq!(replayed["total_entries"], 4, "{replayed}");
    assert_eq!(replayed["entries_replayed"], 2, "{replayed}");
    assert_eq!(replayed["entries_skipped"], 2, "{replayed}");
    let status = call(&mut client, 0x74, json!({}));
    assert_eq!(status["entries_replayed"], 2, "{status}");
    // The key went into the caller's own scope, not agent 7's.
    let fetched = call(&mut client, 0x31, json!({"key": "claimed"}));
    assert_eq!(fetched["exists"], true, "{fetched}");
    assert_eq!(fetched["scope"], "agent", "{fetched}");
    let listed = request(&mut client, Opcode::LIST, &json!({}));
    assert_eq!(
        listed,
        json!([]),
        "a SPAWN in a recording is never re-issued"
    );
    let empty = call(&mut client, 0x73, json!({"recording": "[]"}));
    assert_eq!(empty["code"], "bad_request", "{empty}");
}
