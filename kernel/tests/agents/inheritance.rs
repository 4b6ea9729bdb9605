//! What a hostile agent tries for more than its parent gave it (network,
//! limits, permissions, tokens), and host paths outside its own view or the
//! kernel's config and socket beside its script. Each test is what an agent
//! written to escalate would do.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{
    act, act_in, agent_info, agent_log, listed_names, request, require_root, shared_dir,
    wait_for_state, write_script, Daemon, PY_KERNEL,
};
use serde_json::{json, Value};

use crate::{reply, tree, SPAWN};

fn assert_denied(reply: &Value, field: &str) {
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], "permission_denied", "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains(field),
        "the error must name {field}: {error}"
    );
}

// ---- 1. network -------------------------------------------------------------

#[test]
fn a_child_never_gets_the_network_its_parent_lacks() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let (_, replies) = act(
        &daemon,
        "offline",
        json!({"permissions": {"spawn": true}}),
        json!([[SPAWN, {"name": "online-child", "command": ["/bin/sleep", "30"], "network": true}]]),
    );
    assert_denied(reply(&replies, 0), "network");
    assert!(!listed_names(&mut client).contains(&"online-child".to_owned()));
}

// ---- 2. paths are resolved in the agent's own view ---------------------------

#[test]
fn an_agents_paths_are_resolved_in_its_own_view_and_hidden_ones_look_missing() {
    require_root!("agents as another user, with a view of their own");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let child = write_script(dir.path(), "child.py", "print('child ran', flush=True)\n");
    // Host files the parent cannot see: another directory, a directory it
    // may not enter, a link in its own directory pointing outside.
    let elsewhere = shared_dir();
    let secret = write_script(elsewhere.path(), "secret.py", "print('secret')\n");
    let tool = write_script(elsewhere.path(), "tool.sh", "#!/bin/sh\necho tool\n");
    let private = dir.path().join("private");
    fs::create_dir(&private).unwrap();
    let hidden = write_script(&private, "hidden.py", "print('hidden')\n");
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.path().join("link.py");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let dotdot = format!(
        "{}/../{}/secret.py",
        dir.path().display(),
        elsewhere.path().file_name().unwrap().to_str().unwrap()
    );
    let missing = dir.path().join("missing.py");
    // A file it may not read, a directory it may not enter, beside ones
    // that do not exist.
    let unreadable = write_script(dir.path(), "unreadable.py", "print('read')\n");
    fs::set_permissions(&unreadable, fs::Permissions::from_mode(0o600)).unwrap();
    let missing_dir = dir.path().join("missing-dir");
    let missing_python = elsewhere.path().join("python9");

    let attempts = [
        json!({"name": "c-secret", "script": secret}),
        json!({"name": "c-find", "python": "/usr/bin/find", "script": secret}),
        json!({"name": "c-hidden", "script": hidden}),
        json!({"name": "c-link", "script": link}),
        json!({"name": "c-dotdot", "script": dotdot}),
        json!({"name": "c-python", "python": tool, "script": child}),
        json!({"name": "c-missing", "script": missing}),
        json!({"name": "c-tool", "command": [tool]}),
        json!({"name": "c-nothing", "command": [elsewhere.path().join("nothing.sh")]}),
        json!({"name": "c-ok", "script": child}),
        json!({"name": "c-unreadable", "script": unreadable}),
        json!({"name": "c-locked", "script": child, "cwd": private}),
        json!({"name": "c-nowhere", "script": child, "cwd": missing_dir}),
        json!({"name": "c-no-python", "python": missing_python, "script": child}),
    ];
    let requests: Vec<Value> = attempts.iter().map(|a| json!([SPAWN, a])).collect();
    let mut client = daemon.client();
    let (_, replies) = act_in(
        &daemon,
        dir.path(),
        "explorer",
        json!({"permissions": {"spawn": true}}),
        Value::from(requests),
    );
    // Every path the parent cannot see is refused exactly as a missing one
    // is: the same code, and the same sentence but for the path.
    let shape = |n: usize, path: &str| {
        let reply = reply(&replies, n);
        assert_eq!(reply["code"], "not_found", "{}: {reply}", attempts[n]);
        reply["error"].as_str().unwrap().replace(path, "PATH")
    };
    let missing_script = shape(6, missing.to_str().unwrap());
    assert_eq!(shape(0, secret.to_str().unwrap()), missing_script);
    assert_eq!(shape(2, hidden.to_str().unwrap()), missing_script);
    assert_eq!(shape(3, link.to_str().unwrap()), missing_script);
    assert_eq!(shape(4, &dotdot), missing_script);
    let missing_program = shape(8, elsewhere.path().join("nothing.sh").to_str().unwrap());
    assert_eq!(shape(7, tool.to_str().unwrap()), missing_program);
    assert_eq!(shape(1, secret.to_str().unwrap()), missing_script);
    assert_eq!(shape(10, unreadable.to_str().unwrap()), missing_script);
    assert_eq!(
        shape(5, tool.to_str().unwrap()),
        shape(13, missing_python.to_str().unwrap())
    );
    assert_eq!(
        shape(11, private.to_str().unwrap()),
        shape(12, missing_dir.to_str().unwrap())
    );
    // What it can see, its child can have.
    assert_eq!(
        reply(&replies, 9)["success"],
        true,
        "{}",
        reply(&replies, 9)
    );
    let id = reply(&replies, 9)["id"].as_u64().unwrap();
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    assert!(agent_log(&daemon, "c-ok", id).contains("child ran"));
}

