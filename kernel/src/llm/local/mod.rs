//! The local model: llama.cpp (PyPI's `xllamacpp`) serving one of the
//! small GGUF models pinned in [`models`] (by default Qwen2.5-Coder-1.5B
//! Instruct, Q4_K_M, assembled from its pinned parts; `llm.local.model`
//! picks another), run as a supervised child of the daemon on 127.0.0.1
//! and called like any OpenAI-compatible server.
//!
//! A [`Supervisor`] keeps the server running and restarts it with backoff
//! if it dies; this module says how to start it and learns its address
//! from the one line it prints once the model is loaded. Before each
//! start the model file is checked against its pins ([`verify`]) on the
//! supervisor's thread: a file that is not the pinned model is never
//! loaded, and THINK says why. The server runs
//! confined like any child of the kernel ([`crate::sandbox::confine`]): the
//! sandbox user, no capabilities, a read-only view — with the host's
//! loopback, where the kernel calls it.
//! It accepts only the random key the daemon gave it, so other local users
//! cannot borrow it; the key reaches it on its stdin, never in its
//! environment or arguments, and the launcher makes itself non-dumpable
//! before reading it. It dies with the daemon (its stdin is the daemon's
//! pipe, and a parent-death signal backs that up).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentos_proto::ErrorCode;

pub mod gguf;
pub mod models;
pub mod verify;

use super::call::CallTarget;
use super::provider::openai::OpenAi;
use super::provider::{ApiKey, Failure, Provider};
use crate::config::python_env;
use crate::process::memfd_with;
use crate::sandbox::confine::Confinement;
use crate::sandbox::spec::Bind;
use crate::supervisor::{Backoff, Service, Supervisor};
use models::{LocalModel, Location};
use verify::{FileKey, VerifyError};

/// The launcher the server runs (with the environment's Python). It is
/// handed over in an anonymous memory file on descriptor 3, so nothing is
/// written to disk and `ps` shows a short command line.
const LAUNCHER: &str = include_str!("server.py");
const LAUNCHER_FD: RawFd = 3;
/// First restart delay; doubles per crash, reset after a healthy minute.
const RESTART: Backoff = Backoff {
    first: Duration::from_secs(1),
    max: Duration::from_secs(30),
    healthy: Duration::from_secs(60),
};
/// Longest the server may take to load its model and say where it is.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// The command that installs what the local model needs.
const INSTALL_HINT: &str = "run scripts/setup (it installs xllamacpp and the default model into \
     the project's .venv; scripts/setup --model NAME installs llm.local.model NAME), or point \
     llm.local.python / AGENTOS_LLM_PYTHON at a Python that has them";

/// Where the model server is.
#[derive(Debug)]
enum State {
    /// Loading the model, or restarting.
    Starting,
    /// Serving.
    Ready(Arc<OpenAi>),
    /// Its model file is not the pinned one; the check is repeated before
    /// each restart, so a model reinstalled meanwhile is picked up.
    Refused(String),
    /// Given up (the daemon is stopping).
    Stopped,
}

/// The supervised server.
#[derive(Debug)]
pub struct LocalServer {
    state: Arc<Mutex<State>>,
    supervisor: Supervisor,
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
    /// The model file's pins.
    pub local_model: &'static LocalModel,
    /// Requests the server runs in parallel.
    pub parallel: usize,
    /// Inference threads (0: llama.cpp's choice).
    pub threads: u32,
    /// Tokens of context, shared by the requests in progress.
    pub context_tokens: u32,
    /// The server's own log (truncated at each start).
    pub log: PathBuf,
}

/// Why there is no Python with the local model installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The daemon's own binary, above which the `.venv` is looked for,
    /// cannot be found.
    #[error("cannot find agentosd's path: {0}")]
    NoExe(#[source] std::io::Error),
    /// No `.venv` above the binary or in the source tree has both
    /// xllamacpp and the model.
    #[error(
        "the local model {model} is not installed (looked for a .venv with xllamacpp and it \
         above {} and in the source tree {}): {}",
        .exe.display(),
        .source_tree.display(),
        INSTALL_HINT
    )]
    NotFound {
        /// The model.
        model: crate::config::llm::LocalModelName,
        /// The daemon's binary.
        exe: PathBuf,
        /// The source tree it was built from.
        source_tree: PathBuf,
    },
    /// The configured Python does not exist.
    #[error("{} does not exist: {}", .0.display(), INSTALL_HINT)]
    NoPython(PathBuf),
    /// The configured Python is not in a `bin` directory of an environment.
    #[error("{} is not inside an environment", .0.display())]
    NoEnvironment(PathBuf),
    /// The environment lacks xllamacpp, the model, or both.
    #[error("{} lacks {}: {}", .venv.display(), .missing.join(" and "), INSTALL_HINT)]
    Lacks {
        /// The environment.
        venv: PathBuf,
        /// What it lacks: PyPI's name of a package, or the model file.
        missing: Vec<String>,
    },
}

