//! The configured MCP servers, on the reactor's side: each one's
//! supervised process ([`super::process`]) and its pipes as mio sources,
//! or, for a remote server, its HTTP threads ([`remote`]); its
//! [`McpClient`], and the calls under way. A call's reply goes to its
//! [`ReplyTo`] when the server answers, its deadline passes, or the server
//! dies — whichever comes first.
//!
//! One server failing never touches another: each has its own process,
//! pipes, client and state, and a server that stops making sense (its
//! handshake fails or times out, it closes its output) is killed and
//! started again by its supervisor, with backoff.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_proto::payload::ServerInfo;
use agentos_proto::{ErrorCode, ErrorReply};
use mio::unix::pipe;
use mio::{Registry, Token, Waker};
use serde_json::Value;

use super::mcp::client::{
    CallId, CallOutcome, ClientEvent, Era, McpClient, ServerState, ToolInfo, Transport,
};
use super::mcp::http::{Delivered, Endpoint, HttpLink, Trouble};
use super::mcp::jsonrpc::LineReader;
use super::process::{ServerCommand, ServerProcess, StartedServer, RESTART};
use super::reply::reply_for;
use super::secrets::{truncate_text, Secrets};
use super::stderr::{lock, Ending};
use super::view::{private_home, Withheld};
use crate::address::Reply;
use crate::address::ReplyTo;
use crate::config::mcp::McpConfig;
use crate::sandbox::confine::Confinement;
use crate::supervisor::Supervisor;
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;
use counts::ServerCounts;

mod counts;
mod pipes;
mod remote;

use remote::Remote;

/// Tokens the servers use: two per server (stdout, stdin).
pub const TOKEN_SPAN: usize = 1 << 40;
/// The largest message a server may send: a bigger one fails the call it
/// answers (or is dropped), and costs no more memory than this.
const MAX_MESSAGE: usize = super::mcp::MAX_MESSAGE;
/// Calls one server may have under way; more are refused with `busy`, so
/// callers cannot pile up work (and memory) behind a slow server.
const MAX_CALLS_PER_SERVER: usize = 1024;
/// Calls one caller may have under way at one server, so that one caller
/// cannot take a server's every place.
const MAX_CALLS_PER_CALLER: usize = 64;
/// Bytes waiting for a server's stdin past which new calls are refused
/// (`busy`): a server that stops reading must not grow the kernel.
const MAX_UNSENT: usize = 4 << 20;
/// Non-messages a server's start may print that are logged one by one.
const GARBAGE_LOGGED: usize = 10;
/// How long a server has to end once told to stop, at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Bytes read from a server per readiness event before others get a turn.
const READ_CHUNK: usize = 64 << 10;

/// A call under way, by the kernel's call number.
#[derive(Debug)]
struct Pending {
    reply_to: ReplyTo,
    server: usize,
    caller: u32,
    /// When it was sent, for the metrics.
    started: std::time::Instant,
    /// Its `execute_tool {tool}` span and, within it, the MCP request's
    /// `tools/call {tool}`, with tracing on.
    spans: Option<(OpenSpan, OpenSpan)>,
}

/// One tool call, as TOOL asks it of a server.
#[derive(Debug)]
pub struct CallRequest<'a> {
    /// The server's name.
    pub server: &'a str,
    /// The tool's name.
    pub tool: &'a str,
    /// Its arguments (a JSON object).
    pub arguments: Value,
    /// How long it may take; the server's `timeout_ms` when `None`.
    pub timeout: Option<Duration>,
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// Who calls (an agent's or operator's id): each has a share of the
    /// server's places.
    pub caller: u32,
    /// The trace the call's span joins, if the caller named one.
    pub trace: Option<TraceContext>,
    /// The agent whose work it is, for the span.
    pub agent: Option<SpanAgent>,
}

