//! JSON-RPC 2.0 over an MCP server's stdio: one message per line.
//!
//! What a server prints is not trusted to be well formed. A line that is
//! not a JSON-RPC message is reported as [`Incoming::Garbage`] and the
//! stream goes on; a line longer than the reader's limit is dropped as it
//! streams in — the reader's memory stays bounded whatever the server
//! prints — and reported as [`Incoming::Oversized`], with the id of the
//! response it was when its first or last bytes say so (JavaScript servers
//! write `"id"` last).

use serde_json::{json, Value};

/// How much of a dropped line's start and end is kept to find its id.
const KEPT: usize = 4096;
/// How much of a garbage line is kept for the log.
const GARBAGE_SHOWN: usize = 200;

/// A JSON-RPC error object.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// Its code.
    pub code: i64,
    /// Its message.
    pub message: String,
    /// Its data, if any.
    pub data: Option<Value>,
}

/// One message from a server.
#[derive(Clone, Debug, PartialEq)]
pub enum Incoming {
    /// The answer to one of the kernel's requests (ids are the kernel's
    /// own numbers; a response with any other id is garbage).
    Response {
        /// The request's id.
        id: u64,
        /// Its result, or its error.
        outcome: Result<Value, RpcError>,
    },
    /// A request of the server's, to be answered.
    Request {
        /// Its id, as the server gave it.
        id: Value,
        /// Its method.
        method: String,
    },
    /// A notification.
    Notification {
        /// Its method.
        method: String,
        /// Its params (null when absent).
        params: Value,
    },
    /// A line that is not a JSON-RPC message (its start).
    Garbage(String),
    /// A line over the limit, dropped.
    Oversized {
        /// The id of the response it was, if its start or end says.
        id: Option<u64>,
        /// Its length.
        bytes: usize,
    },
}

/// Splits what a server prints into messages, keeping at most `max_line`
/// bytes of any one line.
#[derive(Debug)]
pub struct LineReader {
    max_line: usize,
    line: Vec<u8>,
    /// The line being dropped: its first bytes, its last, its length.
    dropping: Option<Dropped>,
}

#[derive(Debug, Default)]
struct Dropped {
    head: Vec<u8>,
    tail: Vec<u8>,
    bytes: usize,
}

impl LineReader {
    /// A reader for lines of at most `max_line` bytes.
    pub fn new(max_line: usize) -> LineReader {
        LineReader {
            max_line,
            line: Vec::new(),
            dropping: None,
        }
    }

    /// Takes in bytes as they come; complete messages go to `out`.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Incoming>) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let (piece, rest, complete) = match end {
                Some(at) => (&bytes[..at], &bytes[at + 1..], true),
                None => (bytes, &[][..], false),
            };
            self.take_piece(piece);
            if complete {
                self.end_line(out);
            }
            bytes = rest;
        }
    }

    fn take_piece(&mut self, piece: &[u8]) {
        if self.dropping.is_none() && self.line.len() + piece.len() <= self.max_line {
            self.line.extend_from_slice(piece);
            return;
        }
        let dropped = self.dropping.get_or_insert_with(|| {
            let mut dropped = Dropped::default();
            let line = std::mem::take(&mut self.line);
            dropped.bytes = line.len();
            dropped.head = line[..line.len().min(KEPT)].to_vec();
            dropped.tail = line[line.len().saturating_sub(KEPT)..].to_vec();
            dropped
        });
        dropped.bytes += piece.len();
        let room = KEPT.saturating_sub(dropped.head.len());
        dropped
            .head
            .extend_from_slice(&piece[..room.min(piece.len())]);
        dropped.tail.extend_from_slice(piece);
        let excess = dropped.tail.len().saturating_sub(KEPT);
        dropped.tail.drain(..excess);
    }

    fn end_line(&mut self, out: &mut Vec<Incoming>) {
        if let Some(dropped) = self.dropping.take() {
            let id = response_id_in(&dropped.head).or_else(|| response_id_in(&dropped.tail));
            out.push(Incoming::Oversized {
                id,
                bytes: dropped.bytes,
            });
            return;
        }
        let line = std::mem::take(&mut self.line);
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if !text.is_empty() {
            out.push(parse(text));
        }
    }
}

/// One line as a message.
fn parse(text: &str) -> Incoming {
    let garbage = || Incoming::Garbage(text.chars().take(GARBAGE_SHOWN).collect());
    let Ok(Value::Object(message)) = serde_json::from_str::<Value>(text) else {
        return garbage();
    };
    let method = message.get("method").and_then(Value::as_str);
    let id = message.get("id").filter(|id| !id.is_null());
    match (method, id) {
        (Some(method), Some(id)) => Incoming::Request {
            id: id.clone(),
            method: method.to_owned(),
        },
        (Some(method), None) => Incoming::Notification {
            method: method.to_owned(),
            params: message.get("params").cloned().unwrap_or(Value::Null),
        },
        (None, Some(id)) => {
            let Some(id) = id.as_u64() else {
                return garbage();
            };
            let outcome = match (message.get("result"), message.get("error")) {
                (Some(result), None) => Ok(result.clone()),
                (None, Some(error)) => Err(rpc_error(error)),
                _ => return garbage(),
            };
            Incoming::Response { id, outcome }
        }
        (None, None) => garbage(),
    }
}

