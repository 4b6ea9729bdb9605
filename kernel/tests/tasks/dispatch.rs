//! Dispatching, waiting for and cancelling tasks, and an owner's queue
//! cap.

use std::fs;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{call_json, require_root, until, Daemon};
use serde_json::json;

use crate::{dispatch, status, task, wait};

#[test]
fn twenty_exec_tasks_are_dispatched_and_all_collected_and_listed_newest_first() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let ids: Vec<String> = (0..20)
        .map(|i| {
            dispatch(
                &mut stream,
                "exec",
                json!({"code": format!("print({i} * {i})")}),
            )
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let done = wait(&mut stream, id, 60_000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["kind"], "exec");
        assert_eq!(done["result"]["stdout"], format!("{}\n", i * i), "{done}");
        assert!(done["started_at"].is_string() && done["finished_at"].is_string());
    }
    // Newest first, seven to a page.
    let mut listed = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let mut request = json!({"op": "list", "limit": 7, "kind": "exec", "state": "completed"});
        if let Some(before) = &before {
            request["before"] = json!(before);
        }
        let page = task(&mut stream, request);
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= 7);
        listed.extend(
            tasks
                .iter()
                .map(|t| t["task_id"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => before = Some(next.to_owned()),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);
    let none = task(&mut stream, json!({"op": "list", "state": "running"}));
    assert_eq!(none["tasks"], json!([]), "{none}");
}

#[test]
fn an_endless_task_is_cancelled_within_half_a_second_with_nothing_left() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let marker = format!("endless-{}", std::process::id());
    let code = format!(
        "import subprocess\nsubprocess.Popen(['sleep', '300'], env={{'M': '{marker}'}})\n\
         import sys\nsys.argv = ['{marker}']\nwhile True:\n    pass"
    );
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": code, "timeout_ms": 120_000}),
    );
    until("the task runs", Duration::from_secs(20), || {
        status(&mut stream, &id)["state"] == "running"
    });
    // The run and what it started are there to be killed.
    let sleepers = || {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::read(e.path().join("environ")).ok())
            .filter(|env| String::from_utf8_lossy(env).contains(&marker))
            .count()
    };
    until("the task's child starts", Duration::from_secs(10), || {
        sleepers() > 0
    });
    let cancelled_at = Instant::now();
    let reply = task(&mut stream, json!({"op": "cancel", "task_id": id}));
    assert_eq!(reply, json!({"success": true, "cancelled": true}));
    let after = status(&mut stream, &id);
    assert_eq!(after["state"], "cancelled", "{after}");
    // The run is killed with everything it started.
    until(
        "nothing of the task is left",
        Duration::from_millis(500),
        || sleepers() == 0,
    );
    eprintln!("cancelled and gone in {:?}", cancelled_at.elapsed());
    let done = wait(&mut stream, &id, 1000);
    assert_eq!(done["result"]["code"], "cancelled", "{done}");
    // Cancelling again changes nothing.
    let again = task(&mut stream, json!({"op": "cancel", "task_id": id}));
    assert_eq!(again["cancelled"], false);
}

#[test]
fn a_wait_that_times_out_changes_nothing_and_the_task_completes() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": "import time\ntime.sleep(1.5)\nprint('woke')"}),
    );
    let started = Instant::now();
    let early = wait(&mut stream, &id, 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        early["state"] == "running" || early["state"] == "queued",
        "{early}"
    );
    assert!(early.get("result").is_none(), "{early}");
    // Meanwhile the connection serves other requests.
    assert_eq!(call_json(&mut stream, Opcode::HELLO, b"")["success"], true);
    let done = wait(&mut stream, &id, 30_000);
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["result"]["stdout"], "woke\n");
}

#[test]
fn a_task_outlives_the_connection_that_dispatched_it() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let id = {
        let mut first = daemon.raw();
        dispatch(
            &mut first,
            "exec",
            json!({"code": "import time\ntime.sleep(0.5)\nprint('still here')"}),
        )
    };
    let mut second = daemon.raw();
    let done = wait(&mut second, &id, 30_000);
    assert_eq!(done["result"]["stdout"], "still here\n", "{done}");
}

#[test]
fn an_owner_past_its_queue_cap_is_told_busy() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon =
        Daemon::start_with("[tasks]\nmax_running_per_owner = 1\nmax_queued_per_owner = 2\n");
    let mut stream = daemon.raw();
    let long = json!({"code": "import time\ntime.sleep(30)", "timeout_ms": 60_000});
    let running = dispatch(&mut stream, "exec", long.clone());
    until("it runs", Duration::from_secs(20), || {
        status(&mut stream, &running)["state"] == "running"
    });
    dispatch(&mut stream, "exec", long.clone());
    dispatch(&mut stream, "exec", long.clone());
    let refused = task(
        &mut stream,
        json!({"op": "dispatch", "kind": "exec", "request": long}),
    );
    assert_eq!(refused["code"], "busy", "{refused}");
    assert!(refused["error"]
        .as_str()
        .unwrap()
        .contains("max_queued_per_owner"));
}