/// The configured MCP servers.
#[derive(Debug)]
pub struct Servers {
    /// Where tool calls' spans go.
    tracer: Arc<Tracer>,
    servers: Vec<Server>,
    launches: Receiver<StartedServer>,
    registry: Registry,
    token_base: usize,
    calls: HashMap<CallId, Pending>,
    next_call: CallId,
    /// Bumped whenever the tools on offer change.
    generation: u64,
    /// The kernel's state directory, where the servers' homes are.
    state_dir: PathBuf,
    /// What remote servers' threads deliver, and the waker they wake the
    /// reactor with.
    delivered: (Sender<Delivered>, Receiver<Delivered>),
    waker: Arc<Waker>,
    /// The HTTP client of remote servers, made when the first connects.
    agent: Option<ureq::Agent>,
    /// Remote servers' links at shutdown, whose sessions are ended then,
    /// with the protocol version each was spoken to in.
    retired: Vec<(HttpLink, Option<String>)>,
}

#[derive(Debug)]
struct Server {
    name: String,
    /// Its calls, for the metrics (kept across its restarts).
    counts: ServerCounts,
    timeout: Duration,
    /// `None`: it could not be started at all (see `error`).
    supervisor: Option<Supervisor>,
    client: Option<McpClient>,
    pipes: Option<Pipes>,
    /// Why it last failed, secrets blotted out.
    error: Option<String>,
    /// How its current incarnation ended, as its process reports it.
    ending: Arc<Mutex<Ending>>,
    secrets: Secrets,
    stopped: bool,
    /// Non-messages logged since it started.
    garbage: usize,
    /// The supervisor's number for the incarnation whose pipes these are.
    incarnation: u64,
    /// Its tools as last listed, kept while it restarts: what `import
    /// tools` offers does not flap with a server's restarts.
    known_tools: Vec<ToolInfo>,
    /// Its output closed before its exit status and stderr were in: they
    /// replace `error` when they come.
    awaiting_end: bool,
    /// A remote server's connection (it has no process).
    remote: Option<Remote>,
    /// It ended while `server/discover` was under way: its later
    /// incarnations go straight to the `initialize` handshake, as a
    /// server of the earlier era that dies at a request it does not know
    /// needs.
    skip_probe: bool,
}

#[derive(Debug)]
struct Pipes {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    reader: LineReader,
    /// Bytes for its stdin the pipe has not taken yet.
    unsent: Vec<u8>,
    /// Whether stdin is registered for writability.
    watching_stdin: bool,
}

impl Servers {
    /// Starts every enabled server of `config`, each under its own
    /// supervisor, confined by `confinement` when there is one, with a
    /// private home under `state_dir`; a disabled one is listed as
    /// `stopped`.
    pub fn start(
        config: &McpConfig,
        confinement: Option<Confinement>,
        state_dir: &Path,
        registry: &Registry,
        waker: Arc<Waker>,
        token_base: usize,
    ) -> io::Result<Servers> {
        let (sender, launches) = channel();
        let path = std::env::var("PATH").ok();
        let withheld = Withheld::of_host(state_dir);
        let mut servers = Vec::new();
        let programs = config.enabled().filter(|(_, server)| !server.is_remote());
        if confinement.is_none() && programs.count() > 0 {
            log::warn!(
                "MCP servers run unconfined, as the daemon's own user: this host gives the \
                 daemon no namespaces"
            );
        }
        for (index, (name, server)) in config.servers.iter().enumerate() {
            let ending = Arc::new(Mutex::new(Ending::default()));
            let mut entry = Server {
                name: name.clone(),
                counts: ServerCounts::default(),
                timeout: Duration::from_millis(server.timeout_ms),
                supervisor: None,
                client: None,
                pipes: None,
                error: None,
                ending: ending.clone(),
                secrets: Secrets::of_server(server),
                stopped: !server.enabled,
                garbage: 0,
                incarnation: 0,
                known_tools: Vec::new(),
                awaiting_end: false,
                skip_probe: false,
                remote: server.url.as_deref().map(|url| {
                    let headers = server.headers.clone().into_iter().collect();
                    Remote::new(Endpoint::new(url, headers))
                }),
            };
            if !server.enabled || entry.remote.is_some() {
                // Disabled: listed as `stopped`, its tools not offered.
                // Remote: connected below.
                servers.push(entry);
                continue;
            }
            let user = confinement.as_ref().and_then(Confinement::user);
            let home = match private_home(state_dir, name, user) {
                Ok(home) => home,
                Err(why) => {
                    log::error!("MCP server {name} cannot start: its home: {why}");
                    entry.error = Some(format!("its home cannot be made: {why}"));
                    servers.push(entry);
                    continue;
                }
            };
            match ServerCommand::resolve(server, path.as_deref(), Some(&home), &withheld) {
                Ok(command) => {
                    let process = ServerProcess {
                        index,
                        label: format!("mcp-{name}"),
                        command,
                        confinement: confinement.clone(),
                        launches: sender.clone(),
                        waker: waker.clone(),
                        ending,
                        stderr_log: Arc::default(),
                        incarnation: 0,
                    };
                    entry.supervisor = Some(Supervisor::start(process, RESTART)?);
                }
                Err(why) => {
                    log::error!("MCP server {name} cannot start: {why}");
                    entry.error = Some(why.to_string());
                }
            }
            servers.push(entry);
        }
        let mut started = Servers {
            tracer: Arc::new(Tracer::default()),
            servers,
            launches,
            registry: registry.try_clone()?,
            token_base,
            calls: HashMap::new(),
            next_call: 1,
            generation: 0,
            state_dir: state_dir.to_owned(),
            delivered: channel(),
            waker,
            agent: None,
            retired: Vec::new(),
        };
        let now = Instant::now();
        for index in 0..started.servers.len() {
            let server = &started.servers[index];
            if server.remote.is_some() && !server.stopped {
                started.connect(index, now);
            }
        }
        Ok(started)
    }

