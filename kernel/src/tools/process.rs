//! One MCP server's process, as the shared [`Supervisor`] runs it: the
//! program found, the directories it needs, started confined (the rule for
//! kernel children: the sandbox user, no capabilities, a read-only view)
//! with **only** the environment its config gives it. Once started, its
//! stdin and stdout go to the reactor ([`StartedServer`]); its stderr is read
//! by a thread of its own ([`super::stderr`]).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::Waker;

use super::secrets::Secrets;
use super::stderr::{lock, read_stderr, Ending, StderrLog};
use super::view::{server_binds, Withheld};
use crate::config::mcp::McpServerConfig;
use crate::sandbox::confine::Confinement;
use crate::sandbox::plan::is_system;
use crate::sandbox::spec::Bind;
use crate::supervisor::{Backoff, Service};

/// First restart delay; doubles per early end, reset after a healthy minute.
pub const RESTART: Backoff = Backoff {
    first: Duration::from_millis(500),
    max: Duration::from_secs(30),
    healthy: Duration::from_secs(60),
};

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
    /// (the kernel's `PATH`). `home` is the server's private home: its
    /// `HOME` unless its config sets one.
    pub fn resolve(
        config: &McpServerConfig,
        path: Option<&str>,
        home: Option<&Path>,
        withheld: &Withheld,
    ) -> Result<ServerCommand, CommandError> {
        let program = find_program(&config.command, path)?;
        let binds = server_binds(&program, config, home, withheld);
        let (program, mut argv) = match uv_beside_uvx(&program) {
            Some(uv) => (uv, vec!["uv".into(), "tool".into(), "uvx".into()]),
            None => (program, vec![config.command.clone()]),
        };
        argv.extend(config.args.iter().cloned());
        let mut env = config.env.clone();
        if let Some(home) = home {
            env.entry("HOME".to_owned())
                .or_insert_with(|| home.display().to_string());
        }
        env.entry("PATH".to_owned())
            .or_insert_with(|| default_path(&program));
        for (name, value) in ca_variables(&binds, |name| std::env::var(name).ok()) {
            env.entry(name.to_owned()).or_insert(value);
        }
        Ok(ServerCommand {
            program,
            argv,
            env,
            cwd: config.cwd.clone(),
            binds,
        })
    }
}