fn rpc_error(error: &Value) -> RpcError {
    RpcError {
        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .to_owned(),
        data: error.get("data").cloned(),
    }
}

/// The number after `"id":` in part of a line, if there is one.
fn response_id_in(bytes: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(bytes);
    let at = text.rfind("\"id\"")?;
    let rest = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A request line.
pub fn request(id: u64, method: &str, params: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

/// A notification line (no params when `params` is null).
pub fn notification(method: &str, params: Value) -> Vec<u8> {
    if params.is_null() {
        line(&json!({"jsonrpc": "2.0", "method": method}))
    } else {
        line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }
}

/// A response line to a server's request.
pub fn response(id: &Value, result: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// An error response line to a server's request.
pub fn error_response(id: &Value, code: i64, message: &str) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
}

fn line(message: &Value) -> Vec<u8> {
    // serde_json escapes newlines inside strings: one message, one line.
    let mut bytes = serde_json::to_vec(message).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(reader: &mut LineReader, bytes: &[u8]) -> Vec<Incoming> {
        let mut out = Vec::new();
        reader.push(bytes, &mut out);
        out
    }

    #[test]
    fn messages_come_apart_by_line_even_in_pieces() {
        let text = concat!(
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":\"s-1\",\"method\":\"ping\"}\r\n",
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-32602,\"message\":\"bad\"}}\n",
        );
        let mut reader = LineReader::new(1 << 20);
        let mut got = Vec::new();
        for piece in text.as_bytes().chunks(7) {
            got.extend(read(&mut reader, piece));
        }
        assert_eq!(
            got,
            vec![
                Incoming::Response {
                    id: 1,
                    outcome: Ok(json!({"ok": true}))
                },
                Incoming::Notification {
                    method: "notifications/tools/list_changed".into(),
                    params: Value::Null
                },
                Incoming::Request {
                    id: json!("s-1"),
                    method: "ping".into()
                },
                Incoming::Response {
                    id: 2,
                    outcome: Err(RpcError {
                        code: -32602,
                        message: "bad".into(),
                        data: None
                    })
                },
            ]
        );
    }

    #[test]
    fn garbage_is_named_and_the_stream_goes_on() {
        let mut reader = LineReader::new(1 << 20);
        let got = read(
            &mut reader,
            b"Starting server on stdio...\n[1, 2]\n{\"id\":\"x\",\"result\":1}\n\n{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":null}\n",
        );
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(matches!(&got[0], Incoming::Garbage(text) if text.starts_with("Starting")));
        assert!(matches!(&got[1], Incoming::Garbage(_)));
        assert!(
            matches!(&got[2], Incoming::Garbage(_)),
            "a response id the kernel never sent"
        );
        assert_eq!(
            got[3],
            Incoming::Response {
                id: 3,
                outcome: Ok(Value::Null)
            }
        );
    }

    #[test]
    fn a_line_over_the_limit_is_dropped_in_bounded_memory_and_names_its_id() {
        let mut reader = LineReader::new(1000);
        let big = "x".repeat(10 << 20);
        // A JavaScript server writes the id last.
        let line = format!("{{\"result\":{{\"text\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\":42}}\n");
        let mut got = Vec::new();
        for piece in line.as_bytes().chunks(64 << 10) {
            reader.push(piece, &mut got);
            assert!(reader.line.len() <= 1000);
            let kept = reader
                .dropping
                .as_ref()
                .map_or(0, |d| d.head.len() + d.tail.len());
            assert!(kept <= 2 * KEPT);
        }
        assert_eq!(
            got,
            vec![Incoming::Oversized {
                id: Some(42),
                bytes: line.len() - 1
            }]
        );
        // What follows is read as usual.
        assert_eq!(
            read(
                &mut reader,
                b"{\"jsonrpc\":\"2.0\",\"id\":43,\"result\":1}\n"
            ),
            vec![Incoming::Response {
                id: 43,
                outcome: Ok(json!(1))
            }]
        );
    }

    #[test]
    fn lines_written_are_one_message_each() {
        let bytes = request(
            7,
            "tools/call",
            json!({"name": "echo", "arguments": {"message": "a\nb"}}),
        );
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert!(bytes.ends_with(b"\n"));
        let mut reader = LineReader::new(1 << 20);
        let parsed = read(&mut reader, &bytes);
        assert!(matches!(&parsed[0], Incoming::Request { method, .. } if method == "tools/call"));
        assert_eq!(
            notification("notifications/initialized", Value::Null),
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        );
        let error = error_response(&json!("s-1"), -32601, "Method not found");
        assert!(String::from_utf8(error).unwrap().contains("-32601"));
        assert!(String::from_utf8(response(&json!(5), json!({})))
            .unwrap()
            .contains("\"id\":5"));
    }
}