    /// The kernel's state directory, where the servers' homes are.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Whether a token is one of the servers' pipes.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKEN_SPAN).contains(&token.0)
    }

    /// Changes with every change of the tools on offer.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every running server's tools as last listed, with the server's
    /// name: what the `tools` package offers.
    pub fn known_tools(&self) -> impl Iterator<Item = (&str, &ToolInfo)> {
        self.servers
            .iter()
            .filter(|server| !server.stopped)
            .flat_map(|server| {
                server
                    .known_tools
                    .iter()
                    .map(move |tool| (server.name.as_str(), tool))
            })
    }

    /// Every ready server's tools, with the server's name.
    pub fn tools(&self) -> impl Iterator<Item = (&str, &ToolInfo)> {
        self.servers.iter().flat_map(|server| {
            let tools = match &server.client {
                Some(client) if client.state() == &ServerState::Ready => client.tools(),
                _ => &[],
            };
            tools.iter().map(move |tool| (server.name.as_str(), tool))
        })
    }

    /// Spans of tool calls go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// Adds every server's call series to the kernel's metrics.
    pub fn add_metrics(&self, snapshot: &mut crate::telemetry::metrics::Snapshot) {
        for server in &self.servers {
            server.counts.add_to(&server.name, snapshot);
        }
    }

    /// Each server's state, as TOOL `list` and HELLO give it.
    pub fn info(&self) -> Vec<ServerInfo> {
        self.servers
            .iter()
            .map(|server| {
                let (state, tools) = match (&server.client, server.stopped) {
                    (_, true) => ("stopped", 0),
                    (Some(client), _) => match client.state() {
                        ServerState::Ready => ("ready", client.tools().len()),
                        ServerState::Starting => ("starting", 0),
                        ServerState::Failed(_) => ("failed", 0),
                    },
                    (None, _) if server.error.is_some() => ("failed", 0),
                    (None, _) if server.supervisor.is_none() && server.remote.is_none() => {
                        ("failed", 0)
                    }
                    (None, _) => ("starting", 0),
                };
                ServerInfo {
                    name: server.name.clone(),
                    state: state.to_owned(),
                    error: (state == "failed").then(|| server.error.clone()).flatten(),
                    tools,
                }
            })
            .collect()
    }

    /// Calls a tool of a configured server; the reply goes to the call's
    /// `reply_to` by its timeout (the server's own when it gives none).
    pub fn call(&mut self, call: CallRequest<'_>, now: Instant) -> Result<(), ErrorReply> {
        let CallRequest {
            server,
            tool,
            arguments,
            timeout,
            reply_to,
            caller,
            trace,
            agent,
        } = call;
        let index = self.index_of(server).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!("there is no tool server {server:?}; TOOL list names the servers"),
            )
        })?;
        let entry = &mut self.servers[index];
        let unavailable = |why: String| ErrorReply::new(ErrorCode::Unavailable, why);
        let Some(client) = entry.client.as_mut() else {
            return Err(unavailable(match (&entry.error, entry.stopped) {
                (_, true) => {
                    format!("tool server {server} is stopped (disabled, or the kernel is stopping)")
                }
                (Some(error), _) => format!("tool server {server} is down: {error}"),
                (None, _) => format!("tool server {server} is starting"),
            }));
        };
        if client.state() == &ServerState::Ready && !client.tools().iter().any(|t| t.name == tool) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("tool server {server} has no tool {tool:?}; TOOL list names its tools"),
            ));
        }
        let unsent = entry.pipes.as_ref().map_or(0, |p| p.unsent.len());
        if unsent > MAX_UNSENT {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "tool server {server} is not reading its input ({unsent} bytes wait for \
                     it); retry later"
                ),
            ));
        }
        let at_server = || self.calls.values().filter(|c| c.server == index);
        let (all, own) = (
            at_server().count(),
            at_server().filter(|c| c.caller == caller).count(),
        );
        if all >= MAX_CALLS_PER_SERVER || own >= MAX_CALLS_PER_CALLER {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "tool server {server} has {all} calls under way, {own} of them yours (at \
                     most {MAX_CALLS_PER_SERVER}, {MAX_CALLS_PER_CALLER} per caller); retry \
                     when some have ended"
                ),
            ));
        }
        let number = self.next_call;
        let deadline = now + timeout.unwrap_or(entry.timeout);
        // A server starting over after a failure is named with that failure:
        // "starting" alone would hide why it is not serving.
        let last_failure = &entry.error;
        let spans = open_call_spans(
            &self.tracer,
            &entry.name,
            tool,
            self.next_call,
            entry.pipes.is_some(),
            trace.as_ref(),
            agent.as_ref(),
        );
        // The server's own spans join the call's (MCP reserves
        // `_meta.traceparent` for it).
        let traceparent = spans.as_ref().map(|(_, mcp)| mcp.context.to_string());
        client
            .call(number, tool, arguments, deadline, traceparent.as_deref())
            .map_err(|why| match last_failure {
                Some(last) => unavailable(format!("{why}; it last failed: {last}")),
                None => unavailable(why.to_string()),
            })?;
        self.next_call += 1;
        self.calls.insert(
            number,
            Pending {
                reply_to,
                server: index,
                caller,
                started: std::time::Instant::now(),
                spans,
            },
        );
        self.flush(index);
        Ok(())
    }

    /// Calls answered by a connection that has closed are given up on.
    pub fn connection_closed(&mut self, serial: u64) {
        let gone: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(_, p)| p.reply_to.connection() == Some(serial))
            .map(|(id, _)| *id)
            .collect();
        for call in gone {
            if let Some(pending) = self.calls.remove(&call) {
                if let Some(client) = self.servers[pending.server].client.as_mut() {
                    client.cancel(call, "the caller went away");
                }
                end_call_spans(&self.tracer, pending.spans, Some("connection_closed"));
                self.flush(pending.server);
            }
        }
    }

    /// Pipes of servers that have (re)started.
    pub fn on_wake(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        // Endings first: they belong to incarnations that ended before any
        // incarnation now being adopted began.
        for server in self.servers.iter_mut().filter(|s| s.awaiting_end) {
            if let Some(why) = ending_of(server) {
                server.awaiting_end = false;
                server.error = Some(why);
            }
        }
        while let Ok(launched) = self.launches.try_recv() {
            self.adopt(launched, replies, now);
        }
        self.on_delivered(replies, now);
    }

    /// Readiness of a server's pipe.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>, now: Instant) {
        let offset = token.0 - self.token_base;
        let index = offset / 2;
        if index >= self.servers.len() {
            return;
        }
        if offset % 2 == 0 {
            self.read(index, replies, now);
        } else {
            self.flush(index);
        }
    }

    /// The earliest deadline of any server's request.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.servers
            .iter()
            .filter_map(|s| s.client.as_ref()?.next_deadline())
            .chain(self.next_reconnect())
            .min()
            .map(|at| at.saturating_duration_since(now))
    }

    /// Requests past their deadline fail; remote servers whose backoff has
    /// passed are connected again.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        self.reconnect_due(now);
        for index in 0..self.servers.len() {
            let due = self.servers[index]
                .client
                .as_ref()
                .and_then(McpClient::next_deadline)
                .is_some_and(|at| at <= now);
            if !due {
                continue;
            }
            let mut events = Vec::new();
            if let Some(client) = self.servers[index].client.as_mut() {
                client.on_deadlines(now, &mut events);
            }
            self.handle(index, events, replies);
            self.flush(index);
        }
    }

    /// Stops every server for good; calls under way fail, saying `why`.
    pub fn shutdown(&mut self, why: &str, replies: &mut Vec<Reply>) {
        for index in 0..self.servers.len() {
            let server = &mut self.servers[index];
            server.stopped = true;
            // It is not restarted: the supervisor stops it gently (SIGTERM,
            // and closing its stdin).
            if let Some(supervisor) = &server.supervisor {
                supervisor.stop();
            }
            if let Some(remote) = server.remote.as_mut() {
                self.retired.extend(remote.retire(server.client.as_ref()));
            }
            self.end_calls(index, why, replies);
        }
    }

    /// Last step of shutdown (blocks briefly): ends remote servers'
    /// sessions and waits for the programs to end, killing any that
    /// ignored being told to stop.
    pub fn finish_shutdown(&self) {
        let deadline = Instant::now() + STOP_GRACE;
        std::thread::scope(|scope| {
            for (link, version) in &self.retired {
                scope.spawn(move || link.end_session(version.as_deref(), STOP_GRACE));
            }
            self.stop_programs(deadline);
        });
    }

    fn stop_programs(&self, deadline: Instant) {
        let left = || deadline.saturating_duration_since(Instant::now());
        let mut killed = Vec::new();
        for server in &self.servers {
            let Some(supervisor) = &server.supervisor else {
                continue;
            };
            if !supervisor.wait_finished(left()) {
                log::warn!("MCP server {} ignored SIGTERM; killing it", server.name);
                supervisor.restart(server.incarnation);
                killed.push(supervisor);
            }
        }
        for supervisor in killed {
            supervisor.wait_finished(STOP_GRACE);
        }
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.name == name)
    }

    /// What the client reported: calls answered, the server ready or
    /// failed.
    fn handle(&mut self, index: usize, events: Vec<ClientEvent>, replies: &mut Vec<Reply>) {
        for event in events {
            match event {
                ClientEvent::ToolsListed(count) => {
                    let server = &mut self.servers[index];
                    server.error = None;
                    if let Some(client) = &server.client {
                        server.known_tools = client.tools().to_vec();
                    }
                    self.generation += 1;
                    log::info!("MCP server {} ready with {count} tools", server.name);
                }
                ClientEvent::Failed(why) => {
                    // The handshake or a listing failed: it is of no use
                    // until it starts over.
                    self.restart(index, why, replies);
                }
                ClientEvent::CallEnded { call, outcome } => {
                    let Some(pending) = self.calls.remove(&call) else {
                        continue;
                    };
                    let server = &mut self.servers[index];
                    server.counts.ended(&outcome, pending.started.elapsed());
                    let error = match &outcome {
                        CallOutcome::Done { .. } => None,
                        CallOutcome::ToolError { .. } => Some("tool_error"),
                        CallOutcome::Rejected(_) => Some("rejected"),
                        CallOutcome::TimedOut(_) => Some("timeout"),
                        CallOutcome::Failed(_) => Some("failed"),
                    };
                    end_call_spans(&self.tracer, pending.spans, error);
                    let reply = reply_for(outcome, &server.name, &server.secrets);
                    replies.push((pending.reply_to, reply));
                }
                ClientEvent::Garbage(line) => {
                    // A server that prints nothing but garbage must not
                    // flood the log.
                    let server = &mut self.servers[index];
                    server.garbage += 1;
                    if server.garbage <= GARBAGE_LOGGED {
                        let mut line = line;
                        truncate_text(&mut line, 200);
                        let line = server.secrets.redact(&line);
                        log::warn!("MCP server {} printed a non-message: {line}", server.name);
                    }
                    if server.garbage == GARBAGE_LOGGED {
                        log::warn!(
                            "MCP server {}: further non-messages are not logged",
                            server.name
                        );
                    }
                }
            }
        }
    }

    /// The server is of no use as it is: everything under way fails with
    /// `why`, and its supervisor starts it again after the backoff.
    fn restart(&mut self, index: usize, why: String, replies: &mut Vec<Reply>) {
        let server = &mut self.servers[index];
        let why = server.secrets.redact(&why);
        if !server.stopped {
            log::warn!("MCP server {} failed: {why}", server.name);
        }
        if let Some(supervisor) = &server.supervisor {
            supervisor.restart(server.incarnation);
        }
        if let Some(remote) = server.remote.as_mut() {
            remote.failed(server.stopped);
        }
        self.end_calls(index, &why, replies);
        let server = &mut self.servers[index];
        server.client = None;
        server.error = Some(why);
    }

    /// Ends the calls under way at server `index`, saying `why`, and stops
    /// reading and writing its pipes.
    fn end_calls(&mut self, index: usize, why: &str, replies: &mut Vec<Reply>) {
        let mut events = Vec::new();
        if let Some(client) = self.servers[index].client.as_mut() {
            client.ended(why, &mut events);
        }
        // Only the calls it ended are handled: its end is this one.
        events.retain(|e| matches!(e, ClientEvent::CallEnded { .. }));
        self.handle(index, events, replies);
        self.close_pipes(index);
    }

    fn close_pipes(&mut self, index: usize) {
        if let Some(mut pipes) = self.servers[index].pipes.take() {
            let _ = self.registry.deregister(&mut pipes.stdout);
            if pipes.watching_stdin {
                let _ = self.registry.deregister(&mut pipes.stdin);
            }
        }
    }
}

