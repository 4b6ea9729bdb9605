//! One MCP server's process, as the shared [`Supervisor`] runs it: the
//! program found, the directories it needs, started confined (the rule for
//! kernel children: the sandbox user, no capabilities, a read-only view)
//! with **only** the environment its config gives it. Once started, its
//! stdin and stdout go to the reactor ([`StartedServer`]); its stderr is logged
//! by a thread of its own, capped, with the config's secrets blotted out.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::Waker;

use super::secrets::{truncate_text, Secrets};
use crate::config::mcp::McpServerConfig;
use crate::sandbox::confine::Confinement;
use crate::sandbox::lookup::interpreter_binds;
use crate::sandbox::plan::is_system;
use crate::sandbox::spec::Bind;
use crate::supervisor::{Backoff, Service};

/// First restart delay; doubles per early end, reset after a healthy minute.
pub const RESTART: Backoff = Backoff {
    first: Duration::from_millis(500),
    max: Duration::from_secs(30),
    healthy: Duration::from_secs(60),
};
/// Bytes of a server's stderr logged per incarnation; the rest is read and
/// dropped.
const STDERR_LOG_CAP: usize = 64 << 10;
/// Longest stderr line kept whole (a line says why a server died).
const STDERR_LINE: usize = 512;

/// A started server's pipes, handed to the reactor.
#[derive(Debug)]
pub struct StartedServer {
    /// Which server (its place in the kernel's list).
    pub server: usize,
    /// Which incarnation of it (the supervisor's number, for restarting
    /// it).
    pub incarnation: u64,
    /// Its stdin.
    pub stdin: ChildStdin,
    /// Its stdout.
    pub stdout: ChildStdout,
}

/// How to run one server.
#[derive(Clone, Debug)]
pub struct ServerCommand {
    /// The program, found.
    pub program: PathBuf,
    /// Its argv (the program first).
    pub argv: Vec<String>,
    /// Its whole environment.
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub cwd: Option<PathBuf>,
    /// The directories it sees beside the system's.
    pub binds: Vec<Bind>,
}

impl ServerCommand {
    /// The command for `config`; a bare `command` is looked up on `path`
    /// (the kernel's `PATH`).
    pub fn resolve(
        config: &McpServerConfig,
        path: Option<&str>,
    ) -> Result<ServerCommand, CommandError> {
        let program = find_program(&config.command, path)?;
        let binds = server_binds(&program, config);
        let mut argv = vec![config.command.clone()];
        argv.extend(config.args.iter().cloned());
        Ok(ServerCommand {
            program,
            argv,
            env: config.env.clone(),
            cwd: config.cwd.clone(),
            binds,
        })
    }
}

/// Why a server's program cannot be found; the words follow the server's
/// name (`MCP server fs cannot start: its command ...`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A command given as a path names no file.
    #[error("its command {} does not exist", .0.display())]
    Missing(PathBuf),
    /// A bare command is in none of the `PATH`'s directories.
    #[error("its command {0:?} is not on the kernel's PATH")]
    NotOnPath(String),
}

/// The program's path: as given if it has a `/`, else the first match on
/// `path`.
fn find_program(command: &str, path: Option<&str>) -> Result<PathBuf, CommandError> {
    let is_file = |p: &Path| p.metadata().is_ok_and(|m| m.is_file());
    if command.contains('/') {
        let program = PathBuf::from(command);
        return if is_file(&program) {
            Ok(program)
        } else {
            Err(CommandError::Missing(program))
        };
    }
    path.unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(command))
        .find(|candidate| is_file(candidate))
        .ok_or_else(|| CommandError::NotOnPath(command.to_owned()))
}

/// What a confined server sees beside the system directories: its
/// program's installation (a Python environment, a `node_modules` tree,
/// else its directory), the interpreter its `#!` line names, its working
/// directory and the existing absolute paths among its arguments
/// (read-only), and the directories it may write.
fn server_binds(program: &Path, config: &McpServerConfig) -> Vec<Bind> {
    let mut binds = Vec::new();
    let mut read_only = |path: &Path| {
        if path.is_absolute() && path.exists() && !is_system(path) && path != Path::new("/") {
            binds.push(Bind {
                source: path.to_path_buf(),
                target: path.to_path_buf(),
                writable: false,
            });
        }
    };
    let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    match real.ancestors().find(|dir| dir.ends_with("node_modules")) {
        Some(modules) => read_only(modules),
        None => read_only(real.parent().unwrap_or(Path::new("/"))),
    }
    if let Some(interpreter) = shebang(&real) {
        read_only(interpreter.parent().unwrap_or(Path::new("/")));
    }
    for path in config.cwd.iter() {
        read_only(path);
    }
    for arg in &config.args {
        read_only(Path::new(arg));
    }
    let mut binds: Vec<Bind> = binds
        .into_iter()
        .chain(interpreter_binds(program))
        .chain(
            shebang(&real)
                .map(|i| interpreter_binds(&i))
                .unwrap_or_default(),
        )
        .collect();
    binds.sort_by(|a, b| a.target.cmp(&b.target));
    binds.dedup_by(|a, b| a.target == b.target);
    // Writable directories last, so they lie over a read-only one above.
    binds.extend(config.writable.iter().map(|dir| Bind {
        source: dir.clone(),
        target: dir.clone(),
        writable: true,
    }));
    binds
}

/// The interpreter a script's `#!` line names, unless it is a system one
/// (`/usr/bin/env node` finds node among the system directories).
fn shebang(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line);
    let interpreter = PathBuf::from(line.lines().next()?.split_whitespace().next()?);
    (!is_system(&interpreter)).then_some(interpreter)
}