// ---- 3. `..` in an operator's paths --------------------------------------------

#[test]
fn dot_dot_in_a_path_neither_uncovers_masks_nor_leaves_the_sandbox_root() {
    require_root!("masks seen by an agent's user");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let masked = "/etc/ssh/ssh_config";
    let Some(secret_line) = fs::read_to_string(masked)
        .ok()
        .and_then(|t| t.lines().find(|l| l.trim().len() > 8).map(str::to_owned))
    else {
        eprintln!("!!! NOT TESTED: this host has no {masked} to hide");
        return;
    };
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "dots", "python": "/bin/cat", "script": "/tmp/../etc/passwd",
                "args": [masked]}),
    );
    if reply["success"] == true {
        let id = reply["id"].as_u64().unwrap();
        wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
        let log = agent_log(&daemon, "dots", id);
        assert!(
            !log.contains(&secret_line),
            "/etc/ssh was uncovered by a `..` path:\n{log}"
        );
    }
    let before = tree(daemon.dir.path());
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "dots2", "python": "/bin/cat", "script": "/tmp/../../etc/passwd"}),
    );
    if reply["success"] == true {
        let id = reply["id"].as_u64().unwrap();
        wait_for_state(
            &mut client,
            id,
            &["exited", "failed"],
            Duration::from_secs(10),
        );
    }
    let after = tree(daemon.dir.path());
    let created: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    assert!(
        !created.iter().any(|p| p.ends_with("etc")),
        "a sandbox created {created:?} on the host"
    );
}

// ---- 4. the kernel's own files ----------------------------------------------------

#[test]
fn the_kernels_config_and_socket_stay_hidden_beside_an_agents_script() {
    require_root!("agents as another user");
    // The operator keeps the kernel's files and the agent's script in one
    // directory that everyone may read.
    let dir = shared_dir();
    let daemon = Daemon::start_in(dir, "# api_key = \"sk-canary-0123456789\"\n");
    let script = write_script(
        daemon.dir.path(),
        "nosy.py",
        r#"
import os, socket
here = os.path.dirname(os.path.abspath(__file__))
for name in sorted(os.listdir(here)):
    path = os.path.join(here, name)
    try:
        with open(path, "rb") as f:
            data = f.read()
        print("READ", name, len(data), b"sk-" + b"canary" in data, flush=True)
    except OSError as e:
        print("NOREAD", name, e.errno, flush=True)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(os.path.join(here, "agentos.sock"))
    print("MAIN SOCKET CONNECTED", flush=True)
except OSError as e:
    print("MAIN SOCKET REFUSED", e.errno, flush=True)
"#,
    );
    let mut client = daemon.client();
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "nosy", "script": script}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["id"].as_u64().unwrap();
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    let log = agent_log(&daemon, "nosy", id);
    assert!(log.contains("READ nosy.py"), "{log}");
    assert!(
        !log.contains("True"),
        "the agent read the kernel's config:\n{log}"
    );
    assert!(log.contains("MAIN SOCKET REFUSED"), "{log}");
}

// ---- 5. limits, permissions and tokens -----------------------------------------

