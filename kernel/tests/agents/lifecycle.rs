//! SPAWN, KILL and LIST against a real agentosd: the lifecycle, the replies,
//! bad input, identity and permissions.

use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{
    self as support, agent_info, agent_log, request, shared_dir, wait_for_state, write_script,
    Daemon, PY_KERNEL,
};
use serde_json::json;

fn spawn(client: &mut agentos_proto::Client, body: serde_json::Value) -> serde_json::Value {
    request(client, Opcode::SPAWN, &body)
}

#[test]
fn spawn_replies_once_running_and_list_follows_the_agent_to_its_end() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let reply = spawn(
        &mut client,
        json!({"name": "w1", "command": ["/bin/sh", "-c", "echo started; sleep 0.5; echo done"]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["name"], "w1");
    assert_eq!(reply["status"], "running");
    assert!(reply["pid"].as_u64().unwrap() > 1);
    let id = reply["id"].as_u64().unwrap();
    assert!(
        (1..1_000_000).contains(&id),
        "agent ids are below operator ids"
    );

    let info = agent_info(&mut client, id);
    assert_eq!(info["state"], "running");
    assert_eq!(info["status"], "running");
    assert_eq!(info["running"], true);
    assert_eq!(info["restarts"], 0);
    assert!(info["started_at"].as_str().unwrap().ends_with('Z'));
    for field in ["limits", "memory", "cpu", "llm", "isolation", "pids"] {
        assert!(info[field].is_object(), "LIST lacks {field}: {info}");
    }

    let info = wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    assert_eq!(info["exit_code"], 0);
    assert!(info["signal"].is_null());
    assert_eq!(info["running"], false);
    assert!(info["pid"].is_null());
    let log = agent_log(&daemon, "w1", id);
    assert!(log.contains("started\n") && log.contains("done\n"), "{log}");
}

#[test]
fn exit_codes_and_signals_are_recorded() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let failing = spawn(
        &mut client,
        json!({"name": "fails", "command": ["/bin/sh", "-c", "exit 7"]}),
    );
    let signalled = spawn(
        &mut client,
        json!({"name": "aborts", "command": ["/bin/sh", "-c", "kill -ABRT $$"]}),
    );
    let info = wait_for_state(
        &mut client,
        failing["id"].as_u64().unwrap(),
        &["exited"],
        Duration::from_secs(10),
    );
    assert_eq!(info["exit_code"], 7);
    let info = wait_for_state(
        &mut client,
        signalled["id"].as_u64().unwrap(),
        &["exited"],
        Duration::from_secs(10),
    );
    assert_eq!(info["signal"], libc::SIGABRT);
    assert!(info["exit_code"].is_null());
}

