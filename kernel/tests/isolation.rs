//! What the sandbox and cgroups do, measured from outside: what an agent
//! can see, what its limits do to it, that nothing of it outlives it, and
//! what an unprivileged daemon can still offer.
//!
//! These need root (CI runs as root); without it each says so loudly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support as support;
use agentos_test_support::require_root;
use agentos_test_support::{
    agent_info, agent_log, request, shared_dir, wait_for_state, write_script, Daemon,
    UnprivilegedDaemon,
};
use serde_json::json;

fn spawn(client: &mut agentos_proto::Client, body: serde_json::Value) -> u64 {
    let reply = request(client, Opcode::SPAWN, &body);
    assert_eq!(reply["success"], true, "{body} -> {reply}");
    reply["id"].as_u64().unwrap()
}

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
fn a_probe_agent_sees_only_its_sandbox() {
    require_root!("running agents as another user");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let probe = write_script(
        dir.path(),
        "probe.py",
        r#"
import ctypes, errno, json, os, socket
def attempt(f):
    try:
        return f()
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror}"
def write_usr():
    open("/usr/agentos-probe", "w").close()
    return "written"
def io_uring():
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(425, 4, params)  # io_uring_setup(entries, params)
    return "created" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
def vsock():
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        return "created"
    except OSError as e:
        return errno.errorcode[e.errno]
report = {
    "io_uring": io_uring(),
    "vsock": vsock(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "interfaces": [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]],
    "root": attempt(lambda: os.listdir("/root")),
    "home": attempt(lambda: os.listdir("/home")),
    "run": attempt(lambda: os.listdir("/run")),
    "hostname": socket.gethostname(),
    "capeff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
    "uid": os.getuid(),
    "usr": attempt(write_usr),
    "shadow": len(open("/etc/shadow", "rb").read()),
    "workspace": attempt(lambda: open("/workspace/note", "w").write("ok")),
    "nonewprivs": [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0],
    "seccomp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0],
}
print("REPORT " + json.dumps(report), flush=True)
"#,
    );
    let mut client = daemon.client();
    let id = spawn(&mut client, json!({"name": "probe", "script": probe}));
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(20));
    let log = agent_log(&daemon, "probe", id);
    let line = log
        .lines()
        .find_map(|l| l.strip_prefix("REPORT "))
        .unwrap_or_else(|| panic!("no report:\n{log}"));
    let report: serde_json::Value = serde_json::from_str(line).unwrap();
    // Its own pids only: the init (1) and itself.
    assert_eq!(report["pids"], json!([1, 2]), "{report}");
    assert_eq!(report["interfaces"], json!(["lo"]), "{report}");
    assert!(
        report["root"]
            .as_str()
            .unwrap()
            .contains("FileNotFoundError"),
        "{report}"
    );
    assert!(
        report["home"]
            .as_str()
            .unwrap()
            .contains("FileNotFoundError"),
        "{report}"
    );
    assert_eq!(
        report["run"],
        json!(["agentos"]),
        "only its socket under /run: {report}"
    );
    assert_eq!(report["hostname"], "agent-probe");
    assert_eq!(report["capeff"], "0000000000000000");
    assert_eq!(report["uid"], 65534);
    assert!(
        report["usr"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{report}"
    );
    assert_eq!(report["shadow"], 0, "/etc/shadow must be masked");
    assert_eq!(
        report["workspace"], 2,
        "the workspace is writable: {report}"
    );
    assert_eq!(report["nonewprivs"], "1");
    assert_eq!(report["seccomp"], "2", "a seccomp filter is in force");
    // io_uring bypasses the filter's view of calls; vsock is not namespaced.
    assert_eq!(report["io_uring"], "EPERM", "{report}");
    assert_eq!(report["vsock"], "EPERM", "{report}");
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
        p99 < Duration::from_millis(20),
        "NOOP p99 {p99:?} during the fork bomb"
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
fn network_true_shares_the_host_network() {
    require_root!("namespaces as another user");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = spawn(
        &mut client,
        json!({"name": "net", "network": true, "command": ["/bin/sh", "-c", "cat /proc/net/dev"]}),
    );
    let reply_ns = agent_info(&mut client, id)["isolation"]["namespaces"].clone();
    assert!(
        !reply_ns.as_array().unwrap().contains(&json!("net")),
        "{reply_ns}"
    );
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    let host_interfaces = fs::read_to_string("/proc/net/dev").unwrap().lines().count();
    let seen = agent_log(&daemon, "net", id).lines().count();
    assert_eq!(seen, host_interfaces, "{}", agent_log(&daemon, "net", id));
}

#[test]
fn unsandboxed_agents_are_plain_children_and_say_so() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "plain", "sandboxed": false, "command": ["/bin/sh", "-c", "id -u; hostname"]}),
    );
    assert_eq!(reply["isolation"]["sandboxed"], false, "{reply}");
    assert_eq!(reply["isolation"]["namespaces"], json!([]));
    assert!(reply["isolation"]["cgroup"].is_null());
    let id = reply["id"].as_u64().unwrap();
    wait_for_state(&mut client, id, &["exited"], Duration::from_secs(10));
    let log = agent_log(&daemon, "plain", id);
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert!(log.contains(&host), "{log}");
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

