//! What a hostile agent tries to pass for someone else: operator identity,
//! the operators' connections, the main socket from inside its namespace, a
//! LIST of everyone; what is left of agents when their kernel stops or is
//! killed; and the local model server's own confinement.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{
    self as support, act, agent_log, listed_names, request, require_root, shared_dir, write_script,
    Daemon, UnprivilegedDaemon,
};
use serde_json::json;

use crate::{reply, tree, SPAWN};

const LIST: u8 = 0x12;

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

// ---- 7. unsandboxed agents on the kernel's socket ----------------------------

/// An unsandboxed agent that calls on the kernel's main socket (`argv[1]`),
/// as the Clove SDK's workers do, then has a child process of its own do
/// the same; prints what HELLO said to each.
const MAIN_SOCKET_CALLER: &str = r#"
import os, subprocess, sys
os.environ["AGENTOS_SOCKET"] = sys.argv[1]
"#;

const MAIN_SOCKET_HELLO: &str = r#"
agent_id, body = call(0xFE, b"{}")
print("HELLO", agent_id, json.dumps(json.loads(body)["principal"]), flush=True)
if len(sys.argv) > 2:
    subprocess.run([sys.executable, sys.argv[0], sys.argv[1]], check=True)
    print("DONE", flush=True)
    import time
    time.sleep(30)
"#;

#[test]
fn an_unsandboxed_agent_calling_on_the_kernels_socket_is_that_agent_with_its_children() {
    require_root!("agents' cgroups, by which the kernel knows an unsandboxed agent");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = shared_dir();
    let script = write_script(
        dir.path(),
        "caller.py",
        &format!(
            "{MAIN_SOCKET_CALLER}{}{MAIN_SOCKET_HELLO}",
            support::PY_KERNEL
        ),
    );
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "outside", "script": script, "sandboxed": false,
                "args": [daemon.socket, "with-child"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    let log = support::agent_log_with_line(&daemon, "outside", id, "DONE");
    let hellos: Vec<&str> = log.lines().filter(|l| l.starts_with("HELLO")).collect();
    assert_eq!(hellos.len(), 2, "{log}");
    for hello in hellos {
        assert!(
            hello.starts_with(&format!("HELLO {id} ")),
            "the agent and its child are agent {id}: {hello}"
        );
        assert!(hello.contains("\"agent\""), "{hello}");
    }
    // The operator's own connections stay the operator's.
    let own = request(&mut client, Opcode::HELLO, &json!({}));
    assert!(own["agent_id"].as_u64().unwrap() >= 1_000_000, "{own}");
    // With a cgroup of its own, it can be paused like any agent.
    let paused = request(&mut client, Opcode::PAUSE, &json!({"id": id}));
    assert_eq!(paused["state"], "paused", "{paused}");
    let killed = request(&mut client, Opcode::KILL, &json!({"id": id}));
    assert_eq!(killed["killed"], true, "{killed}");
}
