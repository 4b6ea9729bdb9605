//! A run is its own principal: what code in an EXEC run — an operator's, an
//! agent's, a prompt task's — may do on its own kernel connection, tried the
//! way hostile code would, and what an agent's runs may get.

use std::fs;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{
    self as support, act, agent_info, call_json, request, require_root, until, Daemon,
};
use serde_json::{json, Value};

use crate::{ends_with_its_run, exec, hostile, printed};

#[test]
fn agents_need_permission_and_their_sessions_are_their_own() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let exec_op = Opcode::EXEC.0;
    // An operator's session, which no agent may reach.
    let mut stream = daemon.raw();
    exec(
        &mut stream,
        json!({"code": "secret = 'operator'", "session": "shared-name"}),
    );
    let (_, denied) = support::act(
        &daemon,
        "no-exec",
        json!({"permissions": {"exec": false}}),
        json!([[exec_op, {"code": "print(1)"}]]),
    );
    assert_eq!(
        denied[0]["reply"]["code"], "permission_denied",
        "{denied:?}"
    );
    let (_, allowed) = support::act(
        &daemon,
        "with-exec",
        json!({}),
        json!([
            [exec_op, {"code": "print('secret' in globals())", "session": "shared-name"}],
            [exec_op, {"op": "sessions"}],
        ]),
    );
    assert_eq!(allowed[0]["reply"]["stdout"], "False\n", "{allowed:?}");
    let names: Vec<&str> = allowed[1]["reply"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shared-name"], "the agent's own session only");
    // The operator's session is untouched.
    let still = exec(
        &mut stream,
        json!({"code": "print(secret)", "session": "shared-name"}),
    );
    assert_eq!(still["stdout"], "operator\n");
}

#[test]
fn an_agents_runs_never_get_more_than_the_agent() {
    require_root!("EXEC (its isolation needs namespaces and cgroups)");
    let daemon = Daemon::start();
    let exec_op = Opcode::EXEC.0;
    let (_, replies) = support::act(
        &daemon,
        "bounded",
        json!({"limits": {"memory": 100u64 << 20}}),
        json!([
            // Within EXEC's default, but not within the agent's own.
            [exec_op, {"code": "x = b'x' * (150 << 20)"}],
            [exec_op, {"code": "1", "limits": {"memory": 200u64 << 20}}],
            [exec_op, {"code": "x = b'x' * (50 << 20); print(len(x))",
                       "limits": {"memory": 100u64 << 20}}],
        ]),
    );
    assert_eq!(replies[0]["reply"]["oom_killed"], true, "{replies:?}");
    let more = &replies[1]["reply"];
    assert_eq!(more["code"], "permission_denied", "{more}");
    assert!(more["error"].as_str().unwrap().contains("limits.memory"));
    assert_eq!(replies[2]["reply"]["stdout"], "52428800\n", "{replies:?}");
}