#[test]
fn an_unprivileged_kernel_still_spawns_and_reports_what_it_lacks() {
    require_root!("running the kernel as another user");
    let daemon = UnprivilegedDaemon::start();
    let mut client = daemon.client();
    let hello = client.hello().unwrap();
    assert!(hello.features.spawn);
    assert!(hello.features.cgroup.is_none(), "no cgroups without root");
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "u", "command": ["/bin/sh", "-c", "echo uid=$(id -u) host=$(hostname)"]}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let isolation = &reply["isolation"];
    let reason = isolation["degraded_reason"]
        .as_str()
        .expect("degradation must be reported");
    assert!(reason.contains("cgroup"), "{reason}");
    assert!(isolation["cgroup"].is_null());
    let namespaces = isolation["namespaces"].as_array().unwrap();
    eprintln!("unprivileged kernel: isolation {isolation}");
    if namespaces.is_empty() {
        assert!(reason.contains("namespaces"), "{reason}");
    } else {
        assert!(namespaces.contains(&json!("user")), "{isolation}");
    }
    let id = reply["id"].as_u64().unwrap();
    let log = daemon.agent_log_with("u", id, &["uid="]);
    if !namespaces.is_empty() {
        assert!(log.contains("uid=0 host=agent-u"), "{log}");
    }
    drop(client);
    assert!(daemon.process.stop().success());
}

// ---- what an agent's mount table tells it ----------------------------------------

/// Prints the mount table twice over (`/proc/self/mountinfo` and
/// `/proc/self/mounts`) as one JSON line, `TABLES {...}`.
const PRINT_TABLES: &str = r#"
import json
tables = {name: open("/proc/self/" + name).read() for name in ("mountinfo", "mounts")}
print("TABLES " + json.dumps(tables), flush=True)
"#;

/// Runs `script` ([`PRINT_TABLES`]) as agent `tables`: its id, and the two
/// tables it printed as one text.
fn agent_tables(
    daemon: &Daemon,
    client: &mut agentos_proto::Client,
    script: &Path,
) -> (u64, String) {
    let id = spawn(client, json!({"name": "tables", "script": script}));
    wait_for_state(client, id, &["exited"], Duration::from_secs(20));
    (id, tables_in(&agent_log(daemon, "tables", id)))
}

fn tables_in(output: &str) -> String {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("TABLES "))
        .unwrap_or_else(|| panic!("no mount tables printed:\n{output}"));
    let tables: serde_json::Value = serde_json::from_str(line).unwrap();
    format!(
        "{}{}",
        tables["mountinfo"].as_str().unwrap(),
        tables["mounts"].as_str().unwrap()
    )
}

/// Asserts no line of `tables` holds any of `hidden` (what, path).
fn assert_names_none(tables: &str, hidden: &[(&str, String)]) {
    for (what, path) in hidden {
        let naming: Vec<&str> = tables
            .lines()
            .filter(|l| l.contains(path.as_str()))
            .collect();
        assert!(
            naming.is_empty(),
            "the mount table names {what} ({path}):\n{}\n\nwhole table:\n{tables}",
            naming.join("\n")
        );
    }
}

/// Asserts each mount's root (mountinfo's 4th field: where in its
/// filesystem the mounted tree lies) shows no host path but the one the
/// agent sees it at: `/`, the mount point's own path (`/usr` at `/usr`,
/// `/sys` at `/proc/sys`), or a path of a filesystem of the kernel's own
/// that is nowhere on the host (`/null` of devtmpfs masking a secret).
fn assert_roots_are_their_mount_points(tables: &str) {
    for line in tables.lines().filter(|l| l.contains(" - ")) {
        let fields: Vec<&str> = line.split(' ').collect();
        let (root, mount_point) = (fields[3], fields[4]);
        assert!(
            root == "/" || mount_point.ends_with(root) || !Path::new(root).exists(),
            "a mount shows the host path {root} at {mount_point}: {line}\n\nwhole table:\n{tables}"
        );
    }
}