#[test]
fn start_failures_are_the_spawn_reply() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let cases = [
        (
            json!({"name": "a", "script": "/no/such/script.py"}),
            "not_found",
            "/no/such/script.py",
        ),
        (
            json!({"name": "b", "command": ["/no/such/program"]}),
            "not_found",
            "/no/such/program",
        ),
        (
            json!({"name": "c", "command": ["no-such-program-anywhere"]}),
            "not_found",
            "no-such-program-anywhere",
        ),
        (
            json!({"name": "d", "command": ["/bin/true"], "cwd": "/no/such/dir"}),
            "not_found",
            "/no/such/dir",
        ),
        (
            json!({"name": "e", "script": "relative.py"}),
            "bad_request",
            "absolute",
        ),
        (
            json!({"name": "f", "command": ["/bin/true"], "env": {"AGENTOS_SOCKET": "/x"}}),
            "bad_request",
            "AGENTOS_SOCKET",
        ),
    ];
    for (body, code, mentions) in cases {
        let reply = spawn(&mut client, body.clone());
        assert_eq!(reply["success"], false, "{body} -> {reply}");
        assert_eq!(reply["code"], code, "{body} -> {reply}");
        let error = reply["error"].as_str().unwrap();
        assert!(
            error.contains(mentions),
            "{body}: {error:?} should mention {mentions}"
        );
    }
    // A failed start leaves nothing behind: no live agent, no cgroup.
    let list = request(&mut client, Opcode::LIST, &json!({}));
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|a| a["state"] == "failed"),
        "{list}"
    );
    if support::is_root() {
        let instance = format!("/sys/fs/cgroup/memory/agentos/agentosd-{}", daemon.pid());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let agents: Vec<_> = std::fs::read_dir(&instance)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().is_dir() && support::is_agent_cgroup(e))
                        .collect()
                })
                .unwrap_or_default();
            if agents.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "cgroups left: {agents:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn bad_spawn_requests_name_the_field_or_the_range() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let too_long = "x".repeat(65);
    let cases = [
        (
            json!({"name": "a/b", "command": ["/bin/true"]}),
            "bad_request",
            "name",
        ),
        (
            json!({"name": "..", "command": ["/bin/true"]}),
            "bad_request",
            "name",
        ),
        (
            json!({"name": "a\u{0}b", "command": ["/bin/true"]}),
            "bad_request",
            "name",
        ),
        (
            json!({"name": too_long, "command": ["/bin/true"]}),
            "bad_request",
            "64",
        ),
        (
            json!({"name": 5, "command": ["/bin/true"]}),
            "bad_request",
            "`name`",
        ),
        (
            json!({"name": "a", "command": "/bin/true"}),
            "bad_request",
            "`command`",
        ),
        (
            json!({"name": "a", "command": ["/bin/true"], "limits": {"memory": -1}}),
            "bad_request",
            "limits.memory",
        ),
        (
            json!({"name": "a", "command": ["/bin/true"], "limits": {"max_pids": 0}}),
            "limit_exceeded",
            "1..=4194304",
        ),
        (
            json!({"name": "a", "command": ["/bin/true"], "limits": {"memory": 1u64 << 50}}),
            "limit_exceeded",
            "limits.memory",
        ),
        (
            json!({"name": "a", "command": ["/bin/true"], "limits": {"cpu_period": 10}}),
            "limit_exceeded",
            "cpu_period",
        ),
        (
            json!({"name": "a", "command": ["/bin/true"], "restart_policy": "sometimes"}),
            "bad_request",
            "restart_policy",
        ),
        (json!({"name": "a"}), "bad_request", "script"),
    ];
    for (body, code, mentions) in cases {
        let reply = spawn(&mut client, body.clone());
        assert_eq!(reply["code"], code, "{body} -> {reply}");
        let error = reply["error"].as_str().unwrap();
        assert!(
            error.contains(mentions),
            "{body}: {error:?} should mention {mentions}"
        );
    }
    // Unknown fields are refused, naming them, at any depth: a misspelt
    // field must not pass as a default.
    for (body, field) in [
        (
            json!({"name": "ok", "command": ["/bin/true"], "colour": "teal"}),
            "`colour`",
        ),
        (
            json!({"name": "ok", "command": ["/bin/true"], "restart_polcy": "always"}),
            "`restart_polcy`",
        ),
        (
            json!({"name": "ok", "command": ["/bin/true"], "permissions": {"thnk": false}}),
            "`thnk`",
        ),
        (
            json!({"name": "ok", "command": ["/bin/true"], "limits": {"memroy": 1}}),
            "`memroy`",
        ),
    ] {
        let reply = spawn(&mut client, body.clone());
        assert_eq!(reply["code"], "bad_request", "{body} -> {reply}");
        assert!(
            reply["error"].as_str().unwrap().contains(field),
            "{body} -> {reply}"
        );
    }
}

