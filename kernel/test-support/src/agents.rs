//! Agents as tests drive them: SPAWN and LIST over a client, the actor
//! agent that makes requests on its own socket, its log, and the scripts
//! and directories agents may read.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};

use crate::daemon::Daemon;
use crate::wire::request;

/// One agent's LIST entry.
pub fn agent_info(client: &mut Client, id: u64) -> serde_json::Value {
    let list = request(client, Opcode::LIST, &serde_json::json!({}));
    list.as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("agent {id} not in LIST: {list}"))
}

/// Polls LIST until the agent reaches one of `states`; returns its entry.
pub fn wait_for_state(
    client: &mut Client,
    id: u64,
    states: &[&str],
    timeout: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        let info = agent_info(client, id);
        if states.iter().any(|s| info["state"] == *s) {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "agent {id} not in {states:?} after {timeout:?}: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A directory whose files the agents' user can read (tempdirs are 0700).
pub fn shared_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("agentos-test-")
        .tempdir()
        .unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Writes a script readable by everyone.
pub fn write_script(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Python frames over any socket, for scripts with no SDK installed:
/// `send(s, op, payload, claim=0)` (bytes, or anything JSON) and
/// `recv(s)` -> `(agent_id, opcode, payload)`.
#[macro_export]
macro_rules! py_frames {
    () => {
        r#"
import json, os, socket, struct, sys
def exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("kernel closed the connection")
        data += chunk
    return data
def send(s, op, payload=b"", claim=0):
    if not isinstance(payload, bytes):
        payload = json.dumps(payload).encode()
    s.sendall(struct.pack("<IIBQ", 0x41474E54, claim, op, len(payload)) + payload)
def recv(s):
    _, agent_id, opcode, n = struct.unpack("<IIBQ", exact(s, 17))
    return agent_id, opcode, exact(s, n)
"#
    };
}

/// Python helpers agents use to speak the protocol with no SDK installed:
/// [`py_frames`], and `call(op, payload, claim=0)` -> `(agent_id,
/// payload)` on one connection to `$AGENTOS_SOCKET`.
pub const PY_KERNEL: &str = concat!(
    py_frames!(),
    r#"
_sock = socket.socket(socket.AF_UNIX)
_sock.connect(os.environ["AGENTOS_SOCKET"])
def call(op, payload=b"", claim=0):
    send(_sock, op, payload, claim)
    agent_id, _, body = recv(_sock)
    return agent_id, body
"#
);

/// The agent log of agent `id` named `name` under the daemon's log dir.
pub fn agent_log(daemon: &Daemon, name: &str, id: u64) -> String {
    fs::read_to_string(
        daemon
            .dir
            .path()
            .join("logs")
            .join(format!("{name}-{id}.log")),
    )
    .unwrap_or_default()
}

/// Whether a directory under a daemon's cgroup instance belongs to an agent
/// run (`agent-<id>-<run>`), rather than to a warm sandbox (`sandbox-<n>`).
pub fn is_agent_cgroup(entry: &fs::DirEntry) -> bool {
    entry.file_name().to_string_lossy().starts_with("agent-")
}

/// An agent that performs requests on its own socket: `argv[1]` is a JSON
/// list of `[opcode, payload]`; each reply is printed as `REPLY <json>`
/// (`{"agent_id": .., "reply": ..}`), then `DONE`, and then it waits
/// (`argv[2]` seconds, default 30) so its children stay its own.
pub const ACTOR: &str = r#"
import time
for op, payload in json.loads(sys.argv[1]):
    agent_id, reply = call(op, payload)
    text = reply.decode(errors="replace")
    body = json.loads(text) if text[:1] in "{[" else text
    print("REPLY " + json.dumps({"agent_id": agent_id, "reply": body}), flush=True)
print("DONE", flush=True)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 30)
"#;

/// Writes [`ACTOR`] (with the protocol helpers) into `dir`.
pub fn write_actor(dir: &Path) -> PathBuf {
    write_script(dir, "actor.py", &format!("{PY_KERNEL}{ACTOR}"))
}

/// Spawns [`ACTOR`] (written to a directory of its own) as agent `name`
/// with the extra SPAWN fields in `spawn`, has it send `requests`, and
/// returns its id and the replies it got.
pub fn act(
    daemon: &Daemon,
    name: &str,
    spawn: serde_json::Value,
    requests: serde_json::Value,
) -> (u64, Vec<serde_json::Value>) {
    act_in(daemon, shared_dir().path(), name, spawn, requests)
}

/// [`act`] with the actor written into `dir`, so the agent sees what else
/// the test put there.
pub fn act_in(
    daemon: &Daemon,
    dir: &Path,
    name: &str,
    spawn: serde_json::Value,
    requests: serde_json::Value,
) -> (u64, Vec<serde_json::Value>) {
    let actor = write_actor(dir);
    let mut client = daemon.client();
    let client = &mut client;
    let mut body =
        serde_json::json!({"name": name, "script": actor, "args": [requests.to_string()]});
    for (key, value) in spawn.as_object().unwrap() {
        body[key] = value.clone();
    }
    let reply = request(client, Opcode::SPAWN, &body);
    assert_eq!(reply["success"], true, "{body} -> {reply}");
    let id = reply["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = agent_log(daemon, name, id);
        if log.lines().any(|l| l == "DONE") {
            let replies = log
                .lines()
                .filter_map(|l| l.strip_prefix("REPLY "))
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            return (id, replies);
        }
        assert!(
            Instant::now() < deadline,
            "agent {name} did not finish its requests:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Agent `id`'s log once it holds the line `line` (within 20 s).
pub fn agent_log_with_line(daemon: &Daemon, name: &str, id: u64, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = agent_log(daemon, name, id);
        if log.lines().any(|l| l == line) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "agent {name} never wrote {line:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The names of the agents LIST shows.
pub fn listed_names(client: &mut Client) -> Vec<String> {
    request(client, Opcode::LIST, &serde_json::json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Makes `calls` (`[[opcode, body], ...]`) on `daemon`'s main socket as
/// uid 65534 (group 0, so the socket lets it in as an operator of its
/// own uid) and returns each reply as JSON, in order. Opens the daemon's
/// directory and socket to other users to do so.
pub fn calls_as_another_uid(daemon: &Daemon, calls: &serde_json::Value) -> Vec<serde_json::Value> {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    fs::set_permissions(daemon.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&daemon.socket, fs::Permissions::from_mode(0o666)).unwrap();
    let script = format!(
        "{}\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
         for op, body in json.loads(sys.argv[2]):\n    send(s, op, body)\n    \
         print(recv(s)[2].decode(), flush=True)\n",
        py_frames!()
    );
    let output = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&daemon.socket)
        .arg(calls.to_string())
        .uid(65534)
        .gid(0)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}