/// Why the server's adopted incarnation ended (its exit status and the
/// error line of its stderr, redacted when it was kept), once known.
fn ending_of(server: &Server) -> Option<String> {
    let ending = lock(&server.ending);
    (ending.incarnation == server.incarnation)
        .then(|| ending.describe())
        .flatten()
}

// Remote servers: their incarnations, and what their threads deliver.
impl Servers {
    /// A new incarnation of remote server `index`: its threads, and a
    /// client that probes at once.
    fn connect(&mut self, index: usize, now: Instant) {
        let agent = self
            .agent
            .get_or_insert_with(crate::tools::mcp::http::agent);
        let server = &mut self.servers[index];
        let Some(remote) = server.remote.as_mut() else {
            return;
        };
        remote.retry_at = None;
        remote.since = now;
        server.incarnation += 1;
        let opened = HttpLink::open(
            agent,
            remote.endpoint.clone(),
            (index, server.incarnation),
            &self.delivered.0,
            &self.waker,
        );
        match opened {
            Ok(link) => remote.link = Some(link),
            Err(err) => {
                let why = format!("its HTTP threads cannot be started: {err}");
                log::error!("MCP server {}: {why}", server.name);
                server.error = Some(why);
                remote.failed(server.stopped);
                return;
            }
        }
        server.client = Some(McpClient::probing(
            &server.name,
            Transport::Http,
            server.timeout,
            now,
        ));
        server.garbage = 0;
        self.post(index);
    }

