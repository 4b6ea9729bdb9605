//! TASK against a real agentosd: background EXEC and THINK work that
//! belongs to its owner, outlives its connection and the kernel process,
//! and is really stopped when cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use common::{act, call_json, until, with_llm_stub, Daemon};
use serde_json::{json, Value};

const TASK: u8 = 0x13;

fn task(stream: &mut UnixStream, request: Value) -> Value {
    call_json(stream, Opcode::TASK, request.to_string().as_bytes())
}

fn dispatch(stream: &mut UnixStream, kind: &str, request: Value) -> String {
    let reply = task(
        stream,
        json!({"op": "dispatch", "kind": kind, "request": request}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["task_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("t-"), "{id}");
    id
}

fn wait(stream: &mut UnixStream, id: &str, timeout_ms: u64) -> Value {
    let reply = task(
        stream,
        json!({"op": "wait", "task_id": id, "timeout_ms": timeout_ms}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    reply["task"].clone()
}

fn status(stream: &mut UnixStream, id: &str) -> Value {
    task(stream, json!({"op": "status", "task_id": id}))["task"].clone()
}

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
fn after_kill_9_finished_tasks_are_intact_queued_ones_run_and_running_ones_are_interrupted() {
    require_root!("EXEC (its isolation needs namespaces)");
    let config = "[tasks]\nmax_running_per_owner = 1\n";
    let mut daemon = Daemon::start_with(config);
    let mut stream = daemon.raw();
    let finished = dispatch(&mut stream, "exec", json!({"code": "print('before')"}));
    assert_eq!(wait(&mut stream, &finished, 30_000)["state"], "completed");
    let running = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(60)"}),
    );
    let queued: Vec<String> = (0..3)
        .map(|i| {
            dispatch(
                &mut stream,
                "exec",
                json!({"code": format!("print('queued {i}')")}),
            )
        })
        .collect();
    until("the long task prints", Duration::from_secs(20), || {
        status(&mut stream, &running)["progress"]["output"] == "started\n"
    });
    assert_eq!(status(&mut stream, &queued[0])["state"], "queued");
    // Its output is saved within a second of being printed.
    std::thread::sleep(Duration::from_millis(1500));
    daemon.signal(libc::SIGKILL);
    daemon.restart(config);
    let mut stream = daemon.raw();
    let before = wait(&mut stream, &finished, 1000);
    assert_eq!(before["state"], "completed");
    assert_eq!(before["result"]["stdout"], "before\n", "{before}");
    let interrupted = wait(&mut stream, &running, 1000);
    assert_eq!(interrupted["state"], "interrupted", "{interrupted}");
    assert_eq!(
        interrupted["result"]["output"], "started\n",
        "{interrupted}"
    );
    for (i, id) in queued.iter().enumerate() {
        let done = wait(&mut stream, id, 60_000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], format!("queued {i}\n"));
    }
}

#[test]
fn ten_thousand_finished_tasks_are_paged_with_memory_bounded_and_expire() {
    // THINK tasks without an LLM fail at once: ten thousand finished tasks
    // in seconds.
    let daemon = Daemon::start_with("[tasks]\nretention_secs = 4\n");
    let mut stream = daemon.raw();
    let rss_before = daemon.rss_kib();
    let mut batch = Vec::new();
    let request = json!({"op": "dispatch", "kind": "think", "request": "hi"}).to_string();
    for _ in 0..10_000 {
        batch.extend(agentos_proto::encode_frame(
            Opcode::TASK,
            0,
            request.as_bytes(),
        ));
    }
    std::io::Write::write_all(&mut stream, &batch).unwrap();
    for _ in 0..10_000 {
        let (_, reply) = common::recv_json(&mut stream);
        assert_eq!(reply["success"], true, "{reply}");
    }
    let mut seen = 0;
    let mut before: Option<String> = None;
    loop {
        let mut request = json!({"op": "list", "limit": 1000});
        if let Some(before) = &before {
            request["before"] = json!(before);
        }
        let page = task(&mut stream, request);
        seen += page["tasks"].as_array().unwrap().len();
        match page["next"].as_str() {
            Some(next) => before = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, 10_000);
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    eprintln!("10 000 finished tasks: RSS grew by {grown} KiB");
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
    // Expiry: past their retention, they are gone.
    until("finished tasks expire", Duration::from_secs(15), || {
        task(&mut stream, json!({"op": "list", "limit": 1}))["tasks"] == json!([])
    });
}

#[test]
fn the_prompt_loop_runs_failing_code_twice_then_answers_after_the_third() {
    use agentos_bench::llm_stub::{Reply, Stub};
    require_root!("EXEC (its isolation needs namespaces)");
    let stub = Stub::start(|_, n| {
        let content = match n {
            0 => "Let me try.\n```python\nraise ValueError('first try')\n```",
            1 => "```python\nopen('/workspace/n', 'w').write('55')\nraise ValueError('second try')\n```",
            2 => "```python\nprint(open('/workspace/n').read())\n```",
            _ => "The sum of 1..10 is 55.",
        };
        Reply::openai(content, 10, 5)
    });
    let daemon = with_llm_stub(&stub.url(), "");
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "prompt",
        json!({"prompt": "What is the sum of 1..10?", "max_iterations": 5}),
    );
    let done = wait(&mut stream, &id, 60_000);
    assert_eq!(done["state"], "completed", "{done}");
    let result = &done["result"];
    assert_eq!(result["answer"], "The sum of 1..10 is 55.", "{result}");
    let iterations = result["iterations"].as_array().unwrap();
    let exit_codes: Vec<&Value> = iterations.iter().map(|i| &i["exit_code"]).collect();
    assert_eq!(exit_codes, [&json!(1), &json!(1), &json!(0)], "{result}");
    assert_eq!(iterations[2]["stdout"], "55\n", "{result}");
    assert_eq!(result["tokens"], 60, "{result}");
    // THINK was told the task, the tools, and each run's error.
    let requests = stub.requests();
    assert_eq!(requests.len(), 4);
    let first = String::from_utf8_lossy(&requests[0].body).into_owned();
    assert!(first.contains("sum of 1..10") && first.contains("tools.kernel.list_agents"));
    let second = String::from_utf8_lossy(&requests[1].body).into_owned();
    assert!(second.contains("ValueError: first try"), "{second}");
    // The task's session is gone with it.
    let sessions = call_json(
        &mut stream,
        Opcode::EXEC,
        json!({"op": "sessions"}).to_string().as_bytes(),
    );
    assert_eq!(sessions["sessions"], json!([]), "{sessions}");
}

#[test]
fn a_prompt_loop_that_never_answers_stops_at_max_iterations_with_its_transcript() {
    use agentos_bench::llm_stub::{Reply, Stub};
    require_root!("EXEC (its isolation needs namespaces)");
    let stub = Stub::start(|_, n| Reply::openai(&format!("```python\nprint({n})\n```"), 10, 5));
    let daemon = with_llm_stub(&stub.url(), "");
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "prompt",
        json!({"prompt": "count forever", "max_iterations": 3}),
    );
    let done = wait(&mut stream, &id, 60_000);
    assert_eq!(done["state"], "failed", "{done}");
    let result = &done["result"];
    assert_eq!(result["answer"], Value::Null);
    let outputs: Vec<&Value> = result["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["stdout"])
        .collect();
    assert_eq!(outputs, [&json!("0\n"), &json!("1\n"), &json!("2\n")]);
    assert!(result["error"].as_str().unwrap().contains("max_iterations"));
}

#[test]
fn a_prompt_loop_cancelled_while_its_code_runs_stops_and_its_session_goes() {
    use agentos_bench::llm_stub::{Reply, Stub};
    require_root!("EXEC (its isolation needs namespaces)");
    let stub = Stub::start(|_, _| {
        Reply::openai(
            "```python\nprint('working', flush=True)\nimport time\ntime.sleep(60)\n```",
            10,
            5,
        )
    });
    let daemon = with_llm_stub(&stub.url(), "");
    let mut stream = daemon.raw();
    let id = dispatch(&mut stream, "prompt", json!({"prompt": "take your time"}));
    until("the loop's code runs", Duration::from_secs(20), || {
        let task = status(&mut stream, &id);
        task["progress"]["output"] == "working\n" && task["progress"]["iteration"] == 1
    });
    let reply = task(&mut stream, json!({"op": "cancel", "task_id": id}));
    assert_eq!(reply["cancelled"], true, "{reply}");
    assert_eq!(status(&mut stream, &id)["state"], "cancelled");
    until("its session is closed", Duration::from_secs(5), || {
        let sessions = call_json(
            &mut stream,
            Opcode::EXEC,
            json!({"op": "sessions"}).to_string().as_bytes(),
        );
        sessions["sessions"] == json!([])
    });
    assert_eq!(
        stub.requests().len(),
        1,
        "THINK was asked again after the cancel"
    );
}

#[test]
fn tasks_running_at_a_clean_stop_end_interrupted_with_their_output_and_queued_ones_wait() {
    require_root!("EXEC (its isolation needs namespaces)");
    let config = "[tasks]\nmax_running_per_owner = 1\n";
    let mut daemon = Daemon::start_with(config);
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('halfway', flush=True)\nimport time\ntime.sleep(60)"}),
    );
    let queued = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('after the restart')"}),
    );
    until("the task prints", Duration::from_secs(20), || {
        status(&mut stream, &id)["progress"]["output"] == "halfway\n"
    });
    daemon.signal(libc::SIGTERM);
    daemon.restart(config);
    let mut stream = daemon.raw();
    let task = wait(&mut stream, &id, 1000);
    assert_eq!(task["state"], "interrupted", "{task}");
    assert_eq!(task["result"]["output"], "halfway\n", "{task}");
    // The queued one did not start while the kernel stopped: it runs now.
    let later = wait(&mut stream, &queued, 30_000);
    assert_eq!(later["state"], "completed", "{later}");
    assert_eq!(later["result"]["stdout"], "after the restart\n");
}

#[test]
fn results_that_left_memory_are_read_back_from_the_store() {
    require_root!("EXEC (its isolation needs namespaces)");
    // A cache of one byte: every result leaves memory once it is saved.
    let daemon = Daemon::start_with("[tasks]\nresult_cache_bytes = 1\n");
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('kept on disk')"}),
    );
    assert_eq!(wait(&mut stream, &id, 30_000)["state"], "completed");
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let again = wait(&mut stream, &id, 1000);
        assert_eq!(again["result"]["stdout"], "kept on disk\n", "{again}");
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
    // Nor does the operator see an agent's task.
    let mut stream = daemon.raw();
    let seen = task(&mut stream, json!({"op": "status", "task_id": id}));
    assert_eq!(seen["code"], "not_found", "{seen}");
}

