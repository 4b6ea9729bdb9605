//! What a hostile agent tries, and must not get: more than its parent gave
//! it (network, limits, permissions, tokens), host paths outside its own
//! view, the kernel's config or main socket, operator identity, the
//! operators' connections, a LIST of everyone. Each test is what an agent
//! written to escalate would do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support as support;
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::require_root;
use agentos_test_support::{
    act, act_in, agent_info, agent_log, listed_names, request, shared_dir, wait_for_state,
    write_script, Daemon, UnprivilegedDaemon, PY_KERNEL,
};
use serde_json::{json, Value};

const SPAWN: u8 = 0x10;
const LIST: u8 = 0x12;

/// The `reply` of the `n`th request an actor made.
fn reply(replies: &[Value], n: usize) -> &Value {
    &replies[n]["reply"]
}

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

/// Every directory under `root`.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = fs::read_dir(&dirs[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        i += 1;
    }
    dirs
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

// ---- 6. connections ------------------------------------------------------------

/// An agent that opens connections on its own socket and keeps those that
/// are served; prints `HELD n REFUSED m`.
const HOARDER: &str = r#"
import json, os, socket, struct, sys, time
held, refused = [], 0
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(os.environ["AGENTOS_SOCKET"])
        s.sendall(struct.pack("<IIBQ", 0x41474E54, 0, 0, 1) + b"x")
        header = b""
        while len(header) < 17:
            chunk = s.recv(17 - len(header))
            if not chunk:
                break
            header += chunk
        if len(header) == 17 and header[8] == 0:
            s.recv(1)
            held.append(s)
        else:
            refused += 1
            s.close()
    except OSError:
        refused += 1
        s.close()
print("HELD", len(held), "REFUSED", refused, flush=True)
time.sleep(60)
"#;

