//! A run is its own principal, against a real agentosd: what code in an
//! EXEC run — an operator's, an agent's, a prompt task's — may do on its
//! own kernel connection, tried the way hostile code would.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support as support;
use agentos_test_support::require_root;
use agentos_test_support::{act, agent_info, call_json, request, until, Daemon};
use serde_json::{json, Value};

fn exec(stream: &mut UnixStream, request: Value) -> Value {
    call_json(stream, Opcode::EXEC, request.to_string().as_bytes())
}

/// Python that speaks the protocol on the run's own kernel connection:
/// `call(opcode, payload)` returns the reply as JSON.
const KERNEL_CALL: &str = r#"
import json, os, socket, struct
_kernel = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))
def call(op, payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    _kernel.sendall(struct.pack('<IIBQ', 0x41474E54, 0, op, len(data)) + data)
    head = b''
    while len(head) < 17:
        head += _kernel.recv(17 - len(head))
    size = struct.unpack('<Q', head[9:17])[0]
    body = b''
    while len(body) < size:
        body += _kernel.recv(size - len(body))
    return json.loads(body)
"#;

/// A run's code: [`KERNEL_CALL`], then `tries` (a Python dict of names to
/// calls), printed as one JSON object.
fn hostile(tries: &str) -> String {
    format!("{KERNEL_CALL}\nprint(json.dumps({tries}))\n")
}

/// What the run printed, as JSON.
fn printed(reply: &Value) -> Value {
    let stdout = reply["stdout"].as_str().unwrap_or_default();
    serde_json::from_str(stdout).unwrap_or_else(|err| panic!("{err}: {reply}"))
}

/// An operator's long-lived agent to aim at, and a task and a session of
/// the operator's to aim at too.
struct Targets {
    victim: u64,
    task_id: String,
}

fn targets(daemon: &Daemon, stream: &mut UnixStream) -> Targets {
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "victim", "command": ["/bin/sh", "-c", "echo alive; sleep 120"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let dispatched = call_json(
        stream,
        Opcode::TASK,
        json!({"op": "dispatch", "kind": "exec",
               "request": {"code": "import time; time.sleep(60)", "timeout_ms": 60000}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(dispatched["success"], true, "{dispatched}");
    let task_id = dispatched["task_id"].as_str().unwrap().to_owned();
    until("the operator's task runs", Duration::from_secs(10), || {
        task_state(stream, &task_id) == "running"
    });
    let session = exec(stream, json!({"code": "mine = 42", "session": "mine"}));
    assert_eq!(session["success"], true, "{session}");
    Targets {
        victim: spawned["id"].as_u64().unwrap(),
        task_id,
    }
}

fn task_state(stream: &mut UnixStream, task_id: &str) -> Value {
    call_json(
        stream,
        Opcode::TASK,
        json!({"op": "status", "task_id": task_id})
            .to_string()
            .as_bytes(),
    )["task"]["state"]
        .clone()
}

/// Waits for an agent a run spawned to be stopped with its run.
fn ends_with_its_run(daemon: &Daemon, child: u64) {
    let mut client = daemon.client();
    until(
        "the run's child ends with the run",
        Duration::from_secs(5),
        || agent_info(&mut client, child)["state"] == "killed",
    );
}

/// Waits for a task to finish; returns it, with its result.
fn finished(stream: &mut UnixStream, task_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = call_json(
            stream,
            Opcode::TASK,
            json!({"op": "wait", "task_id": task_id, "timeout_ms": 5000})
                .to_string()
                .as_bytes(),
        );
        if reply["task"]["result"] != Value::Null {
            return reply["task"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "task {task_id} did not finish: {reply}"
        );
    }
}

/// The operator's own things are untouched.
fn untouched(daemon: &Daemon, stream: &mut UnixStream, targets: &Targets) {
    let mut client = daemon.client();
    assert_eq!(
        agent_info(&mut client, targets.victim)["state"],
        "running",
        "the operator's agent survives"
    );
    assert_eq!(task_state(stream, &targets.task_id), "running");
    let session = exec(stream, json!({"code": "print(mine)", "session": "mine"}));
    assert_eq!(session["stdout"], "42\n", "{session}");
}

#[test]
fn an_operators_run_gets_tool_and_think_and_none_of_the_operators_power() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let targets = targets(&daemon, &mut stream);
    let tries = format!(
        r#"{{
        "spawn": call(0x10, {{"name": "evil", "command": ["/usr/bin/id"], "sandboxed": False}}),
        "kill": call(0x11, {{"name": "victim"}}),
        "kill_by_id": call(0x11, {{"id": {victim}}}),
        "list": call(0x12, b""),
        "logs": call(0x16, {{"name": "victim"}}),
        "task_list": call(0x13, {{"op": "list"}}),
        "task_cancel": call(0x13, {{"op": "cancel", "task_id": "{task}"}}),
        "exec": call(0x02, {{"code": "print(1)"}}),
        "sessions": call(0x02, {{"op": "sessions"}}),
        "close": call(0x02, {{"op": "close", "session": "mine"}}),
        "tools": call(0x05, {{"op": "search", "query": "agents", "detail": "name"}}),
    }}"#,
        victim = targets.victim,
        task = targets.task_id,
    );
    let reply = exec(&mut stream, json!({"code": hostile(&tries)}));
    assert_eq!(reply["success"], true, "{reply}");
    let got = printed(&reply);
    for refused in [
        "spawn",
        "task_list",
        "task_cancel",
        "exec",
        "sessions",
        "close",
    ] {
        assert_eq!(
            got[refused]["code"], "permission_denied",
            "{refused}: {got}"
        );
    }
    // KILL and LOGS find nothing of the operator's; LIST shows nothing.
    for (what, code) in [
        ("kill", "permission_denied"),
        ("kill_by_id", "permission_denied"),
    ] {
        assert_eq!(got[what]["success"], false, "{what}: {got}");
        assert_eq!(got[what]["code"], code, "{what}: {got}");
    }
    assert_eq!(got["logs"]["code"], "not_found", "{got}");
    assert_eq!(got["list"], json!([]), "{got}");
    // TOOL works: a run's default is its caller's tools.
    assert_eq!(got["tools"]["success"], true, "{got}");
    untouched(&daemon, &mut stream, &targets);
}

#[test]
fn a_run_given_spawn_exec_and_task_still_reaches_only_its_own() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let targets = targets(&daemon, &mut stream);
    // A script the operator can see, the run cannot.
    let hidden = daemon.dir.path().join("host-only.py");
    fs::write(&hidden, "print('escaped')\n").unwrap();
    let tries = format!(
        r#"{{
        "unsandboxed": call(0x10, {{"name": "evil", "command": ["/usr/bin/id"], "sandboxed": False}}),
        "host_path": call(0x10, {{"name": "evil2", "script": "{hidden}"}}),
        "missing_path": call(0x10, {{"name": "evil3", "script": "/nonexistent/x.py"}}),
        "kill": call(0x11, {{"name": "victim"}}),
        "logs": call(0x16, {{"name": "victim"}}),
        "list": call(0x12, b""),
        "task_list": call(0x13, {{"op": "list"}}),
        "task_status": call(0x13, {{"op": "status", "task_id": "{task}"}}),
        "task_cancel": call(0x13, {{"op": "cancel", "task_id": "{task}"}}),
        "sessions": call(0x02, {{"op": "sessions"}}),
        "close": call(0x02, {{"op": "close", "session": "mine"}}),
        "nested": call(0x02, {{"code": "print(7)"}}),
        "nested_more": call(0x02, {{"code": "print(8)", "network": True}}),
        "own_child": call(0x10, {{"name": "mine", "command": ["/bin/sleep", "300"]}}),
        "own_list": call(0x12, b""),
    }}"#,
        hidden = hidden.display(),
        task = targets.task_id,
    );
    let reply = exec(
        &mut stream,
        json!({"code": hostile(&tries), "timeout_ms": 20000,
               "permissions": {"spawn": true, "exec": true, "task": true}}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let got = printed(&reply);
    assert_eq!(got["unsandboxed"]["code"], "permission_denied", "{got}");
    assert!(
        got["unsandboxed"]["error"]
            .as_str()
            .unwrap()
            .contains("sandboxed"),
        "{got}"
    );
    // A host path it cannot see is answered exactly as a missing one.
    assert_eq!(got["host_path"]["code"], "not_found", "{got}");
    let strip = |v: &Value, path: &str| v["error"].as_str().unwrap().replace(path, "PATH");
    assert_eq!(
        strip(&got["host_path"], &hidden.display().to_string()),
        strip(&got["missing_path"], "/nonexistent/x.py"),
        "{got}"
    );
    assert_eq!(got["kill"]["code"], "permission_denied", "{got}");
    assert_eq!(got["logs"]["code"], "not_found", "{got}");
    assert_eq!(got["list"], json!([]), "{got}");
    assert_eq!(got["task_list"]["tasks"], json!([]), "{got}");
    assert_eq!(got["task_status"]["code"], "not_found", "{got}");
    assert_eq!(got["task_cancel"]["code"], "not_found", "{got}");
    assert_eq!(got["sessions"]["sessions"], json!([]), "{got}");
    assert_eq!(got["close"]["closed"], false, "{got}");
    assert_eq!(got["nested"]["stdout"], "7\n", "{got}");
    assert_eq!(got["nested_more"]["code"], "permission_denied", "{got}");
    assert_eq!(got["own_child"]["success"], true, "{got}");
    let names: Vec<&str> = got["own_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine"], "{got}");
    untouched(&daemon, &mut stream, &targets);
    // What the run spawned ended with it.
    let child = got["own_child"]["id"].as_u64().unwrap();
    ends_with_its_run(&daemon, child);
}

