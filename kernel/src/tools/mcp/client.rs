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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::jsonrpc::{self, Incoming, RpcError};
use era::Verdict;
pub use era::{Era, ACCEPTED, MODERN, PROTOCOL};
pub use listing::ToolInfo;
use listing::{Listing, Page};
pub use outcome::CallOutcome;
use params::Meta;

mod era;
mod listing;
mod outcome;
mod params;

/// How long a server on stdio has to answer `server/discover` before it is
/// taken for one of the earlier era that ignores requests it does not
/// know (bounded by the server's own timeout).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// ([`super::param_headers`]).
    pub param_headers: Vec<(String, String)>,
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
    /// Its tools, and the listing under way.
    listing: Listing,
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
        let params = params::Discover {
            meta: client.meta(),
        };
        let params = params::to_value(&params);
        client.send(
            Pending::Discover,
            "server/discover",
            params,
            None,
            now + wait,
        );
        client
    }

    fn idle(name: &str, transport: Transport, timeout: Duration) -> McpClient {
        McpClient {
            name: name.to_owned(),
            state: ServerState::Starting,
            next_id: 1,
            pending: HashMap::new(),
            listing: Listing::new(transport == Transport::Http),
            timeout,
            transport,
            era: Era::Initializing,
            output: Vec::new(),
        }
    }

    fn initialize(&mut self, now: Instant) {
        self.era = Era::Initializing;
        let params = params::to_value(&params::Initialize::offering(PROTOCOL));
        let deadline = now + self.timeout;
        self.send(Pending::Initialize, "initialize", params, None, deadline);
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
        self.listing.tools()
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
        let headers = self.listing.headers_for(tool, &arguments);
        let params = params::to_value(&params::Call {
            name: tool,
            arguments,
            meta: self.meta().traced(traceparent),
        });
        let name = Some(tool.to_owned());
        self.send(Pending::Call(call), "tools/call", params, name, deadline);
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
                    jsonrpc::response(&id, params::empty())
                } else {
                    jsonrpc::error_response(&id, -32601, "Method not found")
                };
                self.push(reply, None, None, None);
            }
            Incoming::Notification { method, .. } => {
                let changed = method == "notifications/tools/list_changed";
                if changed && self.listing.changed() && self.state == ServerState::Ready {
                    self.list(None, now);
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
                Ok(result) => match era::discovered(&self.era, &result) {
                    Verdict::Modern => {
                        self.era = Era::Modern;
                        log::debug!("MCP server {} speaks protocol {MODERN}", self.name);
                        self.ready_to_list(&result, now, events);
                    }
                    verdict => self.follow(verdict, now, events),
                },
                Err(error) => {
                    let verdict = era::discover_refused(&self.era, &error, &self.name);
                    self.follow(verdict, now, events);
                }
            },
            Pending::Initialize => match outcome {
                Ok(result) => match era::agreed(&result) {
                    Ok(version) => {
                        self.era = Era::Handshake(version);
                        self.push(
                            jsonrpc::notification("notifications/initialized", Value::Null),
                            Some("notifications/initialized"),
                            None,
                            None,
                        );
                        self.ready_to_list(&result, now, events);
                    }
                    Err(unspoken) => self.fail(unspoken.to_string(), events),
                },
                // A server that took the probe for its era refuses the
                // handshake naming its versions.
                Err(error) if error.code == era::UNSUPPORTED_PROTOCOL_VERSION => {
                    let verdict = era::unsupported_version(&self.era, &error);
                    self.follow(verdict, now, events);
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
                    Ok(result) => CallOutcome::of_result(result),
                    Err(error) => CallOutcome::Rejected(error.message),
                },
            }),
        }
    }

    /// What the server's versions lead to, when they do not lead straight
    /// to its tools: the handshake, the server failing, or — found modern
    /// after all — a listing from scratch.
    fn follow(&mut self, verdict: Verdict, now: Instant, events: &mut Vec<ClientEvent>) {
        match verdict {
            Verdict::Modern => {
                self.era = Era::Modern;
                self.listing.give_up();
                self.list(None, now);
            }
            Verdict::Initialize => self.initialize(now),
            Verdict::Fail(why) => self.fail(why, events),
        }
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
        self.listing.asking(cursor.as_deref());
        let params = params::to_value(&params::List {
            cursor,
            meta: self.meta(),
        });
        let deadline = now + self.timeout;
        self.send(Pending::List, "tools/list", params, None, deadline);
    }

    fn listed(&mut self, result: &Value, now: Instant, events: &mut Vec<ClientEvent>) {
        match self.listing.page(result, &self.name) {
            Page::Unasked => {}
            Page::Stopped(why) => self.fail(why, events),
            Page::Next(cursor) => self.list(Some(cursor), now),
            Page::Complete { tools, relist } => {
                self.state = ServerState::Ready;
                events.push(ClientEvent::ToolsListed(tools));
                if relist {
                    self.list(None, now);
                }
            }
        }
    }

    /// Sends request `method`; `name` is the tool a `tools/call` calls.
    fn send(
        &mut self,
        pending: Pending,
        method: &str,
        params: Value,
        name: Option<String>,
        deadline: Instant,
    ) {
        let id = self.next_id;
        self.next_id += 1;
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

    /// The `_meta` a request carries: 2026-07-28's, when the server is
    /// spoken to (or probed) in that revision, else none.
    fn meta(&self) -> Meta {
        Meta::of(matches!(self.era, Era::Probing | Era::Modern).then_some(MODERN))
    }

    fn tell_cancelled(&mut self, id: u64, reason: &str) {
        self.push(
            jsonrpc::notification(
                "notifications/cancelled",
                params::to_value(&params::Cancelled {
                    request_id: id,
                    reason,
                }),
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
        self.listing.give_up();
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

#[cfg(test)]
mod tests;
