//! What tests of an agent's runs and their egress stand on: an upstream
//! on the host's loopback that keeps the first line of each connection,
//! code that reaches it through a run's proxy endpoint, and an agent that
//! sends its requests in phases, each when the test says so — so a test
//! can have runs queued, change the agent's policy, and then let them
//! start.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};

use crate::agents::{agent_log, shared_dir, write_script, PY_KERNEL};
use crate::daemon::Daemon;
use crate::wire::request;

/// A server on `127.0.0.1`: each connection's first line is kept and
/// answered `seen`, and the connection is held until the client (or the
/// proxy between) closes it.
#[derive(Debug)]
pub struct LineServer {
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl LineServer {
    pub fn start() -> LineServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let lines = Arc::clone(&kept);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        lines.lock().unwrap().push(String::new());
                        return;
                    }
                    lines.lock().unwrap().push(line.trim_end().to_owned());
                    let mut stream = reader.into_inner();
                    let _ = stream.write_all(b"seen\n");
                    let _ = stream.read_to_end(&mut Vec::new());
                });
            }
        });
        LineServer { port, lines }
    }

    /// The first line of each connection so far, in order of arrival (an
    /// empty one for a connection that closed without a line).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until some connection's first line was `line`.
    pub fn wait_for(&self, line: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.lines().iter().any(|l| l == line) {
            assert!(
                Instant::now() < deadline,
                "the upstream never got {line:?}: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Python for a run: asks its proxy endpoint for a tunnel to `port` on
/// `127.0.0.1` and prints the answer's status (`no proxy` without an
/// endpoint); through a tunnel, sends `tag` and waits for the upstream's
/// `seen`. With `hold`, it then waits until the tunnel is closed under it
/// and prints `cut`.
pub fn reach_code(port: u16, tag: &str, hold: bool) -> String {
    format!(
        r#"import socket
try:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
except OSError:
    print("no proxy", flush=True)
    raise SystemExit(0)
s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n")
head = b""
while not head.endswith(b"\r\n\r\n"):
    byte = s.recv(1)
    if not byte:
        break
    head += byte
status = head.split(b" ")[1].decode() if head.count(b" ") else "closed"
print(status, flush=True)
if status == "200":
    s.sendall(b"{tag}\n")
    seen = b""
    while not seen.endswith(b"\n"):
        byte = s.recv(1)
        if not byte:
            break
        seen += byte
    if {hold}:
        s.recv(1)
        print("cut", flush=True)
"#,
        hold = if hold { "True" } else { "False" },
    )
}

/// The agent [`Phased`] runs: `argv[1]` is the directory the test signals
/// in, `argv[2]` a JSON list of phases, each a list of `[tag, opcode,
/// payload]`. Phase 0 is sent at once, phase `n` once the file `go-n`
/// exists; each request on a connection of its own, without waiting for
/// the others. It prints `SENT n` after each phase, `REPLY {"tag": ..,
/// "reply": ..}` for each reply, and `DONE` once every reply has come.
const PHASED_AGENT: &str = r#"
import threading, time
DIR = sys.argv[1]
PHASES = json.loads(sys.argv[2])
# One line at a time: threads printing at once would interleave theirs.
PRINTING = threading.Lock()
def say(line):
    with PRINTING:
        print(line, flush=True)
def ask(tag, op, payload):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["AGENTOS_SOCKET"])
    send(s, op, payload)
    _, _, body = recv(s)
    text = body.decode(errors="replace")
    reply = json.loads(text) if text[:1] in "{[" else text
    say("REPLY " + json.dumps({"tag": tag, "reply": reply}))
threads = []
for number, phase in enumerate(PHASES):
    while number and not os.path.exists(os.path.join(DIR, "go-%d" % number)):
        time.sleep(0.02)
    for tag, op, payload in phase:
        thread = threading.Thread(target=ask, args=(tag, op, payload))
        thread.start()
        threads.append(thread)
    say("SENT %d" % number)
for thread in threads:
    thread.join()
say("DONE")
time.sleep(120)
"#;

/// An agent sending its requests in phases (see [`PHASED_AGENT`]).
#[derive(Debug)]
pub struct Phased {
    pub id: u64,
    name: String,
    dir: tempfile::TempDir,
}

impl Phased {
    /// Spawns it as `name` with the extra SPAWN fields in `spawn`; phase
    /// 0 of `phases` goes out at once.
    pub fn spawn(
        daemon: &Daemon,
        name: &str,
        spawn: serde_json::Value,
        phases: serde_json::Value,
    ) -> Phased {
        let dir = shared_dir();
        let script = write_script(
            dir.path(),
            "phased.py",
            &format!("{PY_KERNEL}{PHASED_AGENT}"),
        );
        let mut body = serde_json::json!({
            "name": name,
            "script": script,
            "args": [dir.path(), phases.to_string()],
        });
        for (key, value) in spawn.as_object().unwrap() {
            body[key] = value.clone();
        }
        let reply = request(&mut daemon.client(), Opcode::SPAWN, &body);
        assert_eq!(reply["success"], true, "{body} -> {reply}");
        Phased {
            id: reply["id"].as_u64().unwrap(),
            name: name.to_owned(),
            dir,
        }
    }

    /// Lets phase `number` go, and waits until it has been sent.
    pub fn go(&self, daemon: &Daemon, number: usize) {
        fs::write(self.dir.path().join(format!("go-{number}")), b"").unwrap();
        self.wait_for_line(daemon, &format!("SENT {number}"));
    }

    /// Waits until its log has the line `line`; returns the log.
    pub fn wait_for_line(&self, daemon: &Daemon, line: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = agent_log(daemon, &self.name, self.id);
            if log.lines().any(|l| l == line) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "agent {} never printed {line:?}:\n{log}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The replies so far, by tag.
    pub fn replies(&self, daemon: &Daemon) -> HashMap<String, serde_json::Value> {
        agent_log(daemon, &self.name, self.id)
            .lines()
            .filter_map(|l| l.strip_prefix("REPLY "))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|r| (r["tag"].as_str().unwrap().to_owned(), r["reply"].clone()))
            .collect()
    }

    /// Waits for the replies tagged `tags`; returns every reply so far.
    pub fn wait_for_replies(
        &self,
        daemon: &Daemon,
        tags: &[&str],
    ) -> HashMap<String, serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let replies = self.replies(daemon);
            if tags.iter().all(|tag| replies.contains_key(*tag)) {
                return replies;
            }
            assert!(
                Instant::now() < deadline,
                "agent {} never had replies {tags:?}:\n{}",
                self.name,
                agent_log(daemon, &self.name, self.id)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Waits until LIST says agent `id` has had `runs` EXEC runs accepted
/// (queued ones included).
pub fn wait_for_runs(client: &mut Client, id: u64, runs: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = crate::agents::agent_info(client, id);
        if info["exec"]["runs"].as_u64() == Some(runs) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "agent {id} never had {runs} runs accepted: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// NET `set` by an operator: agent `id`'s policy is now `network`.
pub fn net_set(client: &mut Client, id: u64, network: serde_json::Value) -> serde_json::Value {
    let reply = request(
        client,
        Opcode::NET,
        &serde_json::json!({"op": "set", "id": id, "network": network}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    reply
}

/// NET `show` of agent `id`: its policy and connection record.
pub fn net_show(client: &mut Client, id: u64) -> serde_json::Value {
    request(
        client,
        Opcode::NET,
        &serde_json::json!({"op": "show", "id": id}),
    )
}