fn hoard(daemon: &Daemon, client: &mut agentos_proto::Client, script: &Path, name: &str) -> u64 {
    let reply = request(
        client,
        Opcode::SPAWN,
        &json!({"name": name, "script": script, "args": ["300"]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = agent_log(daemon, name, id);
        if let Some(line) = log.lines().find(|l| l.starts_with("HELD ")) {
            return line.split_whitespace().nth(1).unwrap().parse().unwrap();
        }
        assert!(Instant::now() < deadline, "{name} did not report:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agents_cannot_take_the_operators_connections() {
    support::raise_fd_limit();
    let daemon = Daemon::start_with("max_connections = 160\n");
    let dir = shared_dir();
    let hoarder = write_script(dir.path(), "hoarder.py", HOARDER);
    let mut client = daemon.client();
    let first = hoard(&daemon, &mut client, &hoarder, "hoarder1");
    let second = hoard(&daemon, &mut client, &hoarder, "hoarder2");
    let mut served = 0;
    let mut operators = Vec::new();
    for _ in 0..10 {
        let mut operator = daemon.raw();
        support::send(&mut operator, Opcode::NOOP, b"me too");
        let (header, payload) = support::recv(&mut operator);
        if header.opcode == Opcode::NOOP && payload == b"me too" {
            served += 1;
        }
        operators.push(operator);
    }
    eprintln!(
        "max_connections 160: agent 1 held {first}, agent 2 held {second}, operators served \
         {served} of 10"
    );
    assert_eq!(first, 64, "one agent holds at most agents.max_connections");
    assert_eq!(
        second, 32,
        "agents together leave reserved_operator_connections (64) to operators"
    );
    assert_eq!(served, 10, "operators are served whatever agents hold");
}

// ---- 7. identity ------------------------------------------------------------------

/// Connects to the main socket at `argv[1]`, says HELLO and tries a SPAWN
/// outside any sandbox; prints what happened.
const IMPOSTOR: &str = concat!(
    agentos_test_support::py_frames!(),
    r#"
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("CONNECT FAILED", e.errno, flush=True)
    sys.exit(0)
def call(op, payload):
    send(s, op, payload)
    agent_id, opcode, body = recv(s)
    return agent_id, opcode, body.decode()
try:
    print("HELLO", *call(0xFE, b"{}"), flush=True)
    spawn = {"name": "escaped", "command": ["/bin/sleep", "30"], "sandboxed": False}
    print("SPAWN", *call(0x10, json.dumps(spawn).encode()), flush=True)
except (EOFError, OSError) as e:
    try:
        left = s.recv(65536)
    except OSError:
        left = b""
    print("CLOSED", e, left[17:].decode(errors="replace"), flush=True)
"#
);

#[test]
fn an_agent_of_an_unprivileged_kernel_is_never_taken_for_an_operator() {
    require_root!("running the kernel as another user");
    // The kernel's socket lies in the directory of the agent's script.
    let daemon = UnprivilegedDaemon::start();
    let impostor = write_script(daemon.dir.path(), "impostor.py", IMPOSTOR);
    let mut client = daemon.client();
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "impostor", "script": impostor, "args": [daemon.socket]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    if reply["isolation"]["namespaces"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        eprintln!(
            "!!! NOT TESTED: this host gives an unprivileged kernel no namespaces, so its agents \
             are the daemon's own processes ({})",
            reply["isolation"]["degraded_reason"]
        );
        return;
    }
    let id = reply["id"].as_u64().unwrap();
    let log = daemon.agent_log_with("impostor", id, &["CONNECT FAILED", "SPAWN", "CLOSED"]);
    eprintln!("impostor: {log}");
    assert!(
        !log.contains("\"success\":true"),
        "an agent was served as an operator:\n{log}"
    );
    assert!(!listed_names(&mut client).contains(&"escaped".to_owned()));
    drop(client);
    assert!(daemon.process.stop().success());
}

#[test]
fn a_process_inside_an_agents_pid_namespace_is_refused_on_the_main_socket() {
    require_root!("entering an agent's namespace");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let impostor = write_script(dir.path(), "impostor.py", IMPOSTOR);
    let mut client = daemon.client();
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "host", "command": ["/bin/sleep", "30"]}),
    );
    let pid = reply["pid"].as_u64().unwrap();
    // A root process on the host's filesystem, but in the agent's PID
    // namespace: what an agent would be if it reached the main socket.
    let out = Command::new("nsenter")
        .args(["--target", &pid.to_string(), "--pid", "--"])
        .args(["/bin/sh", "-c", "\"$0\" \"$@\"; true"])
        .arg("/usr/bin/python3")
        .arg(&impostor)
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("from inside the agent's namespace: {said}");
    assert!(
        said.contains("HELLO") || said.contains("CLOSED"),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("\"success\":true"),
        "a process in an agent's namespace was served as an operator: {said}"
    );
    assert!(said.contains("permission_denied"), "{said}");
}

// ---- 8. stale sockets -------------------------------------------------------------

#[test]
fn agent_sockets_left_by_a_killed_kernel_are_gone_after_a_restart() {
    let mut daemon = Daemon::start();
    let mut client = daemon.client();
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "orphan", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    drop(client);
    let sockets_before: Vec<PathBuf> = sockets_under(daemon.dir.path(), &daemon.socket);
    assert!(!sockets_before.is_empty(), "no agent socket found");
    daemon.signal(libc::SIGKILL);
    daemon.restart("");
    let left = sockets_under(daemon.dir.path(), &daemon.socket);
    assert!(left.is_empty(), "stale agent sockets: {left:?}");
}

/// Socket files under `dir`, but the kernel's own.
fn sockets_under(dir: &Path, kernel: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    tree(dir)
        .iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()) && e.path() != kernel)
        .map(|e| e.path())
        .collect()
}

// ---- 9. SIGTERM while a SPAWN completes ---------------------------------------------

#[test]
fn an_agent_started_as_the_kernel_stops_still_gets_a_graceful_stop() {
    const GRACE: Duration = Duration::from_secs(10);
    // The race this test is about needs the SPAWNs and the signal read in
    // the same turn; on a loaded machine the signal can come first, so it
    // is tried again until the agents did start during the shutdown.
    for attempt in 1..=5 {
        let mut daemon = Daemon::start_with(
            "shutdown_grace_ms = 10000\n[agents]\nstop_grace_ms = 10000\nwarm_pool = 4\n",
        );
        std::thread::sleep(Duration::from_millis(500));
        let mut raw = daemon.raw();
        for i in 0..4 {
            let body = json!({"name": format!("late{i}"), "command": ["/bin/sleep", "60"]});
            support::send(&mut raw, Opcode::SPAWN, body.to_string().as_bytes());
        }
        std::thread::sleep(Duration::from_millis(2));
        let stopping = Instant::now();
        daemon.signal(libc::SIGTERM);
        let status = daemon.wait(GRACE * 2);
        let took = stopping.elapsed();
        eprintln!("attempt {attempt}: the kernel stopped in {took:?} (agents' grace {GRACE:?})");
        assert!(status.success());
        let started = (0..4)
            .map_while(|_| support::try_recv_json(&mut raw))
            .filter(|reply| reply["success"] == true)
            .count();
        eprintln!("{started} of 4 agents started during the shutdown");
        if started == 0 {
            continue;
        }
        assert!(
            took < GRACE / 2,
            "agents that started during shutdown waited out the grace: {took:?}\n{}",
            daemon.log()
        );
        return;
    }
    panic!("in 5 attempts no agent started during the shutdown: the race was not run");
}

