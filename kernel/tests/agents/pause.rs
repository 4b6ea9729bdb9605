//! PAUSE and RESUME: an agent frozen where it stands — its counter still,
//! its CPU time still, LIST saying `paused` — then going on; a paused
//! agent KILLed like any other; and what a hostile agent tries against
//! agents that are not its own.

use std::path::Path;
use std::time::Duration;

use agentos_proto::{Client, Opcode};
use agentos_test_support::{
    act, agent_info, agent_log, request, require_root, shared_dir, wait_for_state, write_script,
    Daemon,
};
use serde_json::{json, Value};

use super::reply;

const PAUSE: u8 = 0x14;
const RESUME: u8 = 0x15;

/// An agent that prints a growing count every 20 ms.
const COUNTER: &str =
    "import time\nn = 0\nwhile True:\n    n += 1\n    print(n, flush=True)\n    time.sleep(0.02)\n";

/// Whether this host has a cgroup freezer (v1's controller, or v2).
fn has_freezer() -> bool {
    Path::new("/sys/fs/cgroup/freezer").is_dir()
        || Path::new("/sys/fs/cgroup/cgroup.controllers").is_file()
}

macro_rules! require_freezer {
    () => {
        require_root!("pausing agents with the cgroup freezer");
        if !has_freezer() {
            eprintln!("!!! NOT TESTED: this host has no cgroup freezer");
            return;
        }
    };
}

fn counted(daemon: &Daemon, name: &str, id: u64) -> usize {
    agent_log(daemon, name, id).lines().count()
}

fn cpu_usec(client: &mut Client, id: u64) -> u64 {
    agent_info(client, id)["cpu"]["usage_usec"]
        .as_u64()
        .unwrap()
}

fn start_counter(daemon: &Daemon, client: &mut Client, name: &str) -> u64 {
    let dir = shared_dir();
    let script = write_script(dir.path(), "counter.py", COUNTER);
    let spawned = request(
        client,
        Opcode::SPAWN,
        &json!({"name": name, "script": script}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let id = spawned["id"].as_u64().unwrap();
    // Counting before it is paused.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while counted(daemon, name, id) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the counter never counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    id
}

#[test]
fn a_paused_agent_stands_still_and_goes_on_after_resume() {
    require_freezer!();
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = start_counter(&daemon, &mut client, "counter");
    let paused = request(&mut client, Opcode::PAUSE, &json!({"id": id}));
    assert_eq!(paused["success"], true, "{paused}");
    assert_eq!(paused["state"], "paused", "{paused}");
    assert_eq!(paused["name"], "counter", "{paused}");
    let info = agent_info(&mut client, id);
    assert_eq!(info["state"], "paused", "{info}");
    assert_eq!(info["running"], false, "{info}");
    let (lines, cpu) = (counted(&daemon, "counter", id), cpu_usec(&mut client, id));
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        counted(&daemon, "counter", id),
        lines,
        "it counted while paused"
    );
    assert_eq!(cpu_usec(&mut client, id), cpu, "it used CPU while paused");
    // Pausing twice is no error.
    let again = request(&mut client, Opcode::PAUSE, &json!({"name": "counter"}));
    assert_eq!(again["state"], "paused", "{again}");

    let resumed = request(&mut client, Opcode::RESUME, &json!({"name": "counter"}));
    assert_eq!(resumed["success"], true, "{resumed}");
    assert_eq!(resumed["state"], "running", "{resumed}");
    std::thread::sleep(Duration::from_millis(400));
    assert!(counted(&daemon, "counter", id) > lines, "it did not go on");
    assert_eq!(agent_info(&mut client, id)["state"], "running");
}

#[test]
fn a_paused_agent_is_killed_like_any_other() {
    require_freezer!();
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = start_counter(&daemon, &mut client, "frozen");
    let paused = request(&mut client, Opcode::PAUSE, &json!({"id": id}));
    assert_eq!(paused["state"], "paused", "{paused}");
    let killed = request(&mut client, Opcode::KILL, &json!({"id": id}));
    assert_eq!(killed["killed"], true, "{killed}");
    let ended = wait_for_state(&mut client, id, &["killed"], Duration::from_secs(10));
    assert_eq!(ended["state"], "killed", "{ended}");
}

#[test]
fn a_hostile_agent_pauses_only_its_own_and_names_nothing_else() {
    require_freezer!();
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let stranger = start_counter(&daemon, &mut client, "stranger");
    let (_, replies) = act(
        &daemon,
        "pauser",
        json!({"permissions": {"spawn": true}}),
        json!([
            [PAUSE, {"id": stranger}],
            [RESUME, {"name": "stranger"}],
            [PAUSE, {"id": stranger, "signal": "STOP"}],
            [PAUSE, {}],
            [0x10, {"name": "own-child", "command": ["/bin/sleep", "30"]}],
            [PAUSE, {"name": "own-child"}],
            [RESUME, {"name": "own-child"}],
        ]),
    );
    let refused = |n: usize, code: &str| {
        let reply: &Value = reply(&replies, n);
        assert_eq!(reply["success"], false, "{reply}");
        assert_eq!(reply["code"], code, "{reply}");
    };
    refused(0, "permission_denied");
    refused(1, "permission_denied");
    refused(2, "bad_request");
    refused(3, "bad_request");
    assert_eq!(reply(&replies, 5)["state"], "paused", "{replies:?}");
    assert_eq!(reply(&replies, 6)["state"], "running", "{replies:?}");
    // The stranger never stopped.
    assert_eq!(agent_info(&mut client, stranger)["state"], "running");
    let missing = request(&mut client, Opcode::RESUME, &json!({"id": 999_999}));
    assert_eq!(missing["code"], "not_found", "{missing}");
}

#[test]
fn a_kernel_that_died_with_an_agent_paused_leaves_it_for_the_next_to_thaw_and_end() {
    require_freezer!();
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = start_counter(&daemon, &mut client, "left-paused");
    let pid = agent_info(&mut client, id)["pid"].as_u64().unwrap();
    let paused = request(&mut client, Opcode::PAUSE, &json!({"id": id}));
    assert_eq!(paused["state"], "paused", "{paused}");
    let dead_pid = daemon.pid();
    daemon.signal(libc::SIGKILL);
    drop(client);
    let mut daemon = daemon;
    daemon.wait(Duration::from_secs(10));
    // Frozen, it cannot act on its kernel's death: it is still there.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "a frozen agent should outlive its kernel until the next one starts"
    );
    daemon.restart("");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the next kernel did not end the frozen agent {pid}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stale = format!("/sys/fs/cgroup/memory/agentos/agentosd-{dead_pid}");
    assert!(
        !Path::new(&stale).exists(),
        "stale cgroups survived the next start"
    );
    assert!(daemon.stop().success());
}