#[test]
fn an_agents_run_spawns_into_the_agents_tree_within_the_run_and_the_agent() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let code = hostile(
        r#"{
        "big": call(0x10, {"name": "big", "command": ["/bin/sleep", "300"], "limits": {"memory": 1 << 30}}),
        "child": call(0x10, {"name": "grandchild", "command": ["/bin/sleep", "300"]}),
        "hello": call(0xFE, b""),
    }"#,
    );
    let (id, replies) = act(
        &daemon,
        "parent",
        json!({"limits": {"memory": 256u64 << 20}, "permissions": {"spawn": true}}),
        json!([
            [Opcode::EXEC.0, {"code": code, "permissions": {"spawn": true},
                              "limits": {"memory": 128u64 << 20}}],
            [Opcode::LIST.0, {}],
        ]),
    );
    let reply = &replies[0]["reply"];
    let got = printed(reply);
    // Never more than the run was given (its 128 MiB), though the agent has 256.
    assert_eq!(got["big"]["code"], "permission_denied", "{got}");
    assert!(
        got["big"]["error"]
            .as_str()
            .unwrap()
            .contains("limits.memory"),
        "{got}"
    );
    assert_eq!(got["child"]["success"], true, "{got}");
    assert_eq!(
        got["hello"]["principal"],
        json!({"kind": "run", "of": {"kind": "agent", "id": id, "name": "parent"}}),
        "{got}"
    );
    // The agent sees it as its own descendant, with the run's limits.
    let listed = replies[1]["reply"].as_array().unwrap();
    let grandchild = listed
        .iter()
        .find(|a| a["name"] == "grandchild")
        .unwrap_or_else(|| panic!("not listed by its agent: {listed:?}"));
    assert_eq!(grandchild["limits"]["memory"], 128u64 << 20, "{grandchild}");
    // And it ended with the run.
    let child = got["child"]["id"].as_u64().unwrap();
    ends_with_its_run(&daemon, child);
}