#[test]
fn a_runs_own_kernel_connection_is_a_run_of_its_caller_never_the_caller() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let me = call_json(&mut stream, Opcode::HELLO, b"");
    assert_eq!(
        me["principal"],
        json!({"kind": "operator", "uid": 0}),
        "{me}"
    );
    let hello = "import os, socket, struct, json\n\
                 s = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))\n\
                 s.sendall(struct.pack('<IIBQ', 0x41474E54, 0, 0xFE, 0))\n\
                 h = b''\nwhile len(h) < 17: h += s.recv(17 - len(h))\n\
                 n = struct.unpack('<Q', h[9:17])[0]\nb = b''\nwhile len(b) < n: b += s.recv(n - len(b))\n\
                 print(json.dumps(json.loads(b)))";
    let as_operator = exec(&mut stream, json!({"code": hello}));
    let seen: Value = serde_json::from_str(as_operator["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen["principal"],
        json!({"kind": "run", "of": {"kind": "operator", "uid": 0}}),
        "{seen}"
    );
    assert_ne!(seen["agent_id"], me["agent_id"], "{seen}");
    assert!(seen["agent_id"].as_u64().unwrap() >= 1_000_000, "{seen}");
    let (id, replies) = support::act(
        &daemon,
        "runner",
        json!({}),
        json!([[Opcode::EXEC.0, {"code": hello}]]),
    );
    let seen: Value =
        serde_json::from_str(replies[0]["reply"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(
        seen["principal"],
        json!({"kind": "run", "of": {"kind": "agent", "id": id, "name": "runner"}}),
        "{replies:?}"
    );
    assert_ne!(seen["agent_id"], json!(id), "{seen}");
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
    // A volume of the operator's, which the run is not given.
    let made = exec(
        &mut stream,
        json!({"op": "create_volume", "volume": "opdata", "bytes": 16 << 20}),
    );
    assert_eq!(made["success"], true, "{made}");
    let tries = format!(
        r#"{{
        "unsandboxed": call(0x10, {{"name": "evil", "command": ["/usr/bin/id"], "sandboxed": False}}),
        "host_path": call(0x10, {{"name": "evil2", "script": "{hidden}"}}),
        "missing_path": call(0x10, {{"name": "evil3", "script": "/nonexistent/x.py"}}),
        "kill": call(0x11, {{"name": "victim"}}),
        "restart": call(0x11, {{"name": "victim", "restart": True}}),
        "remove": call(0x11, {{"name": "victim", "remove": True}}),
        "restart_missing": call(0x11, {{"name": "nobody", "restart": True}}),
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
        "own_restart": call(0x11, {{"name": "mine", "restart": True, "grace_ms": 0}}),
        "build_template": call(0x02, {{"op": "build_template", "template": "evil",
                                       "packages": ["six"]}}),
        "remove_template": call(0x02, {{"op": "remove_template", "template": "evil"}}),
        "unbuilt_template": call(0x02, {{"code": "print(9)", "template": "../../etc"}}),
        "callers_volume": call(0x02, {{"code": "print(1)",
                                       "volumes": [{{"name": "opdata", "path": "/data"}}]}}),
        "volumes": call(0x02, {{"op": "volumes"}}),
        "remove_callers_volume": call(0x02, {{"op": "remove_volume", "volume": "opdata"}}),
        "huge_volume": call(0x02, {{"op": "create_volume", "volume": "big", "bytes": 1 << 50}}),
        "volume_on_socket": call(0x02, {{"code": "print(1)",
                                         "volumes": [{{"name": "v", "path": "/run/agentos"}}]}}),
        "volume_misspelt": call(0x02, {{"code": "print(1)",
                                        "volumes": [{{"name": "v", "path": "/data", "ro": True}}]}}),
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
    // Restarting or removing what it did not start is answered as for no
    // such agent.
    let missing = got["restart_missing"]["error"].as_str().unwrap();
    for tried in ["restart", "remove"] {
        assert_eq!(got[tried]["code"], "not_found", "{got}");
        assert_eq!(
            got[tried]["error"],
            missing.replace("nobody", "victim"),
            "{got}"
        );
    }
    assert_eq!(got["own_restart"]["restarted"], true, "{got}");
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
    // A run's build is its own run: the package index lies beyond a
    // run's loopback. It has no template of its own to remove, and a
    // template name is a name, never a path.
    assert_eq!(got["build_template"]["code"], "permission_denied", "{got}");
    assert!(
        got["build_template"]["error"]
            .as_str()
            .unwrap()
            .contains("network"),
        "{got}"
    );
    assert_eq!(got["remove_template"]["removed"], false, "{got}");
    assert_eq!(got["unbuilt_template"]["code"], "bad_request", "{got}");
    // Its caller's volume is not the run's unless given; it cannot make
    // one past the share of the disk, nor mount one on the kernel's socket.
    assert_eq!(got["callers_volume"]["code"], "not_found", "{got}");
    assert_eq!(got["volumes"]["volumes"], json!([]), "{got}");
    assert_eq!(got["remove_callers_volume"]["code"], "not_found", "{got}");
    assert_eq!(got["huge_volume"]["code"], "limit_exceeded", "{got}");
    assert_eq!(got["volume_on_socket"]["code"], "bad_request", "{got}");
    assert_eq!(got["volume_misspelt"]["code"], "bad_request", "{got}");
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
fn a_runs_code_gets_nothing_of_its_caller_from_clove_calls() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let operators = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "operators-own", "command": ["/bin/sleep", "30"]}),
    );
    let id = operators["id"].as_u64().unwrap();
    let secret = tempfile::tempdir().unwrap();
    let secret_file = secret.path().join("key.txt");
    fs::write(&secret_file, "the operator's").unwrap();
    let tries = format!(
        r#"{{"perms": call(0x40, {{}}),
            "raise": call(0x41, {{"permissions": {{"can_spawn": True}}}}),
            "lower_theirs": call(0x41, {{"agent_id": {id}, "level": "minimal"}}),
            "read": call(0x03, {{"path": {path:?}}}),
            "write": call(0x04, {{"path": "/tmp/from-a-run.txt", "content": "x"}}),
            "pause": call(0x14, {{"id": {id}}}),
            "host": call(0xC0, {{}}),
            "their_cgroup": call(0xC3, {{"cgroup_path": "operators-own"}}),
            "path": call(0xC3, {{"cgroup_path": "/sys/fs/cgroup/memory"}}),
            "kernels_loopback": call(0x50, {{"url": "http://127.0.0.1:9/"}}),
            "metadata": call(0x50, {{"url": "http://169.254.169.254/latest/meta-data/"}})}}"#,
        path = secret_file.to_str().unwrap()
    );
    let mut stream = daemon.raw();
    let reply = exec(&mut stream, json!({"code": hostile(&tries)}));
    let got = printed(&reply);
    // It sees its own, as a run: no spawn, no exec of its own.
    assert_eq!(got["perms"]["success"], true, "{got}");
    assert_eq!(got["perms"]["permissions"]["spawn"], false, "{got}");
    assert_eq!(got["perms"]["permissions"]["exec"], false, "{got}");
    for (call, code) in [
        ("raise", "permission_denied"),
        ("lower_theirs", "not_found"),
        ("read", "permission_denied"),
        ("write", "permission_denied"),
        ("pause", "permission_denied"),
        ("host", "permission_denied"),
        ("their_cgroup", "not_found"),
        ("path", "bad_request"),
        // A run reaches its own loopback only: the kernel makes no
        // request for it.
        ("kernels_loopback", "permission_denied"),
        ("metadata", "permission_denied"),
    ] {
        assert_eq!(got[call]["success"], false, "{call}: {got}");
        assert_eq!(got[call]["code"], code, "{call}: {got}");
    }
    let info = agent_info(&mut client, id);
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(info["permissions"]["think"], true, "{info}");
    assert!(!std::path::Path::new("/tmp/from-a-run.txt").exists());
}
