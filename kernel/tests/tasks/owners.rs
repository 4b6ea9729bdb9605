//! Tasks are their owners' alone: bad requests, other agents' tasks even as
//! a list cursor, and an agent's tasks ending with it while an operator sees
//! and cancels anyone's.

use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{self as support, act, require_root, until, Daemon};
use serde_json::{json, Value};

use crate::{dispatch, status, task, wait, TASK};

#[test]
fn tasks_are_their_owners_alone_and_bad_requests_are_named() {
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let id = dispatch(&mut stream, "think", json!("what is 2+2?"));
    // No LLM: the THINK task fails, with THINK's own reply as its result.
    let done = wait(&mut stream, &id, 10_000);
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["result"]["code"], "unavailable", "{done}");

    // An agent sees none of the operator's tasks, even by id.
    let (_, replies) = act(
        &daemon,
        "snoop",
        json!({}),
        json!([
            [TASK, {"op": "status", "task_id": id}],
            [TASK, {"op": "wait", "task_id": id, "timeout_ms": 10}],
            [TASK, {"op": "cancel", "task_id": id}],
            [TASK, {"op": "list"}],
        ]),
    );
    for reply in &replies[..3] {
        assert_eq!(reply["reply"]["code"], "not_found", "{reply}");
    }
    assert_eq!(replies[3]["reply"]["tasks"], json!([]), "{replies:?}");

    for (request, code, names) in [
        (json!({"op": "fly"}), "bad_request", "fly"),
        (
            json!({"op": "dispatch", "kind": "nap", "request": {}}),
            "bad_request",
            "kind",
        ),
        (
            json!({"op": "dispatch", "kind": "exec", "request": {"code": 7}}),
            "bad_request",
            "`request`",
        ),
        (
            json!({"op": "status", "task_id": "t-0000000000000000"}),
            "not_found",
            "t-0000",
        ),
        (
            json!({"op": "status", "task_id": "../../etc/passwd"}),
            "not_found",
            "passwd",
        ),
        (
            json!({"op": "wait", "task_id": id, "timeout_ms": 600_001}),
            "limit_exceeded",
            "timeout_ms",
        ),
        (json!({"op": "list", "limit": 0}), "limit_exceeded", "limit"),
    ] {
        let reply = task(&mut stream, request.clone());
        assert_eq!(reply["code"], code, "{request} -> {reply}");
        assert!(reply["error"].as_str().unwrap().contains(names), "{reply}");
    }
}

#[test]
fn one_agents_tasks_are_invisible_to_another_even_as_a_list_cursor() {
    let daemon = Daemon::start();
    let (_, replies) = act(
        &daemon,
        "owner",
        json!({}),
        json!([[TASK, {"op": "dispatch", "kind": "think", "request": "hi", "label": "mine"}]]),
    );
    let id = replies[0]["reply"]["task_id"].as_str().unwrap().to_owned();
    let (_, replies) = act(
        &daemon,
        "other",
        json!({}),
        json!([
            [TASK, {"op": "status", "task_id": id}],
            [TASK, {"op": "list", "before": id}],
            [TASK, {"op": "cancel", "task_id": id}],
        ]),
    );
    for reply in &replies {
        assert_eq!(reply["reply"]["code"], "not_found", "{reply}");
    }
    // An operator reaches any task by its id.
    let mut stream = daemon.raw();
    let seen = task(&mut stream, json!({"op": "status", "task_id": id}));
    assert_eq!(seen["task"]["label"], "mine", "{seen}");
}

#[test]
fn an_agents_tasks_end_with_it_and_an_operator_lists_and_cancels_anyones() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let mine = dispatch(&mut stream, "think", json!("an operator's own"));
    // An agent dispatches 50 long EXEC tasks, then exits.
    let long = json!({"code": "import time; time.sleep(120)", "timeout_ms": 200_000});
    let requests: Vec<Value> = (0..50)
        .map(|_| json!([Opcode::TASK.0, {"op": "dispatch", "kind": "exec", "request": long}]))
        .collect();
    let dir = support::shared_dir();
    let actor = support::write_actor(dir.path());
    let mut client = daemon.client();
    let spawned = support::request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "dispatcher", "script": actor,
                "args": [Value::Array(requests).to_string(), "3"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    let log = support::agent_log_with_line(&daemon, "dispatcher", id, "DONE");
    let ids: Vec<String> = log
        .lines()
        .filter_map(|l| l.strip_prefix("REPLY "))
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["reply"]["task_id"].clone())
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 50, "{log}");
    // The operator lists them by their agent, each saying whose it is…
    let listed = task(
        &mut stream,
        json!({"op": "list", "owner": id, "limit": 100}),
    );
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 50, "{listed}");
    assert_eq!(
        listed["tasks"][0]["owner"],
        json!({"kind": "agent", "id": id, "name": "dispatcher"}),
        "{listed}"
    );
    // …and by name, and everyone's with its own among them.
    let by_name = task(
        &mut stream,
        json!({"op": "list", "owner": "dispatcher", "limit": 100}),
    );
    assert_eq!(by_name["tasks"].as_array().unwrap().len(), 50, "{by_name}");
    let everyone = task(
        &mut stream,
        json!({"op": "list", "owner": "*", "limit": 100}),
    );
    assert_eq!(
        everyone["tasks"].as_array().unwrap().len(),
        51,
        "{everyone}"
    );
    // Its own list stays its own.
    let own = task(&mut stream, json!({"op": "list"}));
    let own_ids: Vec<&str> = own["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(own_ids, [mine.as_str()], "{own}");
    // The operator cancels one of the agent's by its id.
    let cancelled = task(&mut stream, json!({"op": "cancel", "task_id": ids[0]}));
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    // The agent exits: all its tasks end, running and queued alike.
    let mut client = daemon.client();
    until("the dispatcher exits", Duration::from_secs(10), || {
        support::agent_info(&mut client, id)["state"] == "exited"
    });
    until(
        "the agent's tasks end with it",
        Duration::from_secs(5),
        || {
            ids.iter()
                .all(|t| status(&mut stream, t)["state"] == "cancelled")
        },
    );
    let ended = wait(&mut stream, &ids[10], 1000);
    assert!(
        ended["result"]["error"]
            .as_str()
            .unwrap()
            .contains("agent that asked for it has ended"),
        "{ended}"
    );
    // An agent may not list another owner's tasks.
    let (_, replies) = act(
        &daemon,
        "nosy",
        json!({}),
        json!([[Opcode::TASK.0, {"op": "list", "owner": "*"}]]),
    );
    assert_eq!(
        replies[0]["reply"]["code"], "permission_denied",
        "{replies:?}"
    );
}