/// The server as the supervisor runs it.
#[derive(Debug)]
pub struct ServerProcess {
    /// Its place in the kernel's list.
    pub index: usize,
    /// `mcp-<name>`: the supervisor's thread and log lines.
    pub label: String,
    /// How to start it.
    pub command: ServerCommand,
    /// How to confine it; `None`: it runs as the daemon does.
    pub confinement: Option<Confinement>,
    /// Where its pipes go.
    pub launches: Sender<StartedServer>,
    /// Wakes the reactor when they have gone.
    pub waker: Arc<Waker>,
    /// The last line of its stderr, for the error when it ends.
    pub last_words: Arc<Mutex<String>>,
    /// The incarnation started last.
    pub incarnation: u64,
}

/// Why a started server cannot be handed to the reactor; logged after its
/// label (`mcp-fs has no pipes`).
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    /// Its stdin, stdout or stderr is not a pipe to the daemon.
    #[error("has no pipes")]
    NoPipes,
    /// The thread that logs its stderr could not be started.
    #[error("cannot watch its stderr: {0}")]
    Stderr(#[source] std::io::Error),
    /// The reactor that takes its pipes is gone (the kernel is stopping).
    #[error("has no kernel to serve")]
    NoKernel,
}

impl Service for ServerProcess {
    type ReadyError = ReadyError;

    fn name(&self) -> &str {
        &self.label
    }

    fn spawn(&mut self, incarnation: u64) -> std::io::Result<Child> {
        self.incarnation = incarnation;
        let command = &self.command;
        let mut process = match &self.confinement {
            Some(confinement) => confinement.command(
                &command.program,
                &command.argv,
                command.binds.clone(),
                command.cwd.as_deref(),
            )?,
            None => {
                let mut process = Command::new(&command.program);
                process
                    .arg0(&command.argv[0])
                    .args(&command.argv[1..])
                    .current_dir(command.cwd.as_deref().unwrap_or(Path::new("/")));
                // SAFETY: prctl is async-signal-safe and touches no memory
                // of ours.
                unsafe {
                    process.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                process
            }
        };
        process
            .env_clear()
            .envs(&command.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own: what it starts ends with it.
            .process_group(0);
        *lock(&self.last_words) = String::new();
        process.spawn()
    }

    fn started(&mut self, child: &mut Child) -> Result<(), ReadyError> {
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ReadyError::NoPipes);
        };
        let label = self.label.clone();
        let secrets = Secrets::new(self.command.env.values());
        let last_words = self.last_words.clone();
        let waker = self.waker.clone();
        std::thread::Builder::new()
            .name(format!("{label}-stderr"))
            .spawn(move || {
                log_stderr(&label, stderr, &secrets, &last_words);
                // Its stderr closed: the kernel may be waiting for these
                // last words to say why it ended.
                let _ = waker.wake();
            })
            .map_err(ReadyError::Stderr)?;
        let launched = StartedServer {
            server: self.index,
            incarnation: self.incarnation,
            stdin,
            stdout,
        };
        self.launches
            .send(launched)
            .map_err(|_| ReadyError::NoKernel)?;
        let _ = self.waker.wake();
        Ok(())
    }

    fn ended(&mut self) {}

    fn stopped(&mut self) {}
}

fn lock(mutex: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Logs a server's stderr line by line until it closes: the first
/// [`STDERR_LOG_CAP`] bytes of it, with every value of its environment
/// replaced by `[secret]`; the last line is kept as its last words.
fn log_stderr(label: &str, stderr: impl Read, secrets: &Secrets, last_words: &Mutex<String>) {
    let mut logged = 0;
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // At most one line's worth held, however long the line.
        match (&mut reader)
            .take(STDERR_LOG_CAP as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = secrets.redact(String::from_utf8_lossy(&line).trim_end());
        if text.is_empty() {
            continue;
        }
        if logged < STDERR_LOG_CAP {
            logged += text.len();
            log::info!("{label}: {text}");
            if logged >= STDERR_LOG_CAP {
                log::info!("{label}: more on its stderr is not logged");
            }
        }
        let mut kept = text;
        truncate_text(&mut kept, STDERR_LINE);
        // A cut may have split a secret.
        let kept = secrets.redact(&kept);
        *lock(last_words) = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_command_is_found_on_the_path_and_a_missing_one_is_named() {
        assert_eq!(
            find_program("sh", Some("/nonexistent:/bin")).unwrap(),
            Path::new("/bin/sh")
        );
        let missing = find_program("no-such-server", Some("/bin")).unwrap_err();
        assert!(missing.to_string().contains("no-such-server"), "{missing}");
        assert!(find_program("/no/such/file", None).is_err());
    }

    #[test]
    fn a_server_sees_its_package_its_arguments_and_what_it_may_write() {
        let dir = tempfile::tempdir().unwrap();
        let modules = dir.path().join("node_modules");
        let package = modules.join("server/dist");
        std::fs::create_dir_all(&package).unwrap();
        let script = package.join("index.js");
        std::fs::write(&script, "#!/usr/bin/env node\n").unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let config = McpServerConfig {
            command: script.display().to_string(),
            args: vec![data.display().to_string(), "/usr/share".into(), "-v".into()],
            writable: vec![dir.path().join("out")],
            ..McpServerConfig::default()
        };
        let binds = server_binds(&script, &config);
        let seen: Vec<(&Path, bool)> = binds
            .iter()
            .map(|b| (b.target.as_path(), b.writable))
            .collect();
        assert!(seen.contains(&(modules.as_path(), false)), "{seen:?}");
        assert!(seen.contains(&(data.as_path(), false)), "{seen:?}");
        assert!(seen.contains(&(dir.path().join("out").as_path(), true)));
        assert!(!seen.iter().any(|(p, _)| p.starts_with("/usr")), "{seen:?}");
    }
}