    /// Hands what the client has for remote server `index` to its threads.
    fn post(&mut self, index: usize) {
        let server = &mut self.servers[index];
        let (Some(client), Some(link)) = (
            server.client.as_mut(),
            server.remote.as_ref().and_then(|r| r.link.as_ref()),
        ) else {
            return;
        };
        // Over HTTP, 2026-07-28 cancels a request by closing its stream and
        // takes no message of the client's but requests.
        let modern = client.era() == &Era::Modern;
        // Requests go out side by side, each on a thread of its own; a
        // notification or response goes out before the request that
        // followed it, on the same thread (a server of the earlier era may
        // refuse `tools/list` until `notifications/initialized` is in).
        let mut sequence = Vec::new();
        for message in client.take_messages() {
            let is_request = message.request.is_some();
            if modern && !is_request {
                continue;
            }
            sequence.push(message);
            if is_request {
                link.post(std::mem::take(&mut sequence));
            }
        }
        if !sequence.is_empty() {
            link.post(sequence);
        }
    }

    /// What the remote servers' threads have delivered.
    fn on_delivered(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        while let Ok(delivered) = self.delivered.1.try_recv() {
            let Delivered {
                server: index,
                incarnation,
                messages,
                trouble,
            } = delivered;
            let server = &mut self.servers[index];
            // An incarnation given up on, or a server stopped.
            if server.incarnation != incarnation || server.stopped {
                continue;
            }
            let mut events = Vec::new();
            if let Some(client) = server.client.as_mut() {
                for message in messages {
                    client.on_message(message, now, &mut events);
                }
                if let Some(Trouble::Lost { id, why }) = &trouble {
                    client.lost(*id, why, &mut events);
                }
            }
            self.handle(index, events, replies);
            if let Some(Trouble::Down(why)) = trouble {
                // Unless what it answered has already failed it.
                if self.servers[index].client.is_some() {
                    self.restart(index, why, replies);
                }
            }
            self.post(index);
        }
    }