/// Finds a Python with xllamacpp and `model` installed: the configured
/// one, else the project's `.venv` ([`python_env::project_pythons`]).
pub fn find_python(configured: Option<&Path>, model: &LocalModel) -> Result<PathBuf, InstallError> {
    if let Some(python) = configured {
        return check_install(python, model).map(|()| python.to_path_buf());
    }
    let exe = std::env::current_exe().map_err(InstallError::NoExe)?;
    python_env::project_pythons()
        .into_iter()
        .find(|python| check_install(python, model).is_ok())
        .ok_or_else(|| InstallError::NotFound {
            model: model.name,
            source_tree: python_env::source_tree()
                .unwrap_or(Path::new("/"))
                .to_path_buf(),
            exe,
        })
}

/// Checks that `python`'s environment has xllamacpp and the model's file,
/// by their files (running Python here would block the caller for a
/// second). Whether the file is the pinned model is [`verify`]'s to say,
/// off this thread.
fn check_install(python: &Path, model: &LocalModel) -> Result<(), InstallError> {
    if !python.exists() {
        return Err(InstallError::NoPython(python.to_path_buf()));
    }
    let venv = python
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| InstallError::NoEnvironment(python.to_path_buf()))?;
    let mut missing = Vec::new();
    if !python_env::has_package(python, "xllamacpp/__init__.py") {
        missing.push("xllamacpp".to_owned());
    }
    if !model.path(python).exists() {
        missing.push(match model.location {
            Location::Package { package, .. } => package.replace('_', "-"),
            Location::Assembled(file) => format!("the model {} ({file})", model.name),
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(InstallError::Lacks {
            venv: venv.to_path_buf(),
            missing,
        })
    }
}

impl LocalServer {
    /// Starts the supervisor thread; the server is `Starting` until its
    /// model is loaded.
    pub fn start(setup: LocalSetup) -> std::io::Result<LocalServer> {
        let state = Arc::new(Mutex::new(State::Starting));
        let service = ModelServer {
            setup,
            state: state.clone(),
            verified: None,
            refused: None,
        };
        let supervisor = Supervisor::start(service, RESTART)?;
        Ok(LocalServer { state, supervisor })
    }

    /// Whether the model is loaded and serving.
    pub fn is_ready(&self) -> bool {
        matches!(*lock(&self.state), State::Ready(_))
    }

    /// Why the model file was refused, while it is
    /// ([`verify::verify`]).
    pub fn refusal(&self) -> Option<String> {
        match &*lock(&self.state) {
            State::Refused(reason) => Some(reason.clone()),
            _ => None,
        }
    }

    /// Stops the server (and keeps it stopped); does not wait.
    pub fn stop(&self) {
        self.supervisor.stop();
    }
}

impl CallTarget for LocalServer {
    fn provider(&self) -> Result<Arc<dyn Provider>, Failure> {
        match &*lock(&self.state) {
            State::Ready(provider) => Ok(provider.clone()),
            State::Refused(reason) => Err(Failure::fatal(
                ErrorCode::Unavailable,
                format!("the local model will not be served: {reason}"),
            )),
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

    fn restarts_itself(&self) -> bool {
        true
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The model server as the supervisor runs it: its command, its key on
/// stdin, its address line, and the state the endpoint reports.
struct ModelServer {
    setup: LocalSetup,
    state: Arc<Mutex<State>>,
    /// The model file as last verified, so a restart does not hash it
    /// again while it is unchanged.
    verified: Option<FileKey>,
    /// The model file as last refused, and why: while it is unchanged,
    /// restarts are refused without reading it again.
    refused: Option<(FileKey, String)>,
}

/// Why a started model server will not serve; logged after its name
/// (`llm-local has no key: ...`).
#[derive(Debug, thiserror::Error)]
enum ReadyError {
    /// No random key could be made for it.
    #[error("has no key: {0}")]
    NoKey(#[source] std::io::Error),
    /// Its key could not be written to its stdin.
    #[error("cannot be given its key: {0}")]
    Key(#[source] std::io::Error),
    /// It did not say where it listens; its log may say why.
    #[error("{source} (its log: {})", .log.display())]
    Address {
        /// What went wrong.
        source: AddressError,
        /// The server's log.
        log: PathBuf,
    },
}

impl Service for ModelServer {
    type ReadyError = ReadyError;

    fn name(&self) -> &str {
        "llm-local"
    }

    fn spawn(&mut self, _incarnation: u64) -> std::io::Result<Child> {
        // Checked here, on the supervisor's thread: hashing the file the
        // first time takes seconds, and no model may load unchecked.
        let model_path = self.setup.local_model.path(&self.setup.python);
        let now = FileKey::of_path(&model_path).ok();
        if let Some((key, reason)) = &self.refused {
            if now == Some(*key) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    reason.clone(),
                ));
            }
        }
        match verify::verify(self.setup.local_model, &model_path, self.verified) {
            Ok(key) => {
                self.verified = Some(key);
                self.refused = None;
            }
            Err(err) => {
                let reason = err.to_string();
                self.verified = None;
                self.refused = now.map(|key| (key, reason.clone()));
                *lock(&self.state) = State::Refused(reason);
                return Err(refusal(err));
            }
        }
        let setup = &self.setup;
        let log = File::create(&setup.log)?;
        let launcher = memfd_with(c"agentos-llm-launcher", LAUNCHER.as_bytes())?;
        let launcher_fd = launcher.as_raw_fd();
        let argv = [
            setup.python.display().to_string(),
            // Read from its descriptor directly: a confined server has no
            // /proc, so no /dev/fd either.
            "-c".to_owned(),
            format!(
                "import os; exec(compile(os.fdopen({LAUNCHER_FD}).read(), \
                 'agentos-llm-launcher', 'exec'))"
            ),
            setup.model.clone(),
            model_path.display().to_string(),
            setup.parallel.to_string(),
            setup.threads.to_string(),
            setup.context_tokens.to_string(),
            setup.local_model.chat_template.unwrap_or("").to_owned(),
            setup.local_model.sampling.temperature.to_string(),
            setup.local_model.sampling.top_p.to_string(),
            setup.local_model.sampling.repeat_penalty.to_string(),
        ];
        let mut command = match &setup.confinement {
            Some((confinement, binds)) => {
                confinement.command(&setup.python, &argv, binds.clone(), None)?
            }
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
            .stderr(log)
            // A group of its own: whatever it starts ends with it.
            .process_group(0);
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
        command.spawn()
    }

    fn started(&mut self, child: &mut Child) -> Result<(), ReadyError> {
        let key = random_key().map_err(ReadyError::NoKey)?;
        // The key's first line on its stdin; the pipe then stays open as the
        // server's lifeline.
        if let Some(stdin) = child.stdin.as_mut() {
            stdin
                .write_all(format!("{key}\n").as_bytes())
                .map_err(ReadyError::Key)?;
        }
        let started = Instant::now();
        let address = read_address(child).map_err(|source| ReadyError::Address {
            source,
            log: self.setup.log.clone(),
        })?;
        log::info!(
            "local model {} ready at {address} (loaded in {:.1?})",
            self.setup.model,
            started.elapsed()
        );
        let provider = OpenAi::new("local", &format!("{address}/v1"), Some(ApiKey::new(key)));
        *lock(&self.state) = State::Ready(Arc::new(provider));
        Ok(())
    }

    fn ended(&mut self, _status: Option<std::process::ExitStatus>) {
        let mut state = lock(&self.state);
        // A refusal stands until a later check passes.
        if !matches!(*state, State::Refused(_)) {
            *state = State::Starting;
        }
    }

    fn stopped(&mut self) {
        *lock(&self.state) = State::Stopped;
    }
}

/// A refused model file as the supervisor logs it (`llm-local failed: ...`).
fn refusal(err: VerifyError) -> std::io::Error {
    let kind = match &err {
        VerifyError::Missing { .. } => std::io::ErrorKind::NotFound,
        VerifyError::Io { source, .. } => source.kind(),
        _ => std::io::ErrorKind::InvalidData,
    };
    std::io::Error::new(kind, err)
}

/// Why the server's address could not be read from its stdout.
#[derive(Debug, thiserror::Error)]
enum AddressError {
    /// Its stdout is not a pipe to the daemon.
    #[error("has no stdout")]
    NoStdout,
    /// It said nothing within [`LOAD_TIMEOUT`].
    #[error("did not report an address within {:?}", LOAD_TIMEOUT)]
    TimedOut,
    /// Its stdout could not be polled.
    #[error("cannot be watched: {0}")]
    Watch(#[source] nix::errno::Errno),
    /// Its stdout could not be read.
    #[error("cannot be read: {0}")]
    Read(#[source] std::io::Error),
    /// Its stdout closed before the line came.
    #[error("ended before reporting an address")]
    Ended,
    /// It printed a line that is not its address.
    #[error("printed {0:?} instead of its address")]
    Printed(String),
}

/// The address from the server's "listening URL" line, or why there is
/// none: it ended first, printed something else, or took longer than
/// [`LOAD_TIMEOUT`].
fn read_address(child: &mut Child) -> Result<String, AddressError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdout = child.stdout.take().ok_or(AddressError::NoStdout)?;
    let deadline = Instant::now() + LOAD_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = PollTimeout::try_from(left).map_err(|_| AddressError::TimedOut)?;
        let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(AddressError::TimedOut),
            Ok(_) => break,
            // A signal meant for the daemon landed on this thread.
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(AddressError::Watch(err)),
        }
    }
    // The line is written whole, with one flush, once the model is loaded.
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(AddressError::Read)?;
    if line.is_empty() {
        return Err(AddressError::Ended);
    }
    line.strip_prefix("listening ")
        .map(str::trim)
        .filter(|address| address.starts_with("http://127.0.0.1:"))
        .map(str::to_owned)
        .ok_or_else(|| AddressError::Printed(line.trim().to_owned()))
}

/// 128 random bits, hex.
fn random_key() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    crate::random::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
