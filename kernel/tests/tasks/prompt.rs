//! The prompt-to-program loop against a stand-in provider, and THINK
//! tasks withdrawn or discarded when cancelled.

use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{call_json, require_root, until, with_llm_stub};
use serde_json::{json, Value};

use crate::{dispatch, status, task, wait};

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
