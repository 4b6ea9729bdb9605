//! The kernel's side of one MCP server, as a state machine without I/O:
//! messages from the server go in ([`McpClient::on_message`]), messages
//! for it come out ([`McpClient::take_messages`], or as bytes for its
//! stdin, [`McpClient::take_output`]), time is passed in.
//!
//! A server is first asked `server/discover`, as protocol 2026-07-28 says
//! a client that speaks both eras does ([`McpClient::probing`]). A server
//! that lists 2026-07-28 among its versions is spoken to in that revision:
//! no handshake, and every request carries the protocol version and the
//! client's name in its `_meta`. A server that answers with another error
//! (or, over stdio, not at all within [`PROBE_TIMEOUT`]) is of the earlier
//! era: the `initialize` handshake follows, offering protocol 2025-11-25
//! and accepting 2025-06-18; anything else fails the server with a
//! sentence saying so. The errors 2026-07-28 defines for a request it
//! refuses (an unsupported version, a missing capability, headers that
//! do not match) are answers of a modern server: they fail it, or, for an
//! unsupported version, pick the earlier era when the server lists one the
//! kernel speaks. Then (earlier era) `notifications/initialized`, and
//! `tools/list` page by page (a repeated
//! cursor or too many pages stop the listing with an error); a
//! `notifications/tools/list_changed` lists again. The server's own
//! requests are answered: `ping` with `{}`, anything else "method not
//! found". A call past its deadline, or cancelled, is told to the server
//! (`notifications/cancelled`) and forgotten: its late reply is ignored.
//! `isError` results and JSON-RPC errors are errors to the caller; so is a
//! reply that cannot be read, at once, when its id says which call it
//! answers (a line that names none is logged and skipped: see
//! [`McpClient::on_message`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::jsonrpc::{self, Incoming, RpcError};
use super::param_headers::{self, ParamHeader};

/// The protocol version offered in the `initialize` handshake.
pub const PROTOCOL: &str = "2025-11-25";
/// Versions accepted from a server in the `initialize` handshake.
pub const ACCEPTED: [&str; 2] = ["2025-11-25", "2025-06-18"];
/// The handshake-free protocol revision, probed for first.
pub const MODERN: &str = "2026-07-28";
/// How long a server on stdio has to answer `server/discover` before it is
/// taken for one of the earlier era that ignores requests it does not
/// know (bounded by the server's own timeout).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// `tools/list` pages read at most in one listing.
const MAX_PAGES: usize = 100;
/// The `_meta` keys of a 2026-07-28 request.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CLIENT: &str = "io.modelcontextprotocol/clientInfo";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// JSON-RPC errors by which a 2026-07-28 server refuses a request: it
/// does not speak the version asked for, lacks a capability of the
/// client's, or finds the HTTP headers do not match the body.
const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
const HEADER_MISMATCH: i64 = -32020;

/// How a server is reached; it decides what a probe with no answer means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Its stdin and stdout: a server of the earlier era may ignore
    /// `server/discover`, so silence means the earlier era.
    Stdio,
    /// Streamable HTTP: every request is answered with a status, so
    /// silence means the server is not there.
    Http,
}

/// Which revision of the protocol the server is spoken to in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Era {
    /// `server/discover` is under way.
    Probing,
    /// The `initialize` handshake is under way.
    Initializing,
    /// After the `initialize` handshake, in the version it agreed.
    Handshake(String),
    /// Protocol 2026-07-28: no handshake, `_meta` on every request.
    Modern,
}

/// One message for the server, with what Streamable HTTP mirrors into its
/// headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    /// The JSON-RPC message (one line, without its newline).
    pub body: Vec<u8>,
    /// Its method (`None`: a response to the server's own request).
    pub method: Option<String>,
    /// The tool it calls, for `tools/call`.
    pub name: Option<String>,
    /// Its id and deadline, when it is a request of the kernel's (an
    /// answer is due).
    pub request: Option<(u64, Instant)>,
    /// The protocol version it is sent in (see
    /// [`McpClient::protocol_version`]), as it was when it was made.
    pub protocol_version: Option<String>,
    /// Arguments of a call mirrored into headers over HTTP
    /// ([`param_headers`]).
    pub param_headers: Vec<(String, String)>,
}

