//! The configured MCP servers, on the reactor's side: each one's
//! supervised process ([`super::process`]) and its pipes as mio sources,
//! or, for a remote server, its HTTP threads (`remote`); its
//! [`McpClient`], and the calls under way. A call's reply goes to its
//! [`ReplyTo`] when the server answers, its deadline passes, or the server
//! dies — whichever comes first.
//!
//! One server failing never touches another: each has its own process,
//! pipes, client and state, and a server that stops making sense (its
//! handshake fails or times out, it closes its output) is killed and
//! started again by its supervisor, with backoff.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::ServerInfo;
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Registry, Token, Waker};
use serde_json::Value;

use super::mcp::client::{CallOutcome, ClientEvent, McpClient, ServerState, ToolInfo, Transport};
use super::mcp::http::{Delivered, HttpLink, Trouble};
use super::process::StartedServer;
use super::reply::reply_for;
use super::view::Withheld;
use crate::address::Reply;
use crate::address::ReplyTo;
use crate::config::mcp::McpConfig;
use crate::permissions::allows_server;
use crate::sandbox::confine::Confinement;
use crate::telemetry::tracer::{SpanAgent, Tracer};
use crate::telemetry::TraceContext;
use calls::{Calls, Pending};
use pipes::{Pipes, Tokens};
use server::{Launch, Server};
use spans::{end_call_spans, open_call_spans};

mod calls;
mod counts;
mod pipes;
mod remote;
mod server;
mod spans;

