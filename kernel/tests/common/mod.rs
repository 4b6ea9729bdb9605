//! Test harness: a real `agentosd` on a temporary socket, and raw-socket
//! helpers for speaking the protocol byte by byte.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, Client, Header, Opcode, HEADER_LEN};

/// The daemon under test, `target/<profile>/agentosd`.
pub fn agentosd() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| built("agentosd"))
}

/// The command-line client, `target/<profile>/agentos` (crate
/// `agentos-cli`, which `cargo build --workspace` builds).
pub fn agentos() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| built("agentos"))
}

/// A binary of the workspace, from the directory cargo builds binaries
/// into: the parent of this test executable's `deps/`.
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join(name))
        .unwrap_or_else(|| panic!("no target directory above {}", exe.display()));
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// A running daemon, killed on drop if still alive.
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    log: PathBuf,
    config: PathBuf,
}

/// Variables that would point a daemon at an LLM from outside the test;
/// set empty, which the daemon reads as unset.
const LLM_VARIABLES: [&str; 10] = [
    "AGENTOS_LLM_PROVIDER",
    "AGENTOS_LLM_BASE_URL",
    "AGENTOS_LLM_MODEL",
    "AGENTOS_LLM_API_KEY",
    "AGENTOS_LLM_PYTHON",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "AGENTOS_LLM_CONCURRENCY",
];

/// Daemons in tests have no LLM unless the test configures one: a local
/// model server per daemon would load a model for every test.
fn with_llm_off_by_default(config: &str) -> String {
    if config.contains("[llm]") {
        config.to_owned()
    } else {
        format!("{config}\n[llm]\nprovider = \"none\"\n")
    }
}

impl Daemon {
    /// A daemon with default settings.
    pub fn start() -> Daemon {
        Daemon::start_with("")
    }

    /// A daemon with this TOML config.
    pub fn start_with(config: &str) -> Daemon {
        Daemon::start_limited(config, None)
    }