/// What of a daemon's files no agent may find named in its mount table:
/// the daemon's own directory (its config and log) and, by name, anything
/// in it wherever its filesystem is mounted; its socket; its state
/// directory (agents' sockets — the agent's own too —, the sandbox
/// staging root, EXEC's tools package); its logs; its task store.
fn daemon_paths(daemon: &Daemon, agent: Option<(&str, u64)>) -> Vec<(&'static str, String)> {
    let dir = daemon.dir.path();
    let state = dir.join("agentos.sock.d");
    let mut hidden = vec![
        ("the daemon's directory", dir.display().to_string()),
        (
            "the daemon's directory by name",
            dir.file_name().unwrap().to_string_lossy().into_owned(),
        ),
        ("the kernel's socket", daemon.socket.display().to_string()),
        ("the state directory", state.display().to_string()),
        (
            "the agents' sockets",
            state.join("agents").display().to_string(),
        ),
        (
            "the staging root",
            state.join("sandbox-root").display().to_string(),
        ),
        (
            "the tools package",
            state.join("tools").display().to_string(),
        ),
        ("the log directory", dir.join("logs").display().to_string()),
        ("the task store", dir.join("state").display().to_string()),
    ];
    if let Some((name, id)) = agent {
        hidden.push((
            "the agent's own socket on the host",
            state
                .join(format!("agents/{id}.sock"))
                .display()
                .to_string(),
        ));
        hidden.push((
            "the agent's log",
            dir.join(format!("logs/{name}-{id}.log"))
                .display()
                .to_string(),
        ));
    }
    hidden
}

/// An agent can read its mount table: the table must not tell it where the
/// kernel keeps its socket, its state or its logs. (The directories it was
/// given it sees at their own paths, so those may show.)
#[test]
fn an_agents_mounts_name_no_host_path_it_was_not_given() {
    require_root!("running agents as another user");
    let daemon = Daemon::start();
    let dir = shared_dir();
    let script = write_script(dir.path(), "tables.py", PRINT_TABLES);
    let mut client = daemon.client();
    let (id, tables) = agent_tables(&daemon, &mut client, &script);
    // What it was given shows, at its own path.
    assert!(tables.contains(" /run/agentos/agentos.sock "), "{tables}");
    assert!(
        tables.contains(&format!(" {} ", dir.path().display())),
        "{tables}"
    );
    assert_names_none(&tables, &daemon_paths(&daemon, Some(("tables", id))));
    assert_roots_are_their_mount_points(&tables);
}

/// A script kept beside the kernel's socket, config and logs is an
/// innocent choice: the agent is given that directory, and sees the names
/// of the kernel's files in it (hidden, empty) — but nothing inside them:
/// not the agents' sockets, not the staging directory its own root was
/// built on.
#[test]
fn an_agent_beside_the_kernels_files_sees_nothing_inside_them_in_its_mounts() {
    require_root!("running agents as another user");
    let daemon = Daemon::start_in(shared_dir(), "");
    let script = write_script(daemon.dir.path(), "tables.py", PRINT_TABLES);
    let mut client = daemon.client();
    let (_, tables) = agent_tables(&daemon, &mut client, &script);
    let state = daemon.dir.path().join("agentos.sock.d");
    let logs = daemon.dir.path().join("logs");
    assert_names_none(
        &tables,
        &[
            (
                "inside the state directory",
                format!("{}/", state.display()),
            ),
            ("inside the log directory", format!("{}/", logs.display())),
            ("the staging root by name", "sandbox-root".to_owned()),
        ],
    );
    assert_roots_are_their_mount_points(&tables);
}

/// EXEC runs are built by the same sandbox layer, inside an exec host that
/// is given EXEC's tools package from the kernel's state directory.
#[test]
fn an_exec_runs_mounts_name_no_host_path_it_was_not_given() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = support::call_json(
        &mut stream,
        Opcode::EXEC,
        json!({"code": PRINT_TABLES}).to_string().as_bytes(),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let tables = tables_in(reply["stdout"].as_str().unwrap());
    assert!(tables.contains(" /tools "), "{tables}");
    assert_names_none(&tables, &daemon_paths(&daemon, None));
    assert_roots_are_their_mount_points(&tables);
}