/// Tokens the servers use: two per server (stdout, stdin).
pub const TOKEN_SPAN: usize = 1 << 40;
/// Bytes waiting for a server's stdin past which new calls are refused
/// (`busy`): a server that stops reading must not grow the kernel.
const MAX_UNSENT: usize = 4 << 20;
/// How long a server has to end once told to stop, at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(2);

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
    calls: Calls,
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
        let programs = config.enabled().filter(|(_, server)| !server.is_remote());
        if confinement.is_none() && programs.count() > 0 {
            log::warn!(
                "MCP servers run unconfined, as the daemon's own user: this host gives the \
                 daemon no namespaces"
            );
        }
        let launch = Launch {
            confinement: confinement.as_ref(),
            path: path.as_deref(),
            withheld: &withheld,
            state_dir,
            launches: &sender,
            waker: &waker,
        };
        let servers = config
            .servers
            .iter()
            .enumerate()
            .map(|(index, (name, server))| Server::start(index, name, server, &launch))
            .collect::<io::Result<Vec<Server>>>()?;
        let mut started = Servers {
            tracer: Arc::new(Tracer::default()),
            servers,
            launches,
            registry: registry.try_clone()?,
            token_base,
            calls: Calls::default(),
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

    /// Each server's state, for the kernel's own accounts (its metrics).
    pub fn info(&self) -> Vec<ServerInfo> {
        self.servers.iter().map(Server::info).collect()
    }

    /// The state of each server a caller held to `patterns` (its
    /// `permissions.tools`; `None`: every tool) may call a tool of, as TOOL
    /// `list` and HELLO give it: a caller never learns that a server it may
    /// not use exists, nor why it failed.
    pub fn info_seen_by(&self, patterns: Option<&[String]>) -> Vec<ServerInfo> {
        self.servers
            .iter()
            .filter(|server| patterns.is_none_or(|p| allows_server(p, &server.name)))
            .map(Server::info)
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
            return Err(unavailable(entry.why_not_serving()));
        };
        if client.state() == &ServerState::Ready && !client.tools().iter().any(|t| t.name == tool) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("tool server {server} has no tool {tool:?}; TOOL list names its tools"),
            ));
        }
        let unsent = entry.pipes.as_ref().map_or(0, Pipes::unsent);
        if unsent > MAX_UNSENT {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "tool server {server} is not reading its input ({unsent} bytes wait for \
                     it); retry later"
                ),
            ));
        }
        let number = self.calls.room(index, caller).map_err(|full| {
            ErrorReply::new(ErrorCode::Busy, format!("tool server {server} {full}"))
        })?;
        let deadline = now + timeout.unwrap_or(entry.timeout);
        // A server starting over after a failure is named with that failure:
        // "starting" alone would hide why it is not serving.
        let last_failure = &entry.error;
        let spans = open_call_spans(
            &self.tracer,
            &entry.name,
            tool,
            number,
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
        self.calls.insert(
            number,
            Pending {
                reply_to,
                server: index,
                caller,
                started: Instant::now(),
                spans,
            },
        );
        self.flush(index);
        Ok(())
    }

    /// Calls answered by a connection that has closed are given up on.
    pub fn connection_closed(&mut self, serial: u64) {
        for call in self.calls.of_connection(serial) {
            if let Some(pending) = self.calls.remove(call) {
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
            if let Some(why) = server.ending() {
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
            // It is not restarted: the supervisor stops it gently.
            self.retired.extend(self.servers[index].stop());
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
                    self.servers[index].listed(count);
                    self.generation += 1;
                }
                ClientEvent::Failed(why) => {
                    // The handshake or a listing failed: it is of no use
                    // until it starts over.
                    self.restart(index, why, replies);
                }
                ClientEvent::CallEnded { call, outcome } => {
                    let Some(pending) = self.calls.remove(call) else {
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
                ClientEvent::Garbage(line) => self.servers[index].printed(line),
            }
        }
    }

    /// The server is of no use as it is: everything under way fails with
    /// `why`, and its supervisor starts it again after the backoff.
    fn restart(&mut self, index: usize, why: String, replies: &mut Vec<Reply>) {
        let why = self.servers[index].failing(&why);
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
        if let Some(pipes) = self.servers[index].pipes.take() {
            pipes.close(&self.registry);
        }
    }
}

// Programs: their pipes, registered when they (re)start, read into their
// client, and written as far as the pipe takes.
impl Servers {
    /// A (re)started server's pipes: registered, and a new client speaks
    /// first.
    fn adopt(&mut self, launched: StartedServer, replies: &mut Vec<Reply>, now: Instant) {
        let index = launched.server;
        self.servers[index].awaiting_end = false;
        if self.servers[index].stopped {
            // Started just as the kernel began to stop: its pipes close
            // here, and its supervisor ends it.
            return;
        }
        // An incarnation whose end was never seen (something it started
        // still holds its output): its calls fail now, not never.
        if self.servers[index].client.is_some() {
            let why = "it was started again before its output closed".into();
            self.restart(index, why, replies);
        }
        self.servers[index].incarnation = launched.incarnation;
        let tokens = self.tokens(index);
        let server = &mut self.servers[index];
        match Pipes::open(launched, &self.registry, tokens) {
            Ok(pipes) => server.pipes = Some(pipes),
            Err(err) => {
                log::error!("MCP server {}: cannot watch its pipes: {err}", server.name);
                let why = format!("its pipes cannot be watched: {err}");
                return self.restart(index, why, replies);
            }
        }
        server.new_client(Transport::Stdio, now);
        self.flush(index);
    }

    /// The tokens of server `index`'s pipes.
    fn tokens(&self, index: usize) -> Tokens {
        Tokens {
            stdout: Token(self.token_base + 2 * index),
            stdin: Token(self.token_base + 2 * index + 1),
        }
    }

    /// Reads what the server wrote into its client; its output closing
    /// is its end.
    fn read(&mut self, index: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(pipes) = self.servers[index].pipes.as_mut() else {
            return;
        };
        let received = pipes.read(&self.registry);
        let mut events = Vec::new();
        if let Some(client) = self.servers[index].client.as_mut() {
            for message in received.messages {
                client.on_message(message, now, &mut events);
            }
        }
        self.handle(index, events, replies);
        self.flush(index);
        if received.closed {
            let ending = self.servers[index].output_closed();
            let known = ending.is_some();
            let why = ending.unwrap_or_else(|| "it exited (its output closed)".to_owned());
            self.restart(index, why, replies);
            self.servers[index].awaiting_end = !known;
        }
    }

    /// Writes what the client has for the server: to its stdin, or to a
    /// remote server's threads.
    fn flush(&mut self, index: usize) {
        if self.servers[index].remote.is_some() {
            return self.post(index);
        }
        let server = &mut self.servers[index];
        if let (Some(client), Some(pipes)) = (server.client.as_mut(), server.pipes.as_mut()) {
            pipes.write(client.take_output(), &self.registry);
        }
    }
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
        server.incarnation += 1;
        let incarnation = (index, server.incarnation);
        let opened = remote.open(agent, incarnation, &self.delivered.0, &self.waker, now);
        if let Err(err) = opened {
            let why = format!("its HTTP threads cannot be started: {err}");
            log::error!("MCP server {}: {why}", server.name);
            server.error = Some(why);
            remote.failed(server.stopped);
            return;
        }
        server.new_client(Transport::Http, now);
        self.post(index);
    }

    /// Hands what the client has for remote server `index` to its threads.
    fn post(&mut self, index: usize) {
        let server = &mut self.servers[index];
        if let (Some(client), Some(remote)) = (server.client.as_mut(), server.remote.as_ref()) {
            remote.post(client);
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