// ---- 11. what an agent's LIST shows ------------------------------------------------

#[test]
fn an_agent_lists_itself_and_its_descendants_with_the_pids_it_can_see() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let stranger = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "stranger", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(stranger["success"], true);
    let (parent, replies) = act(
        &daemon,
        "curious",
        json!({"permissions": {"spawn": true}}),
        json!([
            [SPAWN, {"name": "kid", "command": ["/bin/sleep", "30"]}],
            [LIST, {}],
        ]),
    );
    let spawned = reply(&replies, 0);
    assert_eq!(spawned["success"], true, "{spawned}");
    assert!(
        spawned["pid"].is_null(),
        "a child's host pid is not the parent's to know: {spawned}"
    );
    let listed = reply(&replies, 1).as_array().unwrap().clone();
    let names: Vec<&str> = listed.iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["curious", "kid"], "{listed:?}");
    let own = &listed[0];
    assert_eq!(own["id"], parent);
    assert_eq!(own["pid"], 1, "its own top process, as it sees it: {own}");
    assert!(listed[1]["pid"].is_null(), "{}", listed[1]);
    // Operators still see everyone, with host pids.
    let all = request(&mut client, Opcode::LIST, &json!({}));
    assert_eq!(all.as_array().unwrap().len(), 3, "{all}");
}

// ---- 12. the kernel's own children ---------------------------------------------

/// A field of /proc/<pid>/status, as text.
fn status_field(pid: i32, field: &str) -> String {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
        .unwrap_or_default()
}

/// The daemon's children whose command line mentions `needle`.
fn children_running(daemon_pid: i32, needle: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(daemon_pid) && String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

#[test]
fn the_local_model_server_runs_unprivileged_in_a_read_only_view() {
    require_root!("dropping the model server's privileges");
    let daemon = Daemon::start_with("[llm]\nprovider = \"local\"\nconcurrency = 1\n");
    let mut client = daemon.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let hello = request(&mut client, Opcode::HELLO, &json!({}));
        let llm = &hello["llm"];
        if llm["ready"] == true {
            break;
        }
        let reason = llm["reason"].as_str().unwrap_or_default();
        if reason.contains("not installed") {
            eprintln!("!!! NOT TESTED: {reason}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the local model never came up: {hello}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let servers = children_running(daemon.pid(), "python");
    assert_eq!(servers.len(), 1, "model server processes: {servers:?}");
    let server = servers[0];
    let uid = status_field(server, "Uid:");
    assert!(
        uid.split_whitespace().all(|u| u == "65534"),
        "the model server runs as uid {uid}"
    );
    assert_eq!(status_field(server, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(server, "CapBnd:"), "0000000000000000");
    assert_eq!(status_field(server, "NoNewPrivs:"), "1");
    assert_eq!(status_field(server, "Seccomp:"), "2");
    let environ = fs::read(format!("/proc/{server}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains("KEY"),
        "the server's key is in its environment"
    );
    // Its own mount namespace: a read-only root without /root or /home.
    let own_ns = fs::read_link("/proc/self/ns/mnt").unwrap();
    assert_ne!(
        fs::read_link(format!("/proc/{server}/ns/mnt")).unwrap(),
        own_ns
    );
    let root = PathBuf::from(format!("/proc/{server}/root"));
    assert!(!root.join("root/.ssh").exists() && !root.join("home").exists());
    assert_eq!(fs::metadata(root.join("etc/shadow")).unwrap().len(), 0);
    let reply = request(
        &mut client,
        Opcode::THINK,
        &json!({"prompt": "Say hi.", "max_tokens": 8}),
    );
    assert_eq!(reply["success"], true, "{reply}");
}