/// The variables that tell TLS clients which certificates to trust. A
/// server gets none of the kernel's environment, but a kernel behind an
/// intercepting proxy or a private CA needs its servers to trust what it
/// trusts: these few are passed on, and nothing else.
const CA_VARIABLES: [&str; 4] = [
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// The CA variables of the kernel's environment (`read`) that name a file
/// or directory the server can see: in a system directory, or in one of
/// its `binds`. One it could not see would only break its TLS another way.
fn ca_variables(
    binds: &[Bind],
    read: impl Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String)> {
    CA_VARIABLES
        .into_iter()
        .filter_map(|name| Some((name, read(name)?)))
        .filter(|(_, value)| {
            let path = Path::new(value);
            let seen = is_system(path) || binds.iter().any(|bind| path.starts_with(&bind.source));
            path.is_absolute() && path.exists() && seen
        })
        .collect()
}

/// The `uv` that a `uvx` program would run. `uvx` is only a launcher: it
/// finds `uv` beside its own file through `/proc/self/exe` and runs `uv
/// tool uvx` with its arguments — but a confined server has no `/proc`
/// (it has no PID namespace whose processes /proc could show), so the
/// server is started as that `uv tool uvx` directly.
fn uv_beside_uvx(program: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(program).ok()?;
    if real.file_name()? != "uvx" {
        return None;
    }
    let uv = real.with_file_name("uv");
    uv.is_file().then_some(uv)
}

/// The `PATH` of a server whose config sets none: its program's directory
/// (where `npx` finds `node`, a virtual environment its commands), then
/// the system's. Launchers need one: `npx` runs a package's command
/// through the shell, and `#!/usr/bin/env node` looks `node` up.
fn default_path(program: &Path) -> String {
    let system = "/usr/local/bin:/usr/bin:/bin";
    match program.parent().filter(|dir| !is_system(dir)) {
        Some(dir) => format!("{}:{system}", dir.display()),
        None => system.to_owned(),
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
    /// How its current incarnation ended, for its error.
    pub ending: Arc<Mutex<Ending>>,
    /// What its stderr has logged, across incarnations.
    pub stderr_log: Arc<Mutex<StderrLog>>,
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
        *lock(&self.ending) = Ending::of(incarnation);
        process.spawn()
    }

    fn started(&mut self, child: &mut Child) -> Result<(), ReadyError> {
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ReadyError::NoPipes);
        };
        let label = self.label.clone();
        let secrets = Secrets::of_env(&self.command.env);
        let (log, ending) = (self.stderr_log.clone(), self.ending.clone());
        let waker = self.waker.clone();
        agentos_primitives::threads::spawn(format!("{label}-stderr"), move || {
            read_stderr(&label, stderr, &secrets, &log, &ending);
            // Its stderr closed: the kernel may be waiting for its error
            // line to say why it ended.
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

    fn ended(&mut self, status: Option<ExitStatus>) {
        let mut ending = lock(&self.ending);
        if ending.incarnation == self.incarnation {
            ending.status = status;
            ending.ended = true;
        }
        drop(ending);
        // The kernel may be waiting for the status to say why it ended.
        let _ = self.waker.wake();
    }

    fn stopped(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_variables_pass_only_when_the_server_can_see_what_they_name() {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen.pem");
        std::fs::write(&seen, "x").unwrap();
        let hidden = tempfile::NamedTempFile::new().unwrap();
        let binds = [Bind {
            source: dir.path().to_path_buf(),
            target: dir.path().to_path_buf(),
            writable: false,
        }];
        let kernel_env = |name: &str| match name {
            "SSL_CERT_FILE" => Some("/etc/passwd".to_owned()),
            "NODE_EXTRA_CA_CERTS" => Some(seen.display().to_string()),
            "REQUESTS_CA_BUNDLE" => Some(hidden.path().display().to_string()),
            "SSL_CERT_DIR" => Some("certs".to_owned()),
            _ => None,
        };
        let passed = ca_variables(&binds, kernel_env);
        assert_eq!(
            passed,
            [
                ("SSL_CERT_FILE", "/etc/passwd".to_owned()),
                ("NODE_EXTRA_CA_CERTS", seen.display().to_string()),
            ]
        );
        assert!(super::super::secrets::is_plain_setting("SSL_CERT_FILE"));
    }

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
    fn uvx_is_started_as_the_uv_tool_uvx_it_would_run() {
        let dir = tempfile::tempdir().unwrap();
        let (uvx, uv) = (dir.path().join("uvx"), dir.path().join("uv"));
        std::fs::write(&uvx, "").unwrap();
        assert_eq!(uv_beside_uvx(&uvx), None, "no uv beside it");
        std::fs::write(&uv, "").unwrap();
        assert_eq!(uv_beside_uvx(&uvx), Some(uv.clone()));
        let config = McpServerConfig {
            command: uvx.display().to_string(),
            args: vec!["mcp-server-time".into()],
            ..McpServerConfig::default()
        };
        let withheld = Withheld {
            homes: vec![],
            state_dir: "/nonexistent".into(),
        };
        let command = ServerCommand::resolve(&config, None, None, &withheld).unwrap();
        assert_eq!(command.program, uv);
        assert_eq!(command.argv, ["uv", "tool", "uvx", "mcp-server-time"]);
        assert_eq!(uv_beside_uvx(Path::new("/bin/sh")), None);
    }

    #[test]
    fn a_server_without_a_path_gets_its_programs_directory_and_the_systems() {
        assert_eq!(
            default_path(Path::new("/usr/bin/npx")),
            "/usr/local/bin:/usr/bin:/bin"
        );
        assert_eq!(
            default_path(Path::new("/opt/node/bin/npx")),
            "/opt/node/bin:/usr/local/bin:/usr/bin:/bin"
        );
    }
}
