//! What an agent's cgroup limits do to it (memory, CPU, processes, its
//! log's cap), the usage it is charged, and that nothing of it outlives it,
//! even when the kernel is killed.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{
    self as support, agent_info, agent_log, request, require_root, shared_dir, wait_for_state,
    write_script, Daemon,
};
use serde_json::json;

use crate::spawn;

/// An agent's PID namespace, held open: while it is, its inode number
/// cannot be given to a new namespace (a warm sandbox, say), so counting
/// its processes counts the agent's and nobody else's.
struct PidNamespace {
    _held: fs::File,
    inode: u64,
}

impl PidNamespace {
    fn of(pid: u64) -> PidNamespace {
        let held = fs::File::open(format!("/proc/{pid}/ns/pid")).unwrap();
        let inode = held.metadata().unwrap().ino();
        PidNamespace { _held: held, inode }
    }

    /// Processes in this namespace (seen from the host).
    /// Each process in the namespace, as its /proc stat line.
    fn members(&self) -> Vec<String> {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| fs::metadata(e.path().join("ns/pid")).is_ok_and(|m| m.ino() == self.inode))
            .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
            .collect()
    }

    fn processes(&self) -> usize {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            })
            .filter(|e| fs::metadata(e.path().join("ns/pid")).is_ok_and(|m| m.ino() == self.inode))
            .count()
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn mem_hog_is_oom_killed_and_reported() {
    require_root!("cgroup memory limits");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let hog = write_script(
        dir.path(),
        "hog.py",
        "import time\nhoard = []\nwhile True:\n    hoard.append(bytearray(10 << 20))\n    \
         print(len(hoard) * 10, 'MiB', flush=True)\n    time.sleep(0.05)\n",
    );
    let mut client = daemon.client();
    let started = Instant::now();
    let id = spawn(
        &mut client,
        json!({"name": "hog", "script": hog, "limits": {"memory": 50u64 << 20}}),
    );
    let info = wait_for_state(
        &mut client,
        id,
        &["oom_killed", "exited", "failed"],
        Duration::from_secs(10),
    );
    let took = started.elapsed();
    assert_eq!(info["state"], "oom_killed", "{info}");
    assert_eq!(info["oom_killed"], true);
    assert_eq!(info["signal"], libc::SIGKILL);
    // It reaches 50 MiB after five 10 MiB steps (~0.25 s); the kill is
    // reported well within 2 s of that.
    assert!(
        took < Duration::from_millis(2500),
        "reported after {took:?}"
    );
    let log = agent_log(&daemon, "hog", id);
    assert!(!log.contains("60 MiB"), "it got past its limit:\n{log}");
}

#[test]
fn cpu_hog_is_throttled_to_its_quota() {
    require_root!("cgroup CPU quotas");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "spin", "command": ["/bin/sh", "-c", "while :; do :; done"],
               "limits": {"cpu_quota": 10000, "cpu_period": 100000}}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let before = agent_info(&mut client, id)["cpu"]["usage_usec"]
        .as_u64()
        .unwrap();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let info = agent_info(&mut client, id);
    let used = info["cpu"]["usage_usec"].as_u64().unwrap() - before;
    let share = used as f64 / start.elapsed().as_micros() as f64;
    assert!(
        share <= 0.15,
        "CPU share {share:.3} over 3 s with a 10% quota"
    );
    assert!(share >= 0.05, "CPU share {share:.3}: did it run at all?");
    assert!(info["cpu"]["nr_throttled"].as_u64().unwrap() > 0, "{info}");
    assert_eq!(info["state"], "running");
}

#[test]
fn an_ended_agent_still_lists_what_its_run_used() {
    require_root!("cgroup accounting");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let worker = write_script(
        dir.path(),
        "worker.py",
        "import time\nheld = bytearray(32 << 20)\nheld[::4096] = b'x' * len(held[::4096])\n\
         end = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n",
    );
    let mut client = daemon.client();
    let id = spawn(&mut client, json!({"name": "worker", "script": worker}));
    let info = wait_for_state(
        &mut client,
        id,
        &["exited", "failed", "oom_killed"],
        Duration::from_secs(10),
    );
    assert_eq!(info["state"], "exited", "{info}");
    assert_eq!(info["exit_code"], 0, "{info}");
    let used_usec = info["cpu"]["usage_usec"].as_u64().unwrap();
    assert!(used_usec >= 250_000, "cpu.usage_usec {used_usec}: {info}");
    let peak = info["memory"]["peak"].as_u64().unwrap();
    assert!(peak >= 32 << 20, "memory.peak {peak}: {info}");
    assert_eq!(info["memory"]["current"], 0, "{info}");
    assert_eq!(info["pids"]["current"], 0, "{info}");
}

