//! A real `agentosd` on a temporary socket, with its config, log, agents'
//! logs and state in a temporary directory, stopped on drop.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};

use crate::binaries::agentosd;
use crate::host::proc_status_field;
use crate::wire::assert_closed;

/// A running daemon, killed on drop if still alive.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    /// Its config, its log, its agents' logs (`logs/`) and its state
    /// (`state/`), and usually its socket.
    pub dir: tempfile::TempDir,
    /// The socket it serves.
    pub socket: PathBuf,
    log: PathBuf,
    config: PathBuf,
}

/// Each session's disk in a test's daemon, unless the test sets
/// `AGENTOS_SESSION_DISK_BYTES` itself.
pub const TEST_SESSION_DISK_BYTES: &str = "67108864";

/// Detaches everything mounted beneath `dir`, deepest first.
pub fn detach_beneath(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in points {
        let _ = nix::mount::umount2(Path::new(point), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Variables that would point a daemon at an LLM from outside the test;
/// set empty, which the daemon reads as unset.
const LLM_VARIABLES: [&str; 11] = [
    "AGENTOS_LLM_PROVIDER",
    "AGENTOS_LLM_BASE_URL",
    "AGENTOS_LLM_MODEL",
    "AGENTOS_LLM_API_KEY",
    "AGENTOS_LLM_PYTHON",
    "AGENTOS_LLM_LOCAL_MODEL",
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
                // A daemon that exits while starting resets what it has
                // accepted: its log says why.
                match send_exit(&mut probe) {
                    Ok(reply) => assert_eq!(reply, b"goodbye"),
                    Err(err) => panic!(
                        "agentosd dropped its first connection ({err}); log:\n{}",
                        self.log()
                    ),
                }
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

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client connection, with a 10 s timeout on replies.
    pub fn client(&self) -> Client {
        let client = Client::connect(&self.socket).unwrap();
        client.set_timeout(Some(Duration::from_secs(10))).unwrap();
        client
    }

    /// A bare connection for speaking frames byte by byte, with a 10 s
    /// read timeout.
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

    /// Sends it `signal`.
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

/// Sends EXIT and reads the reply's payload.
fn send_exit(probe: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    probe.write_all(&agentos_proto::encode_frame(Opcode::EXIT, 0, b""))?;
    let mut header = [0u8; agentos_proto::HEADER_LEN];
    probe.read_exact(&mut header)?;
    let header = agentos_proto::Header::decode(&header).expect("a reply header");
    let mut payload = vec![0u8; header.payload_len as usize];
    probe.read_exact(&mut payload)?;
    Ok(payload)
}

/// Starts an agentosd process whose config, log and agent logs live in `dir`.
fn launch(
    dir: &Path,
    socket: &Path,
    config: &str,
    nofile: Option<u64>,
) -> (Child, PathBuf, PathBuf) {
    launch_with(dir, socket, config, nofile, &[])
}

/// [`launch`] with these environment variables too.
fn launch_with(
    dir: &Path,
    socket: &Path,
    config: &str,
    nofile: Option<u64>,
    env: &[(&str, &str)],
) -> (Child, PathBuf, PathBuf) {
    use std::os::unix::process::CommandExt;
    let config_path = dir.join(format!("agentosd-{}.toml", unique()));
    fs::write(&config_path, with_llm_off_by_default(config)).unwrap();
    let log = dir.join(format!("agentosd-{}.log", unique()));
    let mut command = Command::new(agentosd());
    if !config.contains("session_disk_bytes") {
        // Sessions' disks are allocated whole: tests keep them small.
        command.env("AGENTOS_SESSION_DISK_BYTES", TEST_SESSION_DISK_BYTES);
    }
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
        // A daemon killed leaves its sessions' disks mounted, for the next
        // kernel to take up; none comes.
        detach_beneath(self.dir.path());
        while nix::mount::umount2(
            Path::new(&state),
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        )
        .is_ok()
        {}
    }
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

/// A process started by a test that must not outlive it, whatever the
/// test's outcome: stopped with SIGTERM (then SIGKILL) on drop.
#[derive(Debug)]
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

/// A daemon whose THINK goes to the stand-in provider at `stub_url`
/// (OpenAI-compatible), with `extra` lines for its `[llm]` table.
pub fn with_llm_stub(stub_url: &str, extra: &str) -> Daemon {
    Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{stub_url}/v1\"\napi_key = \"sk-test\"\n\
         model = \"stub-model\"\n{extra}"
    ))
}