    /// Remote servers whose backoff has passed are connected again.
    fn reconnect_due(&mut self, now: Instant) {
        for index in 0..self.servers.len() {
            let server = &self.servers[index];
            let due = server
                .remote
                .as_ref()
                .and_then(|r| r.retry_at)
                .is_some_and(|at| at <= now);
            if due && !server.stopped {
                self.connect(index, now);
            }
        }
    }

    /// The earliest time a remote server is to be connected again.
    fn next_reconnect(&self) -> Option<Instant> {
        self.servers
            .iter()
            .filter(|s| !s.stopped)
            .filter_map(|s| s.remote.as_ref()?.retry_at)
            .min()
    }
}

/// A call's `execute_tool {tool}` span (GenAI) and, as its child, the
/// MCP request's `tools/call {tool}` (whose context goes to the server).
fn open_call_spans(
    tracer: &Tracer,
    server: &str,
    tool: &str,
    request_id: u64,
    over_pipes: bool,
    parent: Option<&TraceContext>,
    agent: Option<&SpanAgent>,
) -> Option<(OpenSpan, OpenSpan)> {
    let mut call = tracer.open(format!("execute_tool {tool}"), SpanKind::Internal, parent)?;
    call.text("gen_ai.operation.name", "execute_tool");
    call.text("gen_ai.tool.name", tool);
    call.text("agentos.tool.server", server);
    call.agent(agent);
    let mut mcp = tracer.open(
        format!("tools/call {tool}"),
        SpanKind::Client,
        Some(&call.context),
    )?;
    mcp.text("mcp.method.name", "tools/call");
    mcp.text("gen_ai.tool.name", tool);
    mcp.text("gen_ai.operation.name", "execute_tool");
    mcp.text("jsonrpc.request.id", request_id.to_string());
    mcp.text("network.transport", if over_pipes { "pipe" } else { "tcp" });
    mcp.text("agentos.tool.server", server);
    Some((call, mcp))
}

/// Ends a call's spans, the MCP request's first; `error` is the
/// `error.type` of both if it failed.
fn end_call_spans(tracer: &Tracer, spans: Option<(OpenSpan, OpenSpan)>, error: Option<&str>) {
    let Some((mut call, mut mcp)) = spans else {
        return;
    };
    if let Some(kind) = error {
        mcp.text("error.type", kind);
        call.text("error.type", kind);
    }
    tracer.end(mcp, error.map(str::to_owned));
    tracer.end(call, error.map(str::to_owned));
}