#[test]
fn a_task_store_that_is_not_a_database_stops_the_kernel_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("tasks.db"), vec![0x5a; 8192]).unwrap();
    let socket = dir.path().join("agentos.sock");
    let mut daemon = Daemon::spawn_at(dir, socket, "");
    let status = daemon.wait(Duration::from_secs(10));
    assert!(!status.success(), "{status}");
    let log = daemon.log();
    assert!(log.contains("tasks.db"), "{log}");
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

#[test]
fn cancel_withdraws_a_queued_think_and_discards_a_running_ones_answer() {
    use agentos_bench::llm_stub::{Reply, Stub};
    // One request at a time, each taking a second: the first THINK task is
    // at the provider while the second waits in the kernel's queue.
    let stub = Stub::start(|_, _| {
        std::thread::sleep(Duration::from_millis(1000));
        Reply::openai("slow answer", 10, 5)
    });
    let daemon = with_llm_stub(&stub.url(), "concurrency = 1\n");
    let mut stream = daemon.raw();
    let running = dispatch(&mut stream, "think", json!("first"));
    until(
        "the first THINK reaches the provider",
        Duration::from_secs(5),
        || !stub.requests().is_empty() || status(&mut stream, &running)["state"] == "running",
    );
    let queued = dispatch(&mut stream, "think", json!("second"));
    for id in [&queued, &running] {
        let reply = task(&mut stream, json!({"op": "cancel", "task_id": id}));
        assert_eq!(reply["cancelled"], true, "{reply}");
    }
    // The provider's answer to the first comes, and changes nothing; the
    // second never reaches it.
    std::thread::sleep(Duration::from_millis(2500));
    for id in [&running, &queued] {
        let done = wait(&mut stream, id, 1000);
        assert_eq!(done["state"], "cancelled", "{done}");
        assert_eq!(done["result"]["code"], "cancelled", "{done}");
    }
    assert_eq!(
        stub.requests().len(),
        1,
        "the queued THINK reached the provider"
    );
}
