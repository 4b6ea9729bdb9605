//! TASK against a real agentosd: background EXEC and THINK work that
//! belongs to its owner, outlives its connection and the kernel process,
//! and is really stopped when cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support as support;
use agentos_test_support::require_root;
use agentos_test_support::{act, call_json, until, with_llm_stub, Daemon};
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
        let (_, reply) = support::recv_json(&mut stream);
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
    use agentos_test_support::llm_stub::{Reply, Stub};
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
    use agentos_test_support::llm_stub::{Reply, Stub};
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
    use agentos_test_support::llm_stub::{Reply, Stub};
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
    // An operator reaches any task by its id.
    let mut stream = daemon.raw();
    let seen = task(&mut stream, json!({"op": "status", "task_id": id}));
    assert_eq!(seen["task"]["label"], "mine", "{seen}");
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
    use agentos_test_support::llm_stub::{Reply, Stub};
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

/// A tmpfs of a set size on a directory, unmounted when the test ends,
/// however it ends.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .unwrap();
        Tmpfs(dir.to_path_buf())
    }

    /// Gives it another size, keeping what it holds.
    fn resize(&self, size: &str) {
        nix::mount::mount(
            None::<&str>,
            &self.0,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT,
            Some(format!("size={size}").as_str()),
        )
        .unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Detached: a daemon still holding files in it cannot keep it.
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Dispatches EXEC tasks running `code` until the store's disk is full:
/// the ids acknowledged, and the first refusal.
fn fill_the_disk(stream: &mut UnixStream, code: &str) -> (Vec<String>, Value) {
    let exec = json!({"op": "dispatch", "kind": "exec", "request": {"code": code}});
    let mut acknowledged = Vec::new();
    loop {
        let reply = task(stream, exec.clone());
        if reply["success"] != true {
            eprintln!(
                "{} dispatches acknowledged, then: {reply}",
                acknowledged.len()
            );
            return (acknowledged, reply);
        }
        acknowledged.push(reply["task_id"].as_str().unwrap().to_owned());
        assert!(acknowledged.len() < 100, "the disk never filled");
    }
}

/// A dispatch's refusal names the full disk.
fn assert_refused_for_a_full_disk(refused: &Value) {
    assert_eq!(refused["success"], false, "{refused}");
    assert_eq!(refused["code"], "unavailable", "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("No space left on device") && error.contains("not queued"),
        "{error}"
    );
    assert!(refused.get("task_id").is_none(), "{refused}");
}

/// A daemon whose state directory (AGENTOS_STATE_DIR, which a restart
/// keeps) is a tmpfs of `size`; the tmpfs goes when the test ends, after
/// the daemon.
fn daemon_on_a_tmpfs(size: &str) -> (Tmpfs, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    let disk = Tmpfs::mount(&state, size);
    (disk, Daemon::start_in(dir, ""))
}

#[test]
fn on_a_full_disk_dispatches_are_refused_naming_the_cause_none_acknowledged_is_lost_and_room_brings_them_back(
) {
    require_root!("mounting a tmpfs, and EXEC (its isolation needs namespaces)");
    let (disk, mut daemon) = daemon_on_a_tmpfs("300k");
    let mut stream = daemon.raw();
    // A record of some 20 KiB each: the disk is full after a few.
    let code = format!("# {}\nprint('done')", "x".repeat(20 * 1024));
    let (acknowledged, first_refusal) = fill_the_disk(&mut stream, &code);
    assert!(acknowledged.len() >= 3, "{first_refusal}");
    // Every dispatch past the full disk is refused, naming the cause.
    assert_refused_for_a_full_disk(&first_refusal);
    for _ in 0..5 {
        let refused = task(
            &mut stream,
            json!({"op": "dispatch", "kind": "exec", "request": {"code": code}}),
        );
        assert_refused_for_a_full_disk(&refused);
    }
    // None acknowledged is lost: each runs to its end; none refused is
    // listed.
    for id in &acknowledged {
        let done = wait(&mut stream, id, 60_000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], "done\n", "{done}");
    }
    let listed = task(&mut stream, json!({"op": "list", "limit": 1000}));
    let mut listed: Vec<String> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    listed.reverse();
    assert_eq!(listed, acknowledged);
    // Room again: dispatches succeed, with no restart.
    disk.resize("4m");
    let after = dispatch(&mut stream, "exec", json!({"code": code}));
    assert_eq!(wait(&mut stream, &after, 60_000)["state"], "completed");
    let log = daemon.log();
    assert!(log.contains("No space left on device"), "{log}");
    assert!(log.contains("saves again"), "{log}");
    // And what waited to be saved meanwhile (the ends of the tasks that
    // ran while the disk was full) is on disk: after a restart each task
    // is there, finished.
    daemon.signal(libc::SIGTERM);
    daemon.restart("");
    let mut stream = daemon.raw();
    for id in acknowledged.iter().chain([&after]) {
        let done = wait(&mut stream, id, 1000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], "done\n", "{done}");
    }
}