/// A tool as its server describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: Value,
    /// The JSON schema of its structured result, if it gives one.
    pub output_schema: Option<Value>,
}

/// Where the server is.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerState {
    /// The handshake has not finished.
    Starting,
    /// Its tools are known; calls go through.
    Ready,
    /// It cannot be used, and why.
    Failed(String),
}

/// Why the server takes no call now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotServing {
    /// Its handshake or first listing has not finished.
    #[error("server {server} is starting")]
    Starting {
        /// The server's name.
        server: String,
    },
    /// It cannot be used ([`ServerState::Failed`]).
    #[error("server {server} failed: {why}")]
    Failed {
        /// The server's name.
        server: String,
        /// Why it cannot be used.
        why: String,
    },
}

/// A tool call's own number, given by whoever made it.
pub type CallId = u64;

/// What a tool call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum CallOutcome {
    /// The tool's result: its content blocks and structured content.
    Done {
        /// The content blocks.
        content: Value,
        /// The structured content, if any.
        structured: Option<Value>,
    },
    /// The tool reported an error (`isError`): its text and content.
    ToolError {
        /// The text of its content blocks.
        message: String,
        /// The content blocks.
        content: Value,
    },
    /// The server answered the call with an error instead of a result: a
    /// JSON-RPC error (unknown tool, arguments that fail its schema), or a
    /// reply that cannot be read. The error's message, or what is wrong
    /// with the reply.
    Rejected(String),
    /// The call's deadline passed first.
    TimedOut(String),
    /// The call failed otherwise: the server's end, a reply over the limit.
    Failed(String),
}

/// Something the kernel should know about.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientEvent {
    /// The server is ready with this many tools (again, after a change).
    ToolsListed(usize),
    /// The server cannot be used.
    Failed(String),
    /// A call has ended.
    CallEnded {
        /// Which.
        call: CallId,
        /// How.
        outcome: CallOutcome,
    },
    /// A line the server printed that is not a message (its start).
    Garbage(String),
}

#[derive(Debug)]
enum Pending {
    Discover,
    Initialize,
    List,
    Call(CallId),
}

/// One MCP server, from the kernel's side.
#[derive(Debug)]
pub struct McpClient {
    name: String,
    state: ServerState,
    next_id: u64,
    pending: HashMap<u64, (Pending, Instant)>,
    /// Tools of the last complete listing.
    tools: Vec<ToolInfo>,
    /// A listing under way: the pages' tools so far, the cursors seen.
    listing: Option<(Vec<ToolInfo>, HashSet<String>)>,
    /// The list changed while a listing was under way.
    relist: bool,
    /// Over HTTP, the arguments each listed tool mirrors into headers.
    param_headers: HashMap<String, Vec<ParamHeader>>,
    /// How long the handshake and a listing may take.
    timeout: Duration,
    transport: Transport,
    era: Era,
    output: Vec<Outgoing>,
}

impl McpClient {
    /// A client for the server `name` that starts the `initialize`
    /// handshake at once, for servers of the earlier era only; `timeout`
    /// bounds the handshake and each `tools/list`.
    pub fn new(name: &str, timeout: Duration, now: Instant) -> McpClient {
        let mut client = McpClient::idle(name, Transport::Stdio, timeout);
        client.initialize(now);
        client
    }

    /// A client for the server `name`, reached over `transport`, that
    /// probes with `server/discover` at once and falls back to the
    /// `initialize` handshake for a server of the earlier era; `timeout`
    /// bounds the probe, the handshake and each `tools/list`.
    pub fn probing(name: &str, transport: Transport, timeout: Duration, now: Instant) -> McpClient {
        let mut client = McpClient::idle(name, transport, timeout);
        client.era = Era::Probing;
        let wait = match transport {
            Transport::Stdio => timeout.min(PROBE_TIMEOUT),
            Transport::Http => timeout,
        };
        let params = client.with_meta(json!({}));
        client.send(Pending::Discover, "server/discover", params, now + wait);
        client
    }