#[test]
fn fork_bomb_is_contained_while_the_kernel_and_a_healthy_agent_carry_on() {
    require_root!("cgroup process limits");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let bomb = write_script(
        dir.path(),
        "bomb.py",
        "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            \
         time.sleep(3600)\n            os._exit(0)\n    except OSError:\n        time.sleep(0.005)\n",
    );
    let mut client = daemon.client();
    let healthy = spawn(
        &mut client,
        json!({"name": "healthy", "command": ["/bin/sh", "-c", "while :; do echo beat; sleep 0.2; done"]}),
    );
    let bomb_id = spawn(
        &mut client,
        json!({"name": "bomb", "script": bomb, "limits": {"max_pids": 16}}),
    );
    let bomb_pid = agent_info(&mut client, bomb_id)["pid"].as_u64().unwrap();
    let namespace = PidNamespace::of(bomb_pid);

    let mut noop = daemon.client();
    let mut samples = Vec::new();
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        assert_eq!(noop.noop(b"ping").unwrap(), b"ping");
        samples.push(t.elapsed());
        most = most.max(namespace.processes());
        std::thread::sleep(Duration::from_millis(5));
    }
    let info = agent_info(&mut client, bomb_id);
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(
        info["pids"]["current"], 16,
        "the bomb should sit at its cap: {info}"
    );
    // 16 in the cgroup plus the sandbox's init, which stays outside it.
    assert!(most <= 17, "{most} processes in the bomb's namespace");
    let p99 = percentile(&mut samples, 0.99);
    assert!(
        p99 < Duration::from_millis(100),
        "NOOP p99 {p99:?} during the fork bomb (a bound for a kernel that waits, not a speed)"
    );
    assert_eq!(agent_info(&mut client, healthy)["state"], "running");
}

#[test]
fn nothing_of_an_agent_remains_after_it_ends() {
    require_root!("cgroups");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let short = spawn(
        &mut client,
        json!({"name": "short", "command": ["/bin/sh", "-c", "sleep 60 & sleep 60 & exit 0"]}),
    );
    let long = spawn(
        &mut client,
        json!({"name": "long", "command": ["/bin/sleep", "60"]}),
    );
    let long_pid = agent_info(&mut client, long)["pid"].as_u64().unwrap();
    let long_ns = PidNamespace::of(long_pid);
    wait_for_state(&mut client, short, &["exited"], Duration::from_secs(10));
    request(
        &mut client,
        Opcode::KILL,
        &json!({"id": long, "grace_ms": 0}),
    );
    wait_for_state(&mut client, long, &["killed"], Duration::from_secs(10));
    let instance = format!("/sys/fs/cgroup/memory/agentos/agentosd-{}", daemon.pid());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = fs::read_dir(&instance)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir() && support::is_agent_cgroup(e))
            .map(|e| e.file_name())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "agent cgroups left: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(long_ns.processes(), 0);
    // No zombies: nothing of the kernel's is left unreaped.
    let zombies: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            fields.first() == Some(&"Z")
                && fields.get(1) == Some(&daemon.pid().to_string().as_str())
        })
        .collect();
    assert!(zombies.is_empty(), "zombies: {zombies:?}");
    // Sandboxes mount in their own namespaces: the host sees none of it.
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains("sandbox-root"),
        "a sandbox mount leaked to the host"
    );
    drop(client);
    let instance_dirs: Vec<String> = ["memory", "cpu", "cpuacct", "pids"]
        .iter()
        .map(|c| format!("/sys/fs/cgroup/{c}/agentos/agentosd-{}", daemon.pid()))
        .collect();
    assert!(daemon.stop().success());
    for dir in instance_dirs {
        assert!(!Path::new(&dir).exists(), "{dir} left after shutdown");
    }
}

