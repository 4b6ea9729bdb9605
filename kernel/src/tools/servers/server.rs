//! One configured MCP server, on the reactor's side: its program's
//! supervisor or its remote connection, the client and pipes of its
//! current incarnation, its tools as last listed, and how it last failed
//! (secrets blotted out). What it is to TOOL `list` comes from here.

use std::io;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_proto::payload::ServerInfo;
use mio::Waker;

use super::counts::ServerCounts;
use super::pipes::Pipes;
use super::remote::Remote;
use crate::config::mcp::McpServerConfig;
use crate::sandbox::confine::Confinement;
use crate::supervisor::Supervisor;
use crate::tools::mcp::client::{Era, McpClient, ServerState, ToolInfo, Transport};
use crate::tools::mcp::http::{HttpLink, ServerLocation};
use crate::tools::process::{ServerCommand, ServerProcess, StartedServer, RESTART};
use crate::tools::secrets::{truncate_text, Secrets};
use crate::tools::stderr::{lock, Ending};
use crate::tools::view::{private_home, unwritable, Withheld};

/// Non-messages a server's start may print that are logged one by one.
const GARBAGE_LOGGED: usize = 10;

/// What every server's program is started with.
#[derive(Debug)]
pub struct Launch<'a> {
    /// How programs are confined, when the host allows it.
    pub confinement: Option<&'a Confinement>,
    /// The daemon's `PATH`, where commands are looked up.
    pub path: Option<&'a str>,
    /// What no server may see of the host.
    pub withheld: &'a Withheld,
    /// The kernel's state directory, where the servers' homes are.
    pub state_dir: &'a Path,
    /// Where started incarnations' pipes go.
    pub launches: &'a Sender<StartedServer>,
    /// Wakes the reactor when they have gone.
    pub waker: &'a Arc<Waker>,
}

/// One configured server.
#[derive(Debug)]
pub struct Server {
    /// Its name.
    pub name: String,
    /// Its calls, for the metrics (kept across its restarts).
    pub counts: ServerCounts,
    /// How long a call and its handshake may take, unless a call says.
    pub timeout: Duration,
    /// `None`: it could not be started at all (see `error`), or it is
    /// remote.
    pub supervisor: Option<Supervisor>,
    /// Its current incarnation's client.
    pub client: Option<McpClient>,
    /// Its current incarnation's pipes (a program's).
    pub pipes: Option<Pipes>,
    /// Why it last failed, secrets blotted out.
    pub error: Option<String>,
    /// How its current incarnation ended, as its process reports it.
    ending: Arc<Mutex<Ending>>,
    /// The secrets its settings hold, blotted out of what it says.
    pub secrets: Secrets,
    /// It is disabled, or the kernel is stopping.
    pub stopped: bool,
    /// Non-messages logged since it started.
    garbage: usize,
    /// The supervisor's number for the incarnation whose pipes these are.
    pub incarnation: u64,
    /// Its tools as last listed, kept while it restarts: what `import
    /// tools` offers does not flap with a server's restarts.
    pub known_tools: Vec<ToolInfo>,
    /// Its output closed before its exit status and stderr were in: they
    /// replace `error` when they come.
    pub awaiting_end: bool,
    /// A remote server's connection (it has no process).
    pub remote: Option<Remote>,
    /// It ended while `server/discover` was under way: its later
    /// incarnations go straight to the `initialize` handshake, as a
    /// server of the earlier era that dies at a request it does not know
    /// needs.
    skip_probe: bool,
}

impl Server {
    /// Server `index`, `name`, as `config` says: a program is started
    /// under its own supervisor with a private home; a remote one is
    /// connected by its owner, a disabled one listed as `stopped`. A
    /// program that cannot be started is listed as failed, saying why.
    pub fn start(
        index: usize,
        name: &str,
        config: &McpServerConfig,
        launch: &Launch<'_>,
    ) -> io::Result<Server> {
        let ending = Arc::new(Mutex::new(Ending::default()));
        let mut server = Server {
            name: name.to_owned(),
            counts: ServerCounts::default(),
            timeout: Duration::from_millis(config.timeout_ms),
            supervisor: None,
            client: None,
            pipes: None,
            error: None,
            ending: ending.clone(),
            secrets: Secrets::of_server(config),
            stopped: !config.enabled,
            garbage: 0,
            incarnation: 0,
            known_tools: Vec::new(),
            awaiting_end: false,
            skip_probe: false,
            remote: config.url.as_deref().map(|url| {
                let headers = config.headers.clone().into_iter().collect();
                Remote::new(ServerLocation::new(url, headers))
            }),
        };
        if !config.enabled || server.remote.is_some() {
            return Ok(server);
        }
        let user = launch.confinement.and_then(Confinement::user);
        let home = match private_home(launch.state_dir, name, user) {
            Ok(home) => home,
            Err(why) => {
                log::error!("MCP server {name} cannot start: its home: {why}");
                server.error = Some(format!("its home cannot be made: {why}"));
                return Ok(server);
            }
        };
        // Writes that fail later with EACCES are said now, with the fix.
        for dir in &config.writable {
            if let Some(why) = unwritable(dir, user) {
                log::warn!("MCP server {name}: {why}");
            }
        }
        match ServerCommand::resolve(config, launch.path, Some(&home), launch.withheld) {
            Ok(command) => {
                let process = ServerProcess {
                    index,
                    label: format!("mcp-{name}"),
                    command,
                    confinement: launch.confinement.cloned(),
                    launches: launch.launches.clone(),
                    waker: launch.waker.clone(),
                    ending,
                    stderr_log: Arc::default(),
                    incarnation: 0,
                };
                server.supervisor = Some(Supervisor::start(process, RESTART)?);
            }
            Err(why) => {
                // Its command and arguments are the user's words, which may
                // hold a key its environment also holds.
                let why = server.secrets.redact(&why.to_string());
                log::error!("MCP server {name} cannot start: {why}");
                server.error = Some(why);
            }
        }
        Ok(server)
    }