#[test]
fn a_prompt_tasks_code_cannot_spawn_kill_or_reach_the_operators_tasks() {
    use agentos_test_support::llm_stub::{Reply, Stub};
    require_root!("EXEC (its isolation needs namespaces)");
    let code = hostile(
        r#"{
        "spawn": call(0x10, {"name": "evil", "command": ["/usr/bin/id"], "sandboxed": False}),
        "kill": call(0x11, {"name": "victim"}),
        "tasks": call(0x13, {"op": "list"}),
        "list": call(0x12, b""),
    }"#,
    );
    let stub = Stub::start(move |_, n| {
        let content = match n {
            0 => format!("```python\n{code}\n```"),
            _ => "Done.".to_owned(),
        };
        Reply::openai(&content, 10, 5)
    });
    let daemon = support::with_llm_stub(&stub.url(), "");
    let mut stream = daemon.raw();
    let targets = targets(&daemon, &mut stream);
    let dispatched = call_json(
        &mut stream,
        Opcode::TASK,
        json!({"op": "dispatch", "kind": "prompt", "request": {"prompt": "take over"}})
            .to_string()
            .as_bytes(),
    );
    let done = finished(&mut stream, dispatched["task_id"].as_str().unwrap());
    let iteration = &done["result"]["iterations"][0];
    let got: Value = serde_json::from_str(iteration["stdout"].as_str().unwrap())
        .unwrap_or_else(|err| panic!("{err}: {done}"));
    for refused in ["spawn", "kill", "tasks"] {
        assert_eq!(
            got[refused]["code"], "permission_denied",
            "{refused}: {got}"
        );
    }
    assert_eq!(got["list"], json!([]), "{got}");
    untouched(&daemon, &mut stream, &targets);
}