    fn idle(name: &str, transport: Transport, timeout: Duration) -> McpClient {
        McpClient {
            name: name.to_owned(),
            state: ServerState::Starting,
            next_id: 1,
            pending: HashMap::new(),
            tools: Vec::new(),
            listing: None,
            relist: false,
            param_headers: HashMap::new(),
            timeout,
            transport,
            era: Era::Initializing,
            output: Vec::new(),
        }
    }

    fn initialize(&mut self, now: Instant) {
        self.era = Era::Initializing;
        let params = json!({
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": client_info(),
        });
        self.send(
            Pending::Initialize,
            "initialize",
            params,
            now + self.timeout,
        );
    }

    /// The revision the server is spoken to in.
    pub fn era(&self) -> &Era {
        &self.era
    }

    /// The protocol version a request now carries (in `_meta`, and over
    /// HTTP in the `MCP-Protocol-Version` header); `None` while the
    /// `initialize` handshake is under way, which names its version in its
    /// body.
    pub fn protocol_version(&self) -> Option<&str> {
        match &self.era {
            Era::Probing | Era::Modern => Some(MODERN),
            Era::Initializing => None,
            Era::Handshake(version) => Some(version),
        }
    }

    /// Where the server is.
    pub fn state(&self) -> &ServerState {
        &self.state
    }

    /// Its tools, as last listed.
    pub fn tools(&self) -> &[ToolInfo] {
        &self.tools
    }