#[test]
fn names_are_unique_among_live_agents_only() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let first = spawn(
        &mut client,
        json!({"name": "dup", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(first["success"], true);
    let second = spawn(
        &mut client,
        json!({"name": "dup", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(second["code"], "already_exists", "{second}");
    let killed = request(
        &mut client,
        Opcode::KILL,
        &json!({"name": "dup", "grace_ms": 0}),
    );
    assert_eq!(
        killed,
        json!({"success": true, "killed": true, "id": first["id"]})
    );
    wait_for_state(
        &mut client,
        first["id"].as_u64().unwrap(),
        &["killed"],
        Duration::from_secs(10),
    );
    let again = spawn(
        &mut client,
        json!({"name": "dup", "command": ["/bin/true"]}),
    );
    assert_eq!(again["success"], true, "{again}");
    assert_ne!(again["id"], first["id"]);
}

#[test]
fn kill_sends_term_to_the_tree_then_kill_after_the_grace() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    // Polite: exits on SIGTERM, saying so.
    let polite = spawn(
        &mut client,
        json!({"name": "polite", "command": ["/bin/sh", "-c", "trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.05; done"]}),
    );
    // Stubborn: ignores SIGTERM, and so does its child.
    let stubborn = spawn(
        &mut client,
        json!({"name": "stubborn", "command": ["/bin/sh", "-c", "trap '' TERM; sh -c \"trap '' TERM; sleep 100\" & while :; do sleep 0.05; done"]}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let polite_id = polite["id"].as_u64().unwrap();
    let stubborn_id = stubborn["id"].as_u64().unwrap();
    request(&mut client, Opcode::KILL, &json!({"id": polite_id}));
    let started = Instant::now();
    request(
        &mut client,
        Opcode::KILL,
        &json!({"id": stubborn_id, "grace_ms": 500}),
    );
    let info = wait_for_state(&mut client, polite_id, &["killed"], Duration::from_secs(5));
    assert_eq!(info["exit_code"], 0, "{info}");
    assert!(agent_log(&daemon, "polite", polite_id).contains("got TERM"));
    let info = wait_for_state(
        &mut client,
        stubborn_id,
        &["killed"],
        Duration::from_secs(10),
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "killed before the grace ended"
    );
    assert_eq!(info["signal"], libc::SIGKILL, "{info}");
}

#[test]
fn kill_of_no_live_agent_is_not_found_with_killed_false() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for body in [json!({"id": 4242}), json!({"name": "ghost"})] {
        let reply = request(&mut client, Opcode::KILL, &body);
        assert_eq!(reply["success"], false);
        assert_eq!(reply["killed"], false);
        assert_eq!(reply["code"], "not_found");
    }
    let reply = request(&mut client, Opcode::KILL, &json!({}));
    assert_eq!(reply["code"], "bad_request");
}

#[test]
fn a_spawn_killed_before_its_sandbox_is_ready_still_gets_its_reply() {
    // No warm sandboxes: the SPAWN waits for one, and the KILL pipelined
    // behind it arrives meanwhile.
    let daemon = Daemon::start_with("[agents]\nwarm_pool = 0\n");
    let mut client = daemon.client();
    client.set_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = json!({"name": "doomed", "command": ["/bin/sleep", "60"]});
    client
        .send(Opcode::SPAWN, &serde_json::to_vec(&body).unwrap())
        .unwrap();
    let kill = json!({"name": "doomed", "grace_ms": 0});
    client
        .send(Opcode::KILL, &serde_json::to_vec(&kill).unwrap())
        .unwrap();
    let spawned: serde_json::Value =
        serde_json::from_slice(&client.recv().unwrap().payload).unwrap();
    let killed: serde_json::Value =
        serde_json::from_slice(&client.recv().unwrap().payload).unwrap();
    assert_eq!(killed["killed"], true, "{killed}");
    assert_eq!(spawned["success"], false, "{spawned}");
    assert_eq!(spawned["code"], "not_found", "{spawned}");
    assert!(
        spawned["error"]
            .as_str()
            .unwrap()
            .contains("killed before it started"),
        "{spawned}"
    );
    let list = request(&mut client, Opcode::LIST, &json!({}));
    let doomed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "doomed")
        .cloned()
        .unwrap();
    assert_eq!(doomed["state"], "killed", "{doomed}");
    // The sandbox launched for it goes to whoever asks next.
    let reply = spawn(
        &mut client,
        json!({"name": "next", "command": ["/bin/true"]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
}

#[test]
fn restarts_follow_the_policy_and_keep_the_id() {
    let daemon = Daemon::start();
    let dir = shared_dir();
    // Each run asks the kernel who it is (claiming to be 999 in the header),
    // prints the answer, then fails.
    let script = write_script(
        dir.path(),
        "whoami.py",
        &format!(
            "{PY_KERNEL}\nagent, reply = call(0xFE, b'', claim=999)\nprint(f'agent_id={{agent}} \
             hello={{json.loads(reply)[\"agent_id\"]}}', flush=True)\nsys.exit(1)\n"
        ),
    );
    let mut client = daemon.client();
    let reply = spawn(
        &mut client,
        json!({"name": "flaky", "script": script, "restart_policy": "on-failure", "max_restarts": 2, "restart_window": 60}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["id"].as_u64().unwrap();
    let info = wait_for_state(&mut client, id, &["failed"], Duration::from_secs(20));
    assert_eq!(info["restarts"], 2, "{info}");
    assert_eq!(info["exit_code"], 1);
    let log = agent_log(&daemon, "flaky", id);
    let runs: Vec<&str> = log.lines().filter(|l| l.starts_with("agent_id=")).collect();
    assert_eq!(runs.len(), 3, "{log}");
    for run in runs {
        assert_eq!(run, format!("agent_id={id} hello={id}"), "{log}");
    }
}

#[test]
fn always_restarts_even_clean_exits_until_killed() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let reply = spawn(
        &mut client,
        json!({"name": "again", "command": ["/bin/true"], "restart_policy": "always"}),
    );
    let id = reply["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent_info(&mut client, id)["restarts"].as_u64().unwrap() < 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = request(&mut client, Opcode::KILL, &json!({"id": id}));
    assert_eq!(killed["killed"], true, "{killed}");
    let info = wait_for_state(&mut client, id, &["killed"], Duration::from_secs(10));
    assert!(info["restarts"].as_u64().unwrap() >= 1);
}

#[test]
fn agents_spawn_and_kill_only_within_their_permissions() {
    let daemon = Daemon::start();
    let dir = shared_dir();
    // argv: <what> [<arg>] — does one request and prints the reply.
    let script = write_script(
        dir.path(),
        "actor.py",
        &format!(
            "{PY_KERNEL}\nwhat = sys.argv[1]\n\
             if what == 'spawn':\n    _, r = call(0x10, {{'name': sys.argv[2], 'command': ['/bin/sleep', '30']}})\n\
             elif what == 'kill':\n    _, r = call(0x11, {{'name': sys.argv[2], 'grace_ms': 0}})\n\
             elif what == 'spawn-unsandboxed':\n    _, r = call(0x10, {{'name': sys.argv[2], 'command': ['/bin/true'], 'sandboxed': False}})\n\
             print('REPLY ' + r.decode(), flush=True)\nimport time; time.sleep(30)\n"
        ),
    );
    let mut client = daemon.client();
    let run = |client: &mut agentos_proto::Client, name: &str, args: &[&str], may_spawn: bool| {
        let reply = spawn(
            client,
            json!({"name": name, "script": script, "args": args, "permissions": {"spawn": may_spawn}}),
        );
        assert_eq!(reply["success"], true, "{reply}");
        let id = reply["id"].as_u64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = agent_log(&daemon, name, id);
            if let Some(line) = log.lines().find(|l| l.starts_with("REPLY ")) {
                return serde_json::from_str::<serde_json::Value>(&line[6..]).unwrap();
            }
            assert!(Instant::now() < deadline, "no reply from {name}: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let refused = run(&mut client, "no-spawn", &["spawn", "child-a"], false);
    assert_eq!(refused["code"], "permission_denied", "{refused}");

    let allowed = run(&mut client, "spawner", &["spawn", "child-b"], true);
    assert_eq!(allowed["success"], true, "{allowed}");
    // The spawner's child is its own to kill; an unrelated agent is not.
    let victim = spawn(
        &mut client,
        json!({"name": "bystander", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(victim["success"], true);
    let denied = run(&mut client, "killer", &["kill", "bystander"], true);
    assert_eq!(denied["code"], "permission_denied", "{denied}");
    let unsandboxed = run(&mut client, "escaper", &["spawn-unsandboxed", "free"], true);
    assert_eq!(unsandboxed["code"], "permission_denied", "{unsandboxed}");
    let parent_kill = run(&mut client, "parent", &["spawn", "child-c"], true);
    assert_eq!(parent_kill["success"], true);
    let list = request(&mut client, Opcode::LIST, &json!({}));
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"child-b") && names.contains(&"child-c"),
        "{names:?}"
    );
}

#[test]
fn sigterm_stops_every_agent_and_removes_their_sockets() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            let reply = spawn(
                &mut client,
                json!({"name": format!("s{i}"), "command": ["/bin/sleep", "60"]}),
            );
            reply["id"].as_u64().unwrap()
        })
        .collect();
    let pids: Vec<u64> = ids
        .iter()
        .map(|id| agent_info(&mut client, *id)["pid"].as_u64().unwrap())
        .collect();
    drop(client);
    let mut daemon = daemon;
    let agents_dir = daemon.dir.path().join("agentos.sock.d").join("agents");
    assert_eq!(std::fs::read_dir(&agents_dir).unwrap().count(), 3);
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(15)).success());
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "agent pid {pid} survived"
        );
    }
    assert!(!agents_dir.exists(), "agent sockets left behind");
}

/// Served on the system socket, `/run/agentos/agentos.sock` — the very path
/// an agent's own socket has inside its sandbox — the kernel hides its own
/// socket from agents without hiding theirs.
#[test]
fn agents_of_the_system_socket_reach_their_own() {
    let system = std::path::Path::new("/run/agentos/agentos.sock");
    if !support::is_root() {
        eprintln!("!!! NOT TESTED: serving the system socket needs root");
        return;
    }
    if system.exists() || std::path::Path::new("/run/agentos/agentos.sock.lock").exists() {
        eprintln!(
            "!!! NOT TESTED: an agentosd already serves {}",
            system.display()
        );
        return;
    }
    let created_dir = !system.parent().unwrap().exists();
    let daemon = Daemon::spawn_at(tempfile::tempdir().unwrap(), system.into(), "");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(system).is_err() {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let dir = shared_dir();
    let script = write_script(
        dir.path(),
        "hello.py",
        &format!(
            "{PY_KERNEL}\n_, r = call(0, b'still me')\nprint('ECHO', r.decode(), flush=True)\n"
        ),
    );
    let mut client = daemon.client();
    let reply = spawn(&mut client, json!({"name": "system", "script": script}));
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["id"].as_u64().unwrap();
    let info = wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    let log = agent_log(&daemon, "system", id);
    assert_eq!(info["exit_code"], 0, "{log}");
    assert!(log.contains("ECHO still me"), "{log}");
    drop(client);
    assert!(daemon.stop().success());
    if created_dir {
        let _ = std::fs::remove_dir(system.parent().unwrap());
    }
}