#[test]
fn a_child_never_gets_more_than_its_parent() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let sleep = json!(["/bin/sleep", "30"]);
    let (parent, replies) = act(
        &daemon,
        "small",
        json!({"limits": {"memory": 64u64 << 20, "max_pids": 16, "cpu_quota": 20000, "cpu_period": 100000},
               "permissions": {"spawn": true, "think": false, "llm_tokens": 1000}}),
        json!([
            [SPAWN, {"name": "big-memory", "command": sleep, "limits": {"memory": 1u64 << 40}}],
            [SPAWN, {"name": "big-pids", "command": sleep, "limits": {"max_pids": 1_000_000}}],
            [SPAWN, {"name": "big-cpu", "command": sleep, "limits": {"cpu_quota": 200_000, "cpu_period": 100_000}}],
            [SPAWN, {"name": "thinker", "command": sleep, "permissions": {"think": true}}],
            [SPAWN, {"name": "rich", "command": sleep, "permissions": {"llm_tokens": 5000}}],
            [SPAWN, {"name": "unlimited", "command": sleep, "permissions": {"llm_tokens": 0}}],
            [SPAWN, {"name": "inherits", "command": sleep}],
            [SPAWN, {"name": "slow-period", "command": sleep, "limits": {"cpu_period": 50_000}}],
            [SPAWN, {"name": "modest", "command": sleep,
                     "limits": {"memory": 32u64 << 20, "max_pids": 8},
                     "permissions": {"llm_tokens": 400}}],
        ]),
    );
    assert_denied(reply(&replies, 0), "limits.memory");
    assert_denied(reply(&replies, 1), "limits.max_pids");
    assert_denied(reply(&replies, 2), "limits.cpu_quota");
    assert_denied(reply(&replies, 3), "permissions.think");
    assert_denied(reply(&replies, 4), "permissions.llm_tokens");
    // 0 means "share my budget", never "unlimited", under a parent that has one.
    assert_eq!(
        reply(&replies, 5)["success"],
        true,
        "{}",
        reply(&replies, 5)
    );
    for n in 6..9 {
        assert_eq!(
            reply(&replies, n)["success"],
            true,
            "{}",
            reply(&replies, n)
        );
    }
    let parent_limits = agent_info(&mut client, parent)["limits"].clone();
    let inherits = reply(&replies, 6)["id"].as_u64().unwrap();
    assert_eq!(
        agent_info(&mut client, inherits)["limits"],
        parent_limits,
        "a child's limits default to its parent's"
    );
    let slow = reply(&replies, 7)["id"].as_u64().unwrap();
    assert_eq!(
        agent_info(&mut client, slow)["limits"],
        json!({"memory": 64u64 << 20, "max_pids": 16, "cpu_quota": 10000, "cpu_period": 50000}),
        "the parent's CPU share, over the child's period"
    );
    let modest = reply(&replies, 8)["id"].as_u64().unwrap();
    assert_eq!(
        agent_info(&mut client, modest)["limits"],
        json!({"memory": 32u64 << 20, "max_pids": 8, "cpu_quota": 20000, "cpu_period": 100000})
    );
}

/// An agent that THINKs until it is refused, then says how far it got.
const THINK_UNTIL_REFUSED: &str = r#"
n = 0
while True:
    _, r = call(0x01, {"prompt": "hi", "max_tokens": 40})
    r = json.loads(r)
    if not r["success"]:
        print("REFUSED", r["code"], "after", n, flush=True)
        break
    n += 1
"#;

#[test]
fn a_tree_of_agents_shares_one_token_budget() {
    // Every answer costs 60 tokens, whatever was asked.
    let stub = Stub::start(|_, _| Reply::openai("ok", 30, 30));
    let daemon = Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"k\"\nmodel = \"m\"\n",
        stub.url()
    ));
    let dir = shared_dir();
    let thinker = write_script(
        dir.path(),
        "thinker.py",
        &format!("{PY_KERNEL}{THINK_UNTIL_REFUSED}"),
    );
    let mut client = daemon.client();
    const BUDGET: u64 = 600;
    let children: Vec<Value> = (0..3)
        .map(|i| json!([SPAWN, {"name": format!("spender{i}"), "script": thinker}]))
        .collect();
    let (parent, replies) = act_in(
        &daemon,
        dir.path(),
        "budgeted",
        json!({"permissions": {"spawn": true, "llm_tokens": BUDGET}}),
        Value::from(children),
    );
    let mut ids = vec![parent];
    for n in 0..3 {
        assert_eq!(
            reply(&replies, n)["success"],
            true,
            "{}",
            reply(&replies, n)
        );
        ids.push(reply(&replies, n)["id"].as_u64().unwrap());
    }
    let mut spent = 0;
    for (n, id) in ids[1..].iter().enumerate() {
        let info = wait_for_state(&mut client, *id, &["exited"], Duration::from_secs(30));
        let log = agent_log(&daemon, &format!("spender{n}"), *id);
        assert!(log.contains("REFUSED limit_exceeded"), "{log}");
        spent += info["llm"]["tokens"].as_u64().unwrap();
    }
    eprintln!("three children of a {BUDGET}-token agent spent {spent} tokens together");
    // Each answer costs 60, and a THINK is refused once the rest cannot
    // cover its prompt: the tree stays within its one budget.
    assert!(
        spent <= BUDGET,
        "the tree spent {spent} of a {BUDGET}-token budget"
    );
    assert!(
        spent >= BUDGET - 120,
        "the budget was shared, not lost: {spent}"
    );
}