    /// Bytes to write to the server's stdin: the messages, a line each.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for message in self.take_messages() {
            bytes.extend(message.body);
            bytes.push(b'\n');
        }
        bytes
    }

    /// The messages for the server since the last look.
    pub fn take_messages(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.output)
    }

    /// The earliest deadline of a request under way.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|(_, deadline)| *deadline).min()
    }

    /// Calls `tool` with `arguments`; the outcome comes as an event, by
    /// `deadline` at the latest.
    pub fn call(
        &mut self,
        call: CallId,
        tool: &str,
        arguments: Value,
        deadline: Instant,
        traceparent: Option<&str>,
    ) -> Result<(), NotServing> {
        match &self.state {
            ServerState::Ready => {}
            ServerState::Starting => {
                return Err(NotServing::Starting {
                    server: self.name.clone(),
                })
            }
            ServerState::Failed(why) => {
                return Err(NotServing::Failed {
                    server: self.name.clone(),
                    why: why.clone(),
                })
            }
        }
        let headers = match self.param_headers.get(tool) {
            Some(annotated) => param_headers::for_call(annotated, &arguments),
            None => Vec::new(),
        };
        let mut params = self.with_meta(json!({"name": tool, "arguments": arguments}));
        if let Some(traceparent) = traceparent {
            if !params["_meta"].is_object() {
                params["_meta"] = json!({});
            }
            params["_meta"]["traceparent"] = traceparent.into();
        }
        self.send(Pending::Call(call), "tools/call", params, deadline);
        if let Some(message) = self.output.last_mut() {
            message.param_headers = headers;
        }
        Ok(())
    }

    /// Gives up on a call: the server is told, and its reply ignored.
    pub fn cancel(&mut self, call: CallId, reason: &str) {
        let id = self
            .pending
            .iter()
            .find(|(_, (p, _))| matches!(p, Pending::Call(c) if *c == call))
            .map(|(id, _)| *id);
        if let Some(id) = id {
            self.pending.remove(&id);
            self.tell_cancelled(id, reason);
        }
    }

    /// The exchange that carried request `id` broke before its answer
    /// (over HTTP): a call fails with `why`; the probe, handshake or a
    /// listing fails the server.
    pub fn lost(&mut self, id: u64, why: &str, events: &mut Vec<ClientEvent>) {
        self.unreadable_reply(Some(id), why, CallOutcome::Failed, events);
    }

    /// The server has ended (or its output closed): everything under way
    /// fails with `why`.
    pub fn ended(&mut self, why: &str, events: &mut Vec<ClientEvent>) {
        self.fail_all(why, events);
        self.fail(why.to_owned(), events);
    }

    /// A message from the server.
    pub fn on_message(&mut self, message: Incoming, now: Instant, events: &mut Vec<ClientEvent>) {
        match message {
            Incoming::Response { id, outcome } => {
                // A reply to something given up on is ignored.
                if let Some((pending, _)) = self.pending.remove(&id) {
                    self.answered(pending, outcome, now, events);
                }
            }
            Incoming::Request { id, method } => {
                let reply = if method == "ping" {
                    jsonrpc::response(&id, json!({}))
                } else {
                    jsonrpc::error_response(&id, -32601, "Method not found")
                };
                self.push(reply, None, None, None);
            }
            Incoming::Notification { method, .. } => {
                if method == "notifications/tools/list_changed" {
                    // A listing under way may have missed the change.
                    if self.listing.is_some() {
                        self.relist = true;
                    } else if self.state == ServerState::Ready {
                        self.list(None, now);
                    }
                }
            }
            // A line that names no request is not pinned on one, not even
            // on the only call under way, and does not restart the server:
            // servers print log lines (broken JSON too) between their
            // messages, a guess would fail a call whose answer follows and
            // make a call's outcome hang on what else is under way, and a
            // restart would fail every call for one stray line. A call
            // whose answer is such a line ends at its deadline, like one
            // never answered.
            Incoming::Garbage(text) => events.push(ClientEvent::Garbage(text)),
            Incoming::Malformed { id, why } => {
                // The server is up and answered, wrongly: the call's error
                // is its answer (`Rejected`), not the server being gone.
                let why = format!("the server's reply was malformed: {why}");
                if !self.unreadable_reply(Some(id), &why, CallOutcome::Rejected, events) {
                    events.push(ClientEvent::Garbage(format!(
                        "{why} (to request {id}, no longer awaited)"
                    )));
                }
            }
            Incoming::Oversized { id, bytes } => {
                // Perhaps a good answer, but more than the kernel takes.
                let why = format!("the server's reply was {bytes} bytes, over the limit");
                if !self.unreadable_reply(id, &why, CallOutcome::Failed, events) {
                    events.push(ClientEvent::Garbage(format!(
                        "a message of {bytes} bytes, over the limit, was dropped"
                    )));
                }
            }
        }
    }

    /// A reply that cannot be read ends the request `id` names, if it is
    /// awaited: a call with `outcome` of `why`; the handshake or a listing
    /// by failing the server, as any answer to them that makes no sense
    /// does. Whether it was awaited.
    fn unreadable_reply(
        &mut self,
        id: Option<u64>,
        why: &str,
        outcome: fn(String) -> CallOutcome,
        events: &mut Vec<ClientEvent>,
    ) -> bool {
        let Some((pending, _)) = id.and_then(|id| self.pending.remove(&id)) else {
            return false;
        };
        match pending {
            Pending::Call(call) => events.push(ClientEvent::CallEnded {
                call,
                outcome: outcome(why.to_owned()),
            }),
            Pending::Discover | Pending::Initialize | Pending::List => {
                self.fail(why.to_owned(), events)
            }
        }
        true
    }

    /// Requests past their deadline fail; calls are told to the server as
    /// cancelled.
    pub fn on_deadlines(&mut self, now: Instant, events: &mut Vec<ClientEvent>) {
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some((pending, _)) = self.pending.remove(&id) else {
                continue;
            };
            match pending {
                Pending::Call(call) => {
                    self.tell_cancelled(id, "timeout");
                    events.push(ClientEvent::CallEnded {
                        call,
                        outcome: CallOutcome::TimedOut(format!(
                            "server {} did not answer within the call's deadline",
                            self.name
                        )),
                    });
                }
                Pending::Discover if self.transport == Transport::Stdio => {
                    // A server of the earlier era may ignore a request it
                    // does not know: the handshake is its language.
                    log::debug!(
                        "MCP server {} did not answer server/discover; trying initialize",
                        self.name
                    );
                    self.initialize(now);
                }
                Pending::Discover => {
                    let why = format!(
                        "did not answer server/discover within {} ms",
                        self.timeout.as_millis()
                    );
                    self.fail(why, events);
                }
                Pending::Initialize => {
                    let why = format!(
                        "did not answer initialize within {} ms",
                        self.timeout.as_millis()
                    );
                    self.fail(why, events);
                }
                Pending::List => {
                    let why = format!(
                        "did not answer tools/list within {} ms",
                        self.timeout.as_millis()
                    );
                    self.fail(why, events);
                }
            }
        }
    }

    fn answered(
        &mut self,
        pending: Pending,
        outcome: Result<Value, RpcError>,
        now: Instant,
        events: &mut Vec<ClientEvent>,
    ) {
        match pending {
            Pending::Discover => match outcome {
                Ok(result) => self.discovered(&result, now, events),
                Err(error) => self.discover_refused(&error, now, events),
            },
            Pending::Initialize => match outcome {
                Ok(result) => self.initialized(&result, now, events),
                // A server that took the probe for its era refuses the
                // handshake naming its versions.
                Err(error) if error.code == UNSUPPORTED_PROTOCOL_VERSION => {
                    self.unsupported_version(&error, now, events)
                }
                Err(error) => self.fail(format!("initialize failed: {}", error.message), events),
            },
            Pending::List => match outcome {
                Ok(result) => self.listed(&result, now, events),
                Err(error) => self.fail(format!("tools/list failed: {}", error.message), events),
            },
            Pending::Call(call) => events.push(ClientEvent::CallEnded {
                call,
                outcome: match outcome {
                    Ok(result) => call_outcome(result),
                    Err(error) => CallOutcome::Rejected(error.message),
                },
            }),
        }
    }

    /// A `DiscoverResult`: the server speaks 2026-07-28, or names the
    /// versions it does speak.
    fn discovered(&mut self, result: &Value, now: Instant, events: &mut Vec<ClientEvent>) {
        let versions = string_list(result.get("supportedVersions"));
        if versions.iter().any(|v| v == MODERN) {
            self.era = Era::Modern;
            log::debug!("MCP server {} speaks protocol {MODERN}", self.name);
            return self.ready_to_list(result, now, events);
        }
        self.pick_handshake(&versions, now, events);
    }

    /// An error to the probe: one of 2026-07-28's own refusals is a modern
    /// server's answer; any other error is the earlier era's way of saying
    /// it does not know the method.
    fn discover_refused(&mut self, error: &RpcError, now: Instant, events: &mut Vec<ClientEvent>) {
        match error.code {
            UNSUPPORTED_PROTOCOL_VERSION => self.unsupported_version(error, now, events),
            MISSING_REQUIRED_CLIENT_CAPABILITY | HEADER_MISMATCH => {
                let why = format!("server/discover was refused: {}", error.message);
                self.fail(why, events);
            }
            _ => {
                log::debug!(
                    "MCP server {} does not know server/discover ({}); trying initialize",
                    self.name,
                    error.message
                );
                self.initialize(now);
            }
        }
    }

    /// The server does not speak the version asked for; its error lists
    /// those it does.
    fn unsupported_version(
        &mut self,
        error: &RpcError,
        now: Instant,
        events: &mut Vec<ClientEvent>,
    ) {
        let versions = string_list(error.data.as_ref().and_then(|d| d.get("supported")));
        if versions.iter().any(|v| v == MODERN) && self.era != Era::Probing {
            // It speaks 2026-07-28 after all: it took a probe it answered
            // too late for its era, or refuses the handshake outright.
            self.era = Era::Modern;
            return self.relist_from_scratch(now);
        }
        self.pick_handshake(&versions, now, events);
    }

    /// The handshake, if the server lists a version of it the kernel
    /// speaks; otherwise the server fails, saying which it lists.
    fn pick_handshake(&mut self, versions: &[String], now: Instant, events: &mut Vec<ClientEvent>) {
        if self.era == Era::Probing && versions.iter().any(|v| ACCEPTED.contains(&v.as_str())) {
            return self.initialize(now);
        }
        let listed = if versions.is_empty() {
            "(none)".to_owned()
        } else {
            versions.join(", ")
        };
        let why = format!(
            "speaks MCP protocol {listed}; the kernel speaks {MODERN}, {}",
            ACCEPTED.join(" and ")
        );
        self.fail(why, events);
    }

    /// Lists the tools of a server found modern after all.
    fn relist_from_scratch(&mut self, now: Instant) {
        self.listing = None;
        self.list(None, now);
    }

    fn initialized(&mut self, result: &Value, now: Instant, events: &mut Vec<ClientEvent>) {
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("(none)");
        if !ACCEPTED.contains(&version) {
            let why = format!(
                "speaks MCP protocol {version}; the kernel speaks {}",
                ACCEPTED.join(" and ")
            );
            return self.fail(why, events);
        }
        self.era = Era::Handshake(version.to_owned());
        self.push(
            jsonrpc::notification("notifications/initialized", Value::Null),
            Some("notifications/initialized"),
            None,
            None,
        );
        self.ready_to_list(result, now, events);
    }

    /// After the handshake or the probe: the tools are listed, if the
    /// server has any.
    fn ready_to_list(&mut self, result: &Value, now: Instant, events: &mut Vec<ClientEvent>) {
        if result.pointer("/capabilities/tools").is_none() {
            // A server without tools is ready with none.
            self.state = ServerState::Ready;
            events.push(ClientEvent::ToolsListed(0));
            return;
        }
        self.list(None, now);
    }

    fn list(&mut self, cursor: Option<String>, now: Instant) {
        let params = self.with_meta(match &cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        });
        let listing = self
            .listing
            .get_or_insert_with(|| (Vec::new(), HashSet::new()));
        if let Some(cursor) = cursor {
            listing.1.insert(cursor);
        }
        self.send(Pending::List, "tools/list", params, now + self.timeout);
    }

    fn listed(&mut self, result: &Value, now: Instant, events: &mut Vec<ClientEvent>) {
        let Some((mut tools, cursors)) = self.listing.take() else {
            return;
        };
        let page = result.get("tools").and_then(Value::as_array);
        tools.extend(page.into_iter().flatten().filter_map(tool_info));
        let next = result.get("nextCursor").and_then(Value::as_str);
        if let Some(next) = next {
            if cursors.contains(next) {
                let why = format!("tools/list repeated the cursor {next:?}; listing stopped");
                return self.fail(why, events);
            }
            if cursors.len() + 1 >= MAX_PAGES {
                let why = format!("tools/list gave more than {MAX_PAGES} pages; listing stopped");
                return self.fail(why, events);
            }
            self.listing = Some((tools, cursors));
            return self.list(Some(next.to_owned()), now);
        }
        self.tools = self.with_param_headers(tools);
        self.state = ServerState::Ready;
        events.push(ClientEvent::ToolsListed(self.tools.len()));
        if std::mem::take(&mut self.relist) {
            self.list(None, now);
        }
    }

    /// Over HTTP, the tools listed, less those whose `x-mcp-header`
    /// annotations are invalid (which the specification says a client
    /// must leave out); their annotated arguments are noted.
    fn with_param_headers(&mut self, tools: Vec<ToolInfo>) -> Vec<ToolInfo> {
        self.param_headers.clear();
        if self.transport != Transport::Http {
            return tools;
        }
        let mut kept = Vec::with_capacity(tools.len());
        for tool in tools {
            match param_headers::of_schema(&tool.input_schema) {
                Ok(annotated) => {
                    if !annotated.is_empty() {
                        self.param_headers.insert(tool.name.clone(), annotated);
                    }
                    kept.push(tool);
                }
                Err(why) => log::warn!(
                    "MCP server {}: tool {:?} left out: {why}",
                    self.name,
                    tool.name
                ),
            }
        }
        kept
    }

    fn send(&mut self, pending: Pending, method: &str, params: Value, deadline: Instant) {
        let id = self.next_id;
        self.next_id += 1;
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let name = name.filter(|_| method == "tools/call");
        self.push(
            jsonrpc::request(id, method, params),
            Some(method),
            name,
            Some((id, deadline)),
        );
        self.pending.insert(id, (pending, deadline));
    }

    fn push(
        &mut self,
        mut line: Vec<u8>,
        method: Option<&str>,
        name: Option<String>,
        request: Option<(u64, Instant)>,
    ) {
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let protocol_version = self.protocol_version().map(str::to_owned);
        self.output.push(Outgoing {
            body: line,
            method: method.map(str::to_owned),
            name,
            request,
            protocol_version,
            param_headers: Vec::new(),
        });
    }

    /// `params` with the `_meta` a 2026-07-28 request carries, when the
    /// server is spoken to (or probed) in that revision.
    fn with_meta(&self, mut params: Value) -> Value {
        if matches!(self.era, Era::Probing | Era::Modern) {
            params["_meta"] = json!({
                META_VERSION: MODERN,
                META_CLIENT: client_info(),
                META_CAPABILITIES: {},
            });
        }
        params
    }

    fn tell_cancelled(&mut self, id: u64, reason: &str) {
        self.push(
            jsonrpc::notification(
                "notifications/cancelled",
                json!({"requestId": id, "reason": reason}),
            ),
            Some("notifications/cancelled"),
            None,
            None,
        );
    }

    fn fail(&mut self, why: String, events: &mut Vec<ClientEvent>) {
        if matches!(self.state, ServerState::Failed(_)) {
            return;
        }
        log::debug!("MCP server {}: {why}", self.name);
        self.listing = None;
        self.state = ServerState::Failed(why.clone());
        self.fail_all(&why, events);
        events.push(ClientEvent::Failed(why));
    }

    fn fail_all(&mut self, why: &str, events: &mut Vec<ClientEvent>) {
        for (_, (pending, _)) in self.pending.drain() {
            if let Pending::Call(call) = pending {
                events.push(ClientEvent::CallEnded {
                    call,
                    outcome: CallOutcome::Failed(format!("server {}: {why}", self.name)),
                });
            }
        }
    }
}