    /// A daemon with this TOML config and, if given, this open-files limit.
    pub fn start_limited(config: &str, nofile: Option<u64>) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agentos.sock");
        let daemon = Daemon::spawn(dir, socket, config, nofile);
        daemon.wait_ready();
        daemon
    }

    /// A daemon with this TOML config and these environment variables.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agentos.sock");
        let (child, log, config) = launch_with(dir.path(), &socket, config, None, env);
        let daemon = Daemon {
            child: Some(child),
            dir,
            socket,
            log,
            config,
        };
        daemon.wait_ready();
        daemon
    }

    /// Spawns a daemon without waiting for it (for tests of start-up failures).
    pub fn spawn_at(dir: tempfile::TempDir, socket: PathBuf, config: &str) -> Daemon {
        Daemon::spawn(dir, socket, config, None)
    }

    /// A daemon whose socket, config file and logs live in `dir` (which a
    /// test may make readable to agents).
    pub fn start_in(dir: tempfile::TempDir, config: &str) -> Daemon {
        let socket = dir.path().join("agentos.sock");
        let daemon = Daemon::spawn(dir, socket, config, None);
        daemon.wait_ready();
        daemon
    }

    /// Starts a new daemon on the same socket and directory, once this
    /// one has exited (after a SIGKILL, say).
    pub fn restart(&mut self, config: &str) {
        let status = self.wait(Duration::from_secs(10));
        eprintln!("previous agentosd ended: {status}");
        let (child, log, config) = launch(self.dir.path(), &self.socket, config, None);
        self.child = Some(child);
        self.log = log;
        self.config = config;
        self.wait_ready();
    }

    fn spawn(dir: tempfile::TempDir, socket: PathBuf, config: &str, nofile: Option<u64>) -> Daemon {
        let (child, log, config) = launch(dir.path(), &socket, config, nofile);
        Daemon {
            child: Some(child),
            dir,
            socket,
            log,
            config,
        }
    }

    /// Waits until the kernel answers, with a full EXIT handshake: once we
    /// see EOF the kernel has closed its side, so no probe connection lingers
    /// in its descriptor table when a test starts counting.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut probe) = UnixStream::connect(&self.socket) {
                send(&mut probe, Opcode::EXIT, b"");
                assert_eq!(recv(&mut probe).1, b"goodbye");
                assert_closed(&mut probe);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("agentosd did not come up; log:\n{}", self.log());
    }

    /// Replaces the daemon's config file (for SIGHUP).
    pub fn rewrite_config(&self, config: &str) {
        fs::write(&self.config, with_llm_off_by_default(config)).unwrap();
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn client(&self) -> Client {
        let client = Client::connect(&self.socket).unwrap();
        client.set_timeout(Some(Duration::from_secs(10))).unwrap();
        client
    }

    pub fn raw(&self) -> UnixStream {
        let stream = UnixStream::connect(&self.socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    /// Resident memory in KiB.
    pub fn rss_kib(&self) -> u64 {
        proc_status_field(self.pid(), "VmRSS:")
    }

    /// Open file descriptors.
    pub fn fd_count(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    /// Waits for the daemon to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agentosd did not exit; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(Duration::from_secs(10))
    }
}

/// Starts an agentosd process whose config, log and agent logs live in `dir`.
fn launch(
    dir: &std::path::Path,
    socket: &std::path::Path,
    config: &str,
    nofile: Option<u64>,
) -> (Child, PathBuf, PathBuf) {
    launch_with(dir, socket, config, nofile, &[])
}

fn launch_with(
    dir: &std::path::Path,
    socket: &std::path::Path,
    config: &str,
    nofile: Option<u64>,
    env: &[(&str, &str)],
) -> (Child, PathBuf, PathBuf) {
    use std::os::unix::process::CommandExt;
    let config_path = dir.join(format!("agentosd-{}.toml", unique()));
    fs::write(&config_path, with_llm_off_by_default(config)).unwrap();
    let log = dir.join(format!("agentosd-{}.log", unique()));
    let mut command = Command::new(agentosd());
    if let Some(limit) = nofile {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs
        // between fork and exec here.
        unsafe {
            command.pre_exec(move || {
                let rlimit = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = command
        .arg("--socket")
        .arg(socket)
        .arg("--config")
        .arg(&config_path)
        .env_remove("AGENTOS_SOCKET")
        .env_remove("RUST_LOG")
        .envs(LLM_VARIABLES.iter().map(|name| (name, "")))
        .env("AGENTOS_LOG_LEVEL", "debug")
        .env("AGENTOS_AGENT_LOG_DIR", dir.join("logs"))
        .env("AGENTOS_STATE_DIR", dir.join("state"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (child, log, config_path)
}

impl Drop for Daemon {
    /// Stops the daemon the way an operator would (SIGTERM), so it removes
    /// its cgroups and agents; SIGKILL only if it does not go in time. A
    /// daemon a test killed leaves the tmpfs on its state directory for the
    /// next kernel on its socket to clear; none comes, so it goes here.
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            terminate(child);
        }
        let mut state = self.socket.as_os_str().to_owned();
        state.push(".d");
        while nix::mount::umount2(
            std::path::Path::new(&state),
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        )
        .is_ok()
        {}
    }
}

/// A process started by a test that must not outlive it, whatever the
/// test's outcome: stopped with SIGTERM (then SIGKILL) on drop.
pub struct StopOnDrop(pub Child);

impl StopOnDrop {
    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> ExitStatus {
        terminate(&mut self.0).expect("the process did not stop within 10 s")
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        terminate(&mut self.0);
    }
}

/// SIGTERM, up to 10 s to exit, then SIGKILL. The status, unless it had to
/// be killed.
fn terminate(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub fn proc_status_field(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Writes one request frame.
pub fn send(stream: &mut UnixStream, opcode: Opcode, payload: &[u8]) {
    stream.write_all(&encode_frame(opcode, 0, payload)).unwrap();
}

/// Reads one reply frame.
pub fn recv(stream: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).unwrap();
    let header = Header::decode(&header).unwrap();
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    (header, payload)
}

/// Reads one reply frame and parses its JSON payload.
pub fn recv_json(stream: &mut UnixStream) -> (Header, serde_json::Value) {
    let (header, payload) = recv(stream);
    let value = serde_json::from_slice(&payload).unwrap_or_else(|e| {
        panic!(
            "reply is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&payload)
        )
    });
    (header, value)
}

/// Reads one reply frame's JSON, or `None` once the kernel has closed the
/// connection.
pub fn try_recv_json(stream: &mut UnixStream) -> Option<serde_json::Value> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).ok()?;
    let header = Header::decode(&header).ok()?;
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).ok()?;
    serde_json::from_slice(&payload).ok()
}

/// Sends a request and reads its JSON reply.
pub fn call_json(stream: &mut UnixStream, opcode: Opcode, payload: &[u8]) -> serde_json::Value {
    send(stream, opcode, payload);
    let (header, value) = recv_json(stream);
    assert_eq!(header.opcode, opcode, "reply opcode");
    value
}

/// Asserts the peer closed the connection (EOF, or a reset after the last reply).
pub fn assert_closed(stream: &mut UnixStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the kernel to close the connection, got {other:?}"),
    }
}

/// Asserts a connection is still served, with a NOOP.
pub fn assert_usable(stream: &mut UnixStream) {
    send(stream, Opcode::NOOP, b"still there?");
    let (header, payload) = recv(stream);
    assert_eq!(header.opcode, Opcode::NOOP);
    assert_eq!(payload, b"still there?");
}

/// Ends a test that needs root, saying so loudly, when not run as root.
#[macro_export]
macro_rules! require_root {
    ($what:expr) => {
        if !$crate::common::is_root() {
            eprintln!(
                "!!! NOT TESTED: {} needs root; run the suite as root (CI does)",
                $what
            );
            return;
        }
    };
}

/// Whether the tests run as root (some behaviours can only be shown then).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Raises this process's open-files limit to its hard limit.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to a rlimit struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

/// A copy of one of our binaries that any user can execute, wherever the
/// workspace happens to live (its path may not be traversable by others).
/// Removed when dropped.
pub struct WorldExecutable {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl WorldExecutable {
    pub fn copy_of(binary: &Path) -> WorldExecutable {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("agentos-bin-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join(binary.file_name().unwrap());
        fs::copy(binary, &path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        WorldExecutable { _dir: dir, path }
    }
}

/// The uid of `nobody`, which an unprivileged kernel runs as in tests.
pub const NOBODY: u32 = 65534;

/// A daemon run as `nobody` (needs root to start), serving `<dir>/k.sock`
/// from a directory it owns, where its log and its agents' logs go too.
/// Stopped on drop.
pub struct UnprivilegedDaemon {
    pub process: StopOnDrop,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    _binary: WorldExecutable,
}

impl UnprivilegedDaemon {
    pub fn start() -> UnprivilegedDaemon {
        use std::os::unix::process::CommandExt;
        let binary = WorldExecutable::copy_of(agentosd());
        let dir = shared_dir();
        let socket = dir.path().join("k.sock");
        nix::unistd::chown(
            dir.path(),
            Some(nix::unistd::Uid::from_raw(NOBODY)),
            Some(nix::unistd::Gid::from_raw(NOBODY)),
        )
        .unwrap();
        let log = dir.path().join("daemon.log");
        let process = StopOnDrop(
            Command::new(&binary.path)
                .arg("--socket")
                .arg(&socket)
                .env_clear()
                .env("AGENTOS_CONFIG", "/dev/null")
                .env("AGENTOS_AGENT_LOG_DIR", dir.path().join("logs"))
                .env("AGENTOS_STATE_DIR", dir.path().join("state"))
                .env("AGENTOS_LOG_LEVEL", "info")
                .stderr(fs::File::create(&log).unwrap())
                .uid(NOBODY)
                .gid(NOBODY)
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the unprivileged kernel did not start:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        UnprivilegedDaemon {
            process,
            dir,
            socket,
            _binary: binary,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Waits until agent `name` (`id`)'s log holds `until`; returns the log.
    pub fn agent_log_with(&self, name: &str, id: u64, until: &[&str]) -> String {
        let path = self
            .dir
            .path()
            .join("logs")
            .join(format!("{name}-{id}.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = fs::read_to_string(&path).unwrap_or_default();
            if until.iter().any(|u| log.contains(u)) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "agent {name} said no {until:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends a JSON request and returns the JSON reply.
pub fn request(
    client: &mut agentos_proto::Client,
    opcode: Opcode,
    body: &serde_json::Value,
) -> serde_json::Value {
    let reply = client
        .call(opcode, &serde_json::to_vec(body).unwrap())
        .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

/// One agent's LIST entry.
pub fn agent_info(client: &mut agentos_proto::Client, id: u64) -> serde_json::Value {
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
    client: &mut agentos_proto::Client,
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
pub fn write_script(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
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

/// Waits until the daemon's descriptor count stops changing (its warm
/// sandboxes are ready), and returns it.
pub fn settled_fd_count(daemon: &Daemon) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = daemon.fd_count();
    let mut stable_since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now = daemon.fd_count();
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() > Duration::from_millis(400) {
            break;
        }
    }
    last
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
pub fn write_actor(dir: &std::path::Path) -> PathBuf {
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
    dir: &std::path::Path,
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
pub fn listed_names(client: &mut agentos_proto::Client) -> Vec<String> {
    request(client, Opcode::LIST, &serde_json::json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The profile sandbox-level tests build sandboxes with: the agent user,
/// small scratch filesystems, a staging directory under `dir`.
pub fn sandbox_profile(dir: &std::path::Path) -> agentos_kernel::sandbox::plan::Profile {
    use agentos_kernel::sandbox::spec::Rlimits;
    use agentos_kernel::sandbox::User;
    let staging = dir.join("root");
    fs::create_dir_all(&staging).unwrap();
    agentos_kernel::sandbox::plan::Profile {
        staging,
        user: Some(User {
            uid: 65534,
            gid: 65534,
        }),
        user_namespace: false,
        tmp_size: 16 << 20,
        workspace_size: 16 << 20,
        rlimits: Rlimits {
            nofile: 256,
            fsize: 64 << 20,
        },
        log_cap: 1 << 20,
        extra_masks: vec![],
    }
}

/// Kills a sandbox launched by a test (SIGKILL to its init) and reaps it.
pub fn kill_and_reap(launched: &agentos_kernel::sandbox::Launched) {
    use std::os::fd::AsFd;
    let _ = agentos_kernel::process::signal(launched.pidfd.as_fd(), libc::SIGKILL);
    agentos_kernel::process::wait(launched.pidfd.as_fd(), true);
}

/// A daemon whose THINK goes to the stand-in provider at `stub_url`
/// (OpenAI-compatible), with `extra` lines for its `[llm]` table.
pub fn with_llm_stub(stub_url: &str, extra: &str) -> Daemon {
    Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{stub_url}/v1\"\napi_key = \"sk-test\"\n\
         model = \"stub-model\"\n{extra}"
    ))
}

/// Processes whose command line holds `marker` (and, if given, that live
/// in the cgroups of the kernel with pid `kernel`).
pub fn processes_with(marker: &str, kernel: Option<i32>) -> usize {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            kernel.is_none_or(|pid| {
                fs::read_to_string(e.path().join("cgroup"))
                    .is_ok_and(|cgroups| cgroups.contains(&format!("agentosd-{pid}/")))
            })
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| {
            String::from_utf8_lossy(cmdline)
                .replace('\0', " ")
                .contains(marker)
        })
        .count()
}

/// Waits up to `within` for no process to hold `marker`.
pub fn none_left(marker: &str, kernel: Option<i32>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while processes_with(marker, kernel) > 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Polls `done` until it holds; fails the test naming `what` after `within`.
pub fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