/// Processes in the kernel's cgroups whose command line holds `marker`.
fn processes_with(marker: &str, kernel: i32) -> usize {
    support::processes_with(marker, Some(kernel))
}

#[test]
fn an_agent_flooding_exec_leaves_the_operator_room_and_its_runs_end_with_it() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let dir = support::shared_dir();
    // Twelve connections, each with a long run that waits on a child.
    let flood = support::write_script(
        dir.path(),
        "flood.py",
        &format!(
            "{}\nimport threading, time\n\
             def long_run():\n\
             \x20   s = socket.socket(socket.AF_UNIX)\n\
             \x20   s.connect(os.environ['AGENTOS_SOCKET'])\n\
             \x20   code = \"import subprocess; subprocess.run(['/bin/sleep', '977'])\"\n\
             \x20   body = json.dumps({{'code': code, 'timeout_ms': 120000}}).encode()\n\
             \x20   s.sendall(struct.pack('<IIBQ', 0x41474E54, 0, 0x02, len(body)) + body)\n\
             \x20   s.recv(17)\n\
             threads = [threading.Thread(target=long_run, daemon=True) for _ in range(12)]\n\
             [t.start() for t in threads]\n\
             print('FLOODING', flush=True)\n\
             time.sleep(300)\n",
            support::PY_KERNEL
        ),
    );
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "flood", "script": flood}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    until(
        "the flood's runs are under way",
        Duration::from_secs(20),
        || processes_with("sleep 977", daemon.pid()) >= 2,
    );
    std::thread::sleep(Duration::from_millis(300));
    // Its share is capped: two of the four slots, not all of them.
    assert_eq!(processes_with("sleep 977", daemon.pid()), 2);
    let mut stream = daemon.raw();
    for _ in 0..5 {
        let started = Instant::now();
        let reply = exec(&mut stream, json!({"code": "print(1)", "timeout_ms": 5000}));
        let took = started.elapsed();
        assert_eq!(reply["stdout"], "1\n", "{reply}");
        assert!(
            took < Duration::from_secs(1),
            "the operator's run took {took:?}"
        );
    }
    // KILL the agent: its runs are gone within a second.
    let killed = Instant::now();
    let reply = request(&mut client, Opcode::KILL, &json!({"id": id}));
    assert_eq!(reply["killed"], true, "{reply}");
    until(
        "the flood's runs end with it",
        Duration::from_secs(1),
        || processes_with("sleep 977", daemon.pid()) == 0,
    );
    eprintln!(
        "the flood's runs were gone {:?} after KILL",
        killed.elapsed()
    );
}

#[test]
fn a_run_queued_behind_other_work_says_so_at_its_timeout() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nmax_running_per_owner = 1\n");
    let mut stream = daemon.raw();
    support::send(
        &mut stream,
        Opcode::EXEC,
        json!({"code": "import time; time.sleep(3)", "timeout_ms": 10000})
            .to_string()
            .as_bytes(),
    );
    let mut second = daemon.raw();
    let reply = exec(&mut second, json!({"code": "print(1)", "timeout_ms": 500}));
    assert_eq!(reply["code"], "timeout", "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(error.contains("queued behind other work"), "{error}");
    assert!(error.contains("max_running_per_owner"), "{error}");
    assert!(!error.contains("starting or failing"), "{error}");
}

#[test]
fn a_connections_runs_end_when_it_closes() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    {
        let mut stream = daemon.raw();
        support::send(
            &mut stream,
            Opcode::EXEC,
            json!({"code": "import subprocess; subprocess.run(['/bin/sleep', '978'])",
                   "timeout_ms": 60000})
            .to_string()
            .as_bytes(),
        );
        until("the run is under way", Duration::from_secs(10), || {
            processes_with("sleep 978", daemon.pid()) == 1
        });
    }
    until(
        "the run ends with its connection",
        Duration::from_secs(2),
        || processes_with("sleep 978", daemon.pid()) == 0,
    );
}