#[test]
fn killing_the_kernel_takes_its_agents_down_and_the_next_one_cleans_up() {
    require_root!("cgroups");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let ids: Vec<u64> = (0..2)
        .map(|i| {
            spawn(
                &mut client,
                json!({"name": format!("orphan{i}"), "command": ["/bin/sleep", "60"]}),
            )
        })
        .collect();
    let pids: Vec<u64> = ids
        .iter()
        .map(|id| agent_info(&mut client, *id)["pid"].as_u64().unwrap())
        .collect();
    let namespaces: Vec<PidNamespace> = pids.iter().map(|p| PidNamespace::of(*p)).collect();
    let dead_pid = daemon.pid();
    daemon.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    loop {
        let alive: usize = namespaces.iter().map(PidNamespace::processes).sum();
        if alive == 0 {
            break;
        }
        // Seconds, not milliseconds: on two cores busy with the rest of
        // the suite the inits may wait their turn to run.
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "{alive} agent processes outlived the kernel: {}",
            namespaces
                .iter()
                .flat_map(PidNamespace::members)
                .collect::<Vec<_>>()
                .join("; ")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(client);
    let mut daemon = daemon;
    daemon.wait(Duration::from_secs(10));
    let stale = format!("/sys/fs/cgroup/memory/agentos/agentosd-{dead_pid}");
    assert!(
        Path::new(&stale).exists(),
        "expected the dead kernel's cgroups to remain for now"
    );
    let state = daemon.dir.path().join("agentos.sock.d");
    assert_eq!(mounts_at(&state), 1, "the dead kernel's state tmpfs stays");
    // The next kernel to start removes what the dead one left; the next on
    // its socket, its state directory too.
    daemon.restart("");
    assert!(
        !Path::new(&stale).exists(),
        "stale cgroups survived the next start"
    );
    assert!(daemon.log().contains(&format!("agentosd pid {dead_pid}")));
    assert_eq!(mounts_at(&state), 1, "only the new kernel's state tmpfs");
    assert!(daemon.stop().success());
    assert_eq!(mounts_at(&state), 0, "a state tmpfs left after shutdown");
}

/// Mounts at `path` in the host's mount table.
fn mounts_at(path: &Path) -> usize {
    let path = path.to_str().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|line| line.split(' ').nth(4) == Some(path))
        .count()
}

#[test]
fn two_hundred_spawns_in_a_burst_leak_nothing() {
    require_root!("cgroups");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    client.noop(b"warm").unwrap();
    let fds_before = support::settled_fd_count(&daemon);
    // Pipelined: all 200 requests go out before the first reply is read.
    for i in 0..200 {
        let body = json!({"name": format!("burst{i}"), "command": ["/bin/true"]});
        client
            .send(Opcode::SPAWN, &serde_json::to_vec(&body).unwrap())
            .unwrap();
    }
    let mut ids = Vec::new();
    for _ in 0..200 {
        let reply: serde_json::Value =
            serde_json::from_slice(&client.recv().unwrap().payload).unwrap();
        assert_eq!(reply["success"], true, "{reply}");
        ids.push(reply["id"].as_u64().unwrap());
    }
    for id in &ids {
        wait_for_state(&mut client, *id, &["exited"], Duration::from_secs(30));
    }
    let instance = format!("/sys/fs/cgroup/memory/agentos/agentosd-{}", daemon.pid());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = fs::read_dir(&instance)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir() && support::is_agent_cgroup(e))
            .count();
        let fds = daemon.fd_count();
        if left == 0 && fds <= fds_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} cgroups and {fds} fds (was {fds_before}) left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        daemon.rss_kib() < 64 * 1024,
        "RSS {} KiB after 200 agents",
        daemon.rss_kib()
    );
}

#[test]
fn agent_logs_stay_under_their_cap() {
    let daemon = Daemon::start_with("[agents]\nlog_bytes = 8192\n");
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "chatty", "command": ["/bin/sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo line $i; i=$((i+1)); done"]}),
    );
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(20));
    let log = agent_log(&daemon, "chatty", id);
    assert!(log.len() <= 8192 + 200, "{} bytes", log.len());
    assert!(log.contains("line 2999"), "the newest output is kept");
    assert!(!log.contains("line 0\n"), "the oldest output is dropped");
    assert!(log.contains("older output dropped"));
}
