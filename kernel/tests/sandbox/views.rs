//! What an agent or a run can see from inside its sandbox: its own
//! processes, mounts and network only, nothing of the host's paths or the
//! kernel's files, and what an unprivileged daemon can still offer.

use std::fs;
use std::path::Path;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{
    self as support, agent_info, agent_log, request, require_root, shared_dir, wait_for_state,
    write_script, Daemon, UnprivilegedDaemon,
};
use serde_json::json;

use crate::spawn;

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
    // The system's interpreter, outside /root: the kernel's default may be
    // the project's virtual environment, whose directories the agent is
    // given (and so sees /root's path to them).
    let id = spawn(
        &mut client,
        json!({"name": "probe", "script": probe, "python": "/usr/bin/python3"}),
    );
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
