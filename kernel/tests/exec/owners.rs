//! EXEC shared between owners: an agent's flood leaves the operator room, an
//! owner's runs and sessions add up within its limits, and a run's
//! connections, cgroup and children end with it.

use std::fs;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, act, call_json, request, require_root, until, Daemon};
use serde_json::{json, Value};

use crate::{ends_with_its_run, exec, hostile, printed, KERNEL_CALL};

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
    // Room on the session's disk for what it writes.
    let daemon = Daemon::start_with("[exec]\nsession_disk_bytes = 268435456\n");
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
