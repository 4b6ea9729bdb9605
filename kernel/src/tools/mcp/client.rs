//! The kernel's side of one MCP server, as a state machine without I/O:
//! messages from the server go in ([`McpClient::on_message`]), bytes for
//! its stdin come out ([`McpClient::take_output`]), time is passed in.
//!
//! The handshake offers protocol 2025-11-25 and accepts 2025-06-18;
//! anything else fails the server with a sentence saying so. Then
//! `notifications/initialized`, and `tools/list` page by page (a repeated
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

/// The protocol version offered.
pub const PROTOCOL: &str = "2025-11-25";
/// Versions accepted from a server.
pub const ACCEPTED: [&str; 2] = ["2025-11-25", "2025-06-18"];
/// `tools/list` pages read at most in one listing.
const MAX_PAGES: usize = 100;

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
    /// How long the handshake and a listing may take.
    timeout: Duration,
    output: Vec<u8>,
}

impl McpClient {
    /// A client for the server `name` that starts its handshake at once;
    /// `timeout` bounds the handshake and each `tools/list`.
    pub fn new(name: &str, timeout: Duration, now: Instant) -> McpClient {
        let mut client = McpClient {
            name: name.to_owned(),
            state: ServerState::Starting,
            next_id: 1,
            pending: HashMap::new(),
            tools: Vec::new(),
            listing: None,
            relist: false,
            timeout,
            output: Vec::new(),
        };
        let params = json!({
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "agentos", "version": env!("CARGO_PKG_VERSION")},
        });
        client.send(Pending::Initialize, "initialize", params, now + timeout);
        client
    }

    /// Where the server is.
    pub fn state(&self) -> &ServerState {
        &self.state
    }

    /// Its tools, as last listed.
    pub fn tools(&self) -> &[ToolInfo] {
        &self.tools
    }

    /// Bytes to write to the server's stdin.
    pub fn take_output(&mut self) -> Vec<u8> {
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
        let params = json!({"name": tool, "arguments": arguments});
        self.send(Pending::Call(call), "tools/call", params, deadline);
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
                self.output.extend(reply);
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
            Pending::Initialize | Pending::List => self.fail(why.to_owned(), events),
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
            Pending::Initialize => match outcome {
                Ok(result) => self.initialized(&result, now, events),
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
        self.output.extend(jsonrpc::notification(
            "notifications/initialized",
            Value::Null,
        ));
        if result.pointer("/capabilities/tools").is_none() {
            // A server without tools is ready with none.
            self.state = ServerState::Ready;
            events.push(ClientEvent::ToolsListed(0));
            return;
        }
        self.list(None, now);
    }

    fn list(&mut self, cursor: Option<String>, now: Instant) {
        let params = match &cursor {
            Some(cursor) => json!({"cursor": cursor}),
            None => json!({}),
        };
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
        self.tools = tools;
        self.state = ServerState::Ready;
        events.push(ClientEvent::ToolsListed(self.tools.len()));
        if std::mem::take(&mut self.relist) {
            self.list(None, now);
        }
    }

    fn send(&mut self, pending: Pending, method: &str, params: Value, deadline: Instant) {
        let id = self.next_id;
        self.next_id += 1;
        self.output.extend(jsonrpc::request(id, method, params));
        self.pending.insert(id, (pending, deadline));
    }

    fn tell_cancelled(&mut self, id: u64, reason: &str) {
        self.output.extend(jsonrpc::notification(
            "notifications/cancelled",
            json!({"requestId": id, "reason": reason}),
        ));
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