#[test]
fn a_kernel_stopped_on_a_full_disk_names_what_it_could_not_save_and_the_next_one_what_it_found() {
    require_root!("mounting a tmpfs, and EXEC (its isolation needs namespaces)");
    let (disk, mut daemon) = daemon_on_a_tmpfs("300k");
    let mut stream = daemon.raw();
    // Each result (40 KB printed) is larger than any record the full disk
    // still takes: the tasks' ends cannot be saved.
    let code = format!("# {}\nprint('y' * 40000)", "x".repeat(20 * 1024));
    let (acknowledged, refused) = fill_the_disk(&mut stream, &code);
    assert_refused_for_a_full_disk(&refused);
    for id in &acknowledged {
        assert_eq!(wait(&mut stream, id, 60_000)["state"], "completed");
    }
    daemon.signal(libc::SIGTERM);
    daemon.wait(Duration::from_secs(10));
    // The stopping kernel says, task by task, what is lost.
    let log = daemon.log();
    assert!(log.contains("before the kernel stopped"), "{log}");
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| log.contains(&format!("task {id}: not saved:")))
        .collect();
    assert!(!lost.is_empty(), "{log}");
    for id in &lost {
        assert!(
            log.contains(&format!(
                "task {id}: not saved: its start, its end (completed)"
            )) || log.contains(&format!("task {id}: not saved: its end (completed)")),
            "{log}"
        );
    }
    // The next kernel (with room) has each acknowledged task still: one
    // whose start was saved but not its end ends interrupted, named in
    // its log; one whose start was lost is queued again, and runs.
    disk.resize("4m");
    daemon.restart("");
    let mut stream = daemon.raw();
    let log = daemon.log();
    for id in &acknowledged {
        let task = wait(&mut stream, id, 60_000);
        match task["state"].as_str() {
            Some("interrupted") => assert!(
                log.contains("end interrupted") && log.contains(id.as_str()),
                "{id}: {log}"
            ),
            Some("completed") => {}
            _ => panic!("{task}"),
        }
    }
}

#[test]
fn the_task_store_is_private_whatever_the_umask_and_however_an_earlier_kernel_left_it() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    // A store left open to all: its directory and lock.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(state.join("agentosd.lock"), b"").unwrap();
    fs::set_permissions(
        state.join("agentosd.lock"),
        fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    // The most permissive umask there is: nextest runs each test in a
    // process of its own, whose umask the daemon inherits.
    // SAFETY: umask(2) only sets the process's mask.
    let previous = unsafe { libc::umask(0) };
    let daemon = Daemon::start_in(dir, "");
    // SAFETY: as above.
    unsafe { libc::umask(previous) };
    let mut stream = daemon.raw();
    // Without an LLM a THINK task fails at once: records and a result are
    // written, so SQLite has made its -wal and -shm.
    let id = dispatch(&mut stream, "think", json!("hi"));
    assert_eq!(wait(&mut stream, &id, 10_000)["state"], "failed");
    assert_eq!(mode(&state), 0o700);
    for name in ["agentosd.lock", "tasks.db", "tasks.db-wal", "tasks.db-shm"] {
        assert_eq!(mode(&state.join(name)), 0o600, "{name}");
    }
    let log = daemon.log();
    assert!(
        log.contains(&format!("{} was mode 777; made 700", state.display())),
        "{log}"
    );
    assert!(
        log.contains("agentosd.lock was mode 666; made 600"),
        "{log}"
    );
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