    /// Its state, as TOOL `list` and HELLO give it. A server starting
    /// again after a failure keeps that failure as its `error`: "starting"
    /// alone would hide why it has not served, through every restart.
    pub fn info(&self) -> ServerInfo {
        let (state, tools) = match (&self.client, self.stopped) {
            (_, true) => ("stopped", 0),
            (Some(client), _) => match client.state() {
                ServerState::Ready => ("ready", client.tools().len()),
                ServerState::Starting => ("starting", 0),
                ServerState::Failed(_) => ("failed", 0),
            },
            (None, _) if self.error.is_some() => ("failed", 0),
            (None, _) if self.supervisor.is_none() && self.remote.is_none() => ("failed", 0),
            (None, _) => ("starting", 0),
        };
        ServerInfo {
            name: self.name.clone(),
            state: state.to_owned(),
            error: matches!(state, "failed" | "starting")
                .then(|| self.error.clone())
                .flatten(),
            tools,
        }
    }

    /// Why it takes no call, when it has no client.
    pub fn why_not_serving(&self) -> String {
        let server = &self.name;
        match (&self.error, self.stopped) {
            (_, true) => {
                format!("tool server {server} is stopped (disabled, or the kernel is stopping)")
            }
            (Some(error), _) => format!("tool server {server} is down: {error}"),
            (None, _) => format!("tool server {server} is starting"),
        }
    }

    /// A new incarnation's client, over `transport`, which speaks first: a
    /// program that ended at the probe goes straight to the handshake.
    pub fn new_client(&mut self, transport: Transport, now: Instant) {
        self.client = Some(if self.skip_probe && transport == Transport::Stdio {
            McpClient::new(&self.name, self.timeout, now)
        } else {
            McpClient::probing(&self.name, transport, self.timeout, now)
        });
        self.garbage = 0;
    }

    /// Its output closed: why it ended, if its process has said (else
    /// it is awaited). A program that ends at the probe is not probed
    /// again.
    pub fn output_closed(&mut self) -> Option<String> {
        let probing = self.client.as_ref().map(McpClient::era) == Some(&Era::Probing);
        if probing && !self.skip_probe {
            log::info!(
                "MCP server {} ended at server/discover; it is started again with the \
                 initialize handshake",
                self.name
            );
            self.skip_probe = true;
        }
        self.ending()
    }

    /// Why its adopted incarnation ended (its exit status and the error
    /// line of its stderr, redacted when it was kept), once known.
    pub fn ending(&self) -> Option<String> {
        let ending = lock(&self.ending);
        (ending.incarnation == self.incarnation)
            .then(|| ending.describe())
            .flatten()
    }

    /// Its tools are listed (`count` of them): they are what it offers.
    pub fn listed(&mut self, count: usize) {
        self.error = None;
        if let Some(client) = &self.client {
            self.known_tools = client.tools().to_vec();
        }
        log::info!("MCP server {} ready with {count} tools", self.name);
    }

    /// It printed `line`, which is not a message: logged, redacted, the
    /// first few times of an incarnation, so that a server that prints
    /// nothing else does not flood the log.
    pub fn printed(&mut self, mut line: String) {
        self.garbage += 1;
        if self.garbage <= GARBAGE_LOGGED {
            truncate_text(&mut line, 200);
            let line = self.secrets.redact(&line);
            log::warn!("MCP server {} printed a non-message: {line}", self.name);
        }
        if self.garbage == GARBAGE_LOGGED {
            log::warn!(
                "MCP server {}: further non-messages are not logged",
                self.name
            );
        }
    }

    /// It is of no use as it is, for `why`: its supervisor starts it again
    /// after the backoff (a remote one is connected again). `why`, its
    /// secrets blotted out.
    pub fn failing(&mut self, why: &str) -> String {
        let why = self.secrets.redact(why);
        if !self.stopped {
            log::warn!("MCP server {} failed: {why}", self.name);
        }
        if let Some(supervisor) = &self.supervisor {
            supervisor.restart(self.incarnation);
        }
        if let Some(remote) = self.remote.as_mut() {
            remote.failed(self.stopped);
        }
        why
    }

    /// It stops for good: its program is told to (SIGTERM, and its stdin
    /// closed); a remote one's link is returned, to end its session, with
    /// the protocol version it was spoken to in.
    pub fn stop(&mut self) -> Option<(HttpLink, Option<String>)> {
        self.stopped = true;
        if let Some(supervisor) = &self.supervisor {
            supervisor.stop();
        }
        let remote = self.remote.as_mut()?;
        remote.retire(self.client.as_ref())
    }
}
