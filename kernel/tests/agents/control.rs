//! KILL's `remove` and `restart`, and the spec LIST shows: what they do for
//! an operator, and what a hostile agent gets when it reaches for agents
//! that are not its own.

use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};
use agentos_test_support::{
    act, agent_info, listed_names, request, shared_dir, wait_for_state, write_script, Daemon,
};
use serde_json::{json, Value};

use super::reply;

const KILL: u8 = 0x11;

fn spawn(client: &mut Client, body: Value) -> u64 {
    let reply = request(client, Opcode::SPAWN, &body);
    assert_eq!(reply["success"], true, "{body} -> {reply}");
    reply["id"].as_u64().unwrap()
}

fn kill(client: &mut Client, body: Value) -> Value {
    request(client, Opcode::KILL, &body)
}

/// Polls LIST until agent `id` runs again after `restarts` restarts.
fn running_after(client: &mut Client, id: u64, restarts: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = agent_info(client, id);
        if info["state"] == "running" && info["restarts"] == restarts {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "agent {id} not running again: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn list_shows_the_spec_an_agent_runs_but_never_its_environment() {
    let daemon = Daemon::start();
    let dir = shared_dir();
    let script = write_script(dir.path(), "idle.py", "import time\ntime.sleep(30)\n");
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "specced", "script": script, "args": ["--fast", "two words"],
               "env": {"API_KEY": "hunter2-secret"}, "cwd": "/tmp",
               "restart_policy": "on-failure", "max_restarts": 3, "restart_window": 120,
               "permissions": {"think": false, "tools": ["everything.*"], "llm_tokens": 500}}),
    );
    let info = agent_info(&mut client, id);
    let command = info["command"].as_array().unwrap();
    assert_eq!(command.len(), 4, "{info}");
    assert!(command[0].as_str().unwrap().contains("python"), "{info}");
    assert_eq!(command[1], script.to_str().unwrap());
    assert_eq!(command[2..], [json!("--fast"), json!("two words")]);
    assert_eq!(info["cwd"], "/tmp");
    assert_eq!(info["sandboxed"], true);
    assert_eq!(info["network"], false);
    assert_eq!(info["restart_policy"], "on-failure");
    assert_eq!(info["max_restarts"], 3);
    assert_eq!(info["restart_window"], 120);
    assert_eq!(info["permissions"]["think"], false, "{info}");
    assert_eq!(info["permissions"]["tools"], json!(["everything.*"]));
    assert_eq!(info["permissions"]["llm_tokens"], 500);
    let list = request(&mut client, Opcode::LIST, &json!({})).to_string();
    assert!(!list.contains("hunter2"), "LIST shows an env value: {list}");
    assert!(!list.contains("API_KEY"), "LIST shows an env name: {list}");
}

#[test]
fn remove_forgets_an_ended_agent_and_refuses_a_live_one() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "sleeper", "command": ["/bin/sleep", "30"]}),
    );
    let live = kill(&mut client, json!({"name": "sleeper", "remove": true}));
    assert_eq!(live["code"], "bad_request", "{live}");
    assert!(
        live["error"].as_str().unwrap().contains("still running"),
        "{live}"
    );
    assert_eq!(agent_info(&mut client, id)["state"], "running");

    let both = kill(
        &mut client,
        json!({"id": id, "remove": true, "restart": true}),
    );
    assert_eq!(both["code"], "bad_request", "{both}");
    let unknown = kill(
        &mut client,
        json!({"id": id, "remove": true, "force": true}),
    );
    assert_eq!(unknown["code"], "bad_request", "{unknown}");
    assert!(
        unknown["error"].as_str().unwrap().contains("force"),
        "{unknown}"
    );

    kill(&mut client, json!({"id": id, "grace_ms": 0}));
    wait_for_state(&mut client, id, &["killed"], Duration::from_secs(10));
    let removed = kill(&mut client, json!({"name": "sleeper", "remove": true}));
    assert_eq!(removed, json!({"success": true, "removed": true, "id": id}));
    assert!(!listed_names(&mut client).contains(&"sleeper".to_owned()));
    let again = kill(&mut client, json!({"id": id, "remove": true}));
    assert_eq!(again["code"], "not_found", "{again}");
}