/// Who the kernel is, to a server.
fn client_info() -> Value {
    json!({"name": "agentos", "version": env!("CARGO_PKG_VERSION")})
}

/// The strings of a JSON array (none when it is not one).
fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// A `tools/list` entry, if it has a name.
fn tool_info(tool: &Value) -> Option<ToolInfo> {
    Some(ToolInfo {
        name: tool.get("name")?.as_str()?.to_owned(),
        description: tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        input_schema: tool
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"})),
        output_schema: tool.get("outputSchema").cloned(),
    })
}

/// A `tools/call` result as an outcome.
fn call_outcome(result: Value) -> CallOutcome {
    // 2026-07-28: a result that is not complete asks the client for input
    // (an elicitation, a sampling) the kernel has no one to ask for.
    let kind = result.get("resultType").and_then(Value::as_str);
    if let Some(kind) = kind.filter(|kind| *kind != "complete") {
        return CallOutcome::Rejected(format!(
            "the tool answered with a {kind:?} result (it asks for input the kernel cannot \
             give); only complete results are taken"
        ));
    }
    let content = result.get("content").cloned().unwrap_or_else(|| json!([]));
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let message = content
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n");
        return CallOutcome::ToolError { message, content };
    }
    CallOutcome::Done {
        structured: result.get("structuredContent").cloned(),
        content,
    }
}

#[cfg(test)]
mod tests;