/// What agent `id`'s cgroup (its own processes and its runs') has used at
/// most, in bytes, and may use.
fn agent_memory(kernel: i32, id: u64) -> (u64, u64) {
    let instance = format!("/sys/fs/cgroup/memory/agentos/agentosd-{kernel}");
    let dir = fs::read_dir(&instance)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("agent-{id}-"))
        })
        .unwrap_or_else(|| panic!("no cgroup of agent {id} under {instance}"))
        .path();
    let number = |file: &str| -> u64 {
        fs::read_to_string(dir.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (
        number("memory.max_usage_in_bytes"),
        number("memory.limit_in_bytes"),
    )
}

#[test]
fn an_agents_sessions_add_up_within_its_own_memory_limit() {
    require_root!("EXEC (its isolation needs namespaces and cgroups)");
    if !std::path::Path::new("/sys/fs/cgroup/memory/memory.use_hierarchy").exists() {
        eprintln!("!!! NOT TESTED: this test reads cgroup v1's memory figures");
        return;
    }
    let daemon = Daemon::start();
    let hold = |i: u32| {
        json!([Opcode::EXEC.0, {"code": "x = bytearray(40 << 20); print('holding')",
                                "session": format!("s{i}")}])
    };
    let check = |i: u32| json!([Opcode::EXEC.0, {"code": "print(len(x) >> 20)", "session": format!("s{i}")}]);
    let mut requests: Vec<Value> = (0..6).map(hold).collect();
    requests.extend((0..6).map(check));
    let (id, replies) = act(
        &daemon,
        "hoarder",
        json!({"limits": {"memory": 64u64 << 20}}),
        Value::Array(requests),
    );
    let (peak, limit) = agent_memory(daemon.pid(), id);
    eprintln!(
        "agent with a {} MiB limit: at most {} MiB used by it and its sessions together",
        limit >> 20,
        peak >> 20
    );
    assert_eq!(limit, 64 << 20);
    assert!(peak <= limit, "{peak} over {limit}");
    // Six sessions of 40 MiB cannot all hold at once: those that did not
    // fit were killed for memory, and said so to the agent.
    let holding = replies[6..]
        .iter()
        .filter(|r| r["reply"]["stdout"] == "40\n")
        .count();
    assert!(holding <= 1, "{holding} sessions hold 40 MiB: {replies:?}");
    let oom_reported = replies.iter().any(|r| r["reply"]["oom_killed"] == true);
    assert!(oom_reported, "no run was told of an OOM kill: {replies:?}");
    // No one else paid for it: an operator's run of 100 MiB still fits.
    let mut stream = daemon.raw();
    let other = exec(
        &mut stream,
        json!({"code": "x = bytearray(100 << 20); print('fine')"}),
    );
    assert_eq!(other["stdout"], "fine\n", "{other}");
}

#[test]
fn a_run_cgroup_is_given_to_the_next_run_empty_of_memory() {
    require_root!("EXEC (its isolation needs namespaces and cgroups)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // A session's snapshot of 100 MiB of incompressible files: the kernel
    // keeps its pages, which its run's cgroup was charged for.
    let written = exec(
        &mut stream,
        json!({"code": "open('big', 'wb').write(__import__('os').urandom(100 << 20)); print('ok')",
               "session": "big", "timeout_ms": 60000}),
    );
    assert_eq!(written["stdout"], "ok\n", "{written}");
    let snapshot = call_json(
        &mut stream,
        Opcode::EXEC,
        json!({"op": "snapshot", "session": "big", "name": "all"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(snapshot["success"], true, "{snapshot}");
    let restored = call_json(
        &mut stream,
        Opcode::EXEC,
        json!({"op": "restore", "session": "big", "name": "all"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(restored["success"], true, "{restored}");
    // Every run after it, whichever cgroup it gets, has its whole limit.
    for n in 0..12 {
        let reply = exec(
            &mut stream,
            json!({"code": "x = bytearray(96 << 20); print('fits')",
                   "limits": {"memory": 128u64 << 20}}),
        );
        assert_eq!(reply["stdout"], "fits\n", "run {n}: {reply}");
    }
}

#[test]
fn a_runs_connection_dies_with_the_run_even_where_its_code_kept_a_copy() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // A session's code keeps a copy of its run's connection...
    let kept = exec(
        &mut stream,
        json!({"code": format!("{KERNEL_CALL}\nimport os\nkept = os.dup(_kernel.fileno())\nprint(call(0xFE, b'')['principal']['kind'])"),
               "session": "keeper"}),
    );
    assert_eq!(kept["stdout"], "run\n", "{kept}");
    // ...which the next run finds closed: the run it belonged to is over.
    let later = exec(
        &mut stream,
        json!({"code": "s = socket.socket(fileno=kept)\ntry:\n    s.sendall(struct.pack('<IIBQ', 0x41474E54, 0, 0, 2) + b'hi')\n    print(repr(s.recv(64)))\nexcept OSError as err:\n    print('closed', err.errno)",
               "session": "keeper"}),
    );
    let said = later["stdout"].as_str().unwrap();
    assert!(said == "b''\n" || said.starts_with("closed"), "{later}");
}

#[test]
fn a_sessions_runs_all_ask_what_its_first_asked() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let first = exec(&mut stream, json!({"code": "x = 1", "session": "s"}));
    assert_eq!(first["success"], true, "{first}");
    // A later run may not bring more to what the first left running.
    let more = exec(
        &mut stream,
        json!({"code": "print(x)", "session": "s", "permissions": {"spawn": true}}),
    );
    assert_eq!(more["code"], "bad_request", "{more}");
    assert!(
        more["error"].as_str().unwrap().contains("session"),
        "{more}"
    );
    let same = exec(&mut stream, json!({"code": "print(x)", "session": "s"}));
    assert_eq!(same["stdout"], "1\n", "{same}");
}

#[test]
fn a_run_may_not_give_its_runs_runs_of_their_own() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = exec(
        &mut stream,
        json!({"code": hostile(r#"{
            "deeper": call(0x02, {"code": "print(1)", "permissions": {"exec": True}}),
            "nested": call(0x02, {"code": "print(2)"}),
        }"#),
        "permissions": {"exec": true}}),
    );
    let got = printed(&reply);
    assert_eq!(got["deeper"]["code"], "permission_denied", "{got}");
    assert!(
        got["deeper"]["error"]
            .as_str()
            .unwrap()
            .contains("permissions.exec"),
        "{got}"
    );
    assert_eq!(got["nested"]["stdout"], "2\n", "{got}");
}

#[test]
fn runs_cannot_reach_each_other_over_loopback() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // A session listens on a loopback port and an abstract socket...
    let listening = exec(
        &mut stream,
        json!({"code": "import socket\nl = socket.socket()\nl.bind(('127.0.0.1', 47123))\nl.listen()\na = socket.socket(socket.AF_UNIX)\na.bind('\\0agentos-test-run')\na.listen()\nprint('up')",
               "session": "listener"}),
    );
    assert_eq!(listening["stdout"], "up\n", "{listening}");
    // ...that no other run reaches.
    let tries = exec(
        &mut stream,
        json!({"code": "import socket\nfor family, address in [(socket.AF_INET, ('127.0.0.1', 47123)), (socket.AF_UNIX, '\\0agentos-test-run')]:\n    s = socket.socket(family)\n    try:\n        s.connect(address)\n        print('reached')\n    except OSError as err:\n        print('refused', err.errno)"}),
    );
    let said = tries["stdout"].as_str().unwrap();
    assert!(!said.contains("reached"), "{tries}");
    assert_eq!(said.lines().count(), 2, "{tries}");
    // Its own loopback works.
    let own = exec(
        &mut stream,
        json!({"code": "import socket\nl = socket.socket()\nl.bind(('127.0.0.1', 0))\nl.listen()\nc = socket.create_connection(l.getsockname())\nprint('own loopback')"}),
    );
    assert_eq!(own["stdout"], "own loopback\n", "{own}");
}

#[test]
fn an_agent_that_a_runs_child_spawned_ends_with_the_run_too() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // The run's child spawns a grandchild, then exits.
    let spawner = format!(
        "{}\n_, reply = call(0x10, {{'name': 'grandchild', 'command': ['/bin/sleep', '300']}})\n\
         print(reply.decode(), flush=True)\n",
        support::PY_KERNEL
    );
    let tries = format!(
        r#"{{"child": call(0x10, {{"name": "child", "command": ["/usr/bin/python3", "-c", {}],
                                   "permissions": {{"spawn": True}}}})}}"#,
        serde_json::to_string(&spawner).unwrap()
    );
    let reply = exec(
        &mut stream,
        json!({"code": hostile(&tries) + "\nimport time\ntime.sleep(2)\n",
               "permissions": {"spawn": true}, "timeout_ms": 20000}),
    );
    let got = printed(&reply);
    assert_eq!(got["child"]["success"], true, "{reply}");
    let mut client = daemon.client();
    let grandchild = support::listed_names(&mut client);
    assert!(
        grandchild.contains(&"grandchild".to_owned()),
        "{grandchild:?}"
    );
    let id = request(&mut client, Opcode::LIST, &json!({}))
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "grandchild")
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    ends_with_its_run(&daemon, id);
}