#[test]
fn restart_stops_the_agent_and_starts_it_again_under_the_same_id() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "cycled", "command": ["/bin/sleep", "30"]}),
    );
    let first_pid = agent_info(&mut client, id)["pid"].clone();
    let restarted = kill(
        &mut client,
        json!({"name": "cycled", "restart": true, "grace_ms": 0}),
    );
    assert_eq!(
        restarted,
        json!({"success": true, "restarted": true, "killed": true, "id": id})
    );
    let info = running_after(&mut client, id, 1);
    assert_ne!(info["pid"], first_pid, "a new incarnation: {info}");
    assert_eq!(info["command"], json!(["/bin/sleep", "30"]));
    assert_eq!(listed_names(&mut client), vec!["cycled".to_owned()]);

    // An ended agent, its record kept, simply starts again.
    kill(&mut client, json!({"id": id, "grace_ms": 0}));
    wait_for_state(&mut client, id, &["killed"], Duration::from_secs(10));
    let revived = kill(&mut client, json!({"id": id, "restart": true}));
    assert_eq!(revived["restarted"], true, "{revived}");
    assert_eq!(revived["killed"], false, "{revived}");
    running_after(&mut client, id, 2);

    // The name is taken while it runs, and free once it has been stopped.
    kill(&mut client, json!({"id": id, "grace_ms": 0}));
    wait_for_state(&mut client, id, &["killed"], Duration::from_secs(10));
    let taken = spawn(
        &mut client,
        json!({"name": "cycled", "command": ["/bin/sleep", "30"]}),
    );
    let clash = kill(&mut client, json!({"id": id, "restart": true}));
    assert_eq!(clash["code"], "already_exists", "{clash}");
    assert_eq!(agent_info(&mut client, taken)["state"], "running");
}

#[test]
fn an_agent_may_remove_or_restart_its_own_child_but_nothing_else_it_cannot_list() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let bystander = spawn(
        &mut client,
        json!({"name": "bystander", "command": ["/bin/sleep", "30"]}),
    );
    let ended = spawn(
        &mut client,
        json!({"name": "ended", "command": ["/bin/true"]}),
    );
    wait_for_state(&mut client, ended, &["exited"], Duration::from_secs(10));
    let (_, replies) = act(
        &daemon,
        "hostile",
        json!({"permissions": {"spawn": true}}),
        json!([
            [KILL, {"name": "bystander", "restart": true}],
            [KILL, {"id": bystander, "restart": true}],
            [KILL, {"name": "ended", "remove": true}],
            [KILL, {"id": ended, "restart": true}],
            [KILL, {"name": "nobody", "restart": true}],
            [KILL, {"id": 999, "remove": true}],
            [0x10, {"name": "kid", "command": ["/bin/sleep", "30"]}],
            [KILL, {"name": "kid", "restart": true, "grace_ms": 0}],
            [KILL, {"name": "hostile", "remove": true}],
        ]),
    );
    let missing_by_name = reply(&replies, 4);
    let missing_by_id = reply(&replies, 5);
    assert_eq!(missing_by_name["code"], "not_found", "{missing_by_name}");
    for (n, target) in [(0, "bystander"), (2, "ended")] {
        let got = reply(&replies, n);
        let expected = missing_by_name["error"]
            .as_str()
            .unwrap()
            .replace("nobody", target);
        assert_eq!(got["code"], "not_found", "{got}");
        assert_eq!(got["error"], expected, "{got}");
    }
    for (n, target) in [(1, bystander), (3, ended)] {
        let got = reply(&replies, n);
        let expected = missing_by_id["error"]
            .as_str()
            .unwrap()
            .replace("999", &target.to_string());
        assert_eq!(got["code"], "not_found", "{got}");
        assert_eq!(got["error"], expected, "{got}");
    }
    let kid = reply(&replies, 7);
    assert_eq!(kid["restarted"], true, "{kid}");
    let own = reply(&replies, 8);
    assert_eq!(own["code"], "permission_denied", "{own}");

    let by_operator = agent_info(&mut client, bystander);
    assert_eq!(by_operator["restarts"], 0, "{by_operator}");
    assert_eq!(by_operator["state"], "running");
    assert_eq!(agent_info(&mut client, ended)["state"], "exited");
    assert!(listed_names(&mut client).contains(&"ended".to_owned()));
    let kid_id = reply(&replies, 6)["id"].as_u64().unwrap();
    running_after(&mut client, kid_id, 1);
}
