//! JSON-RPC 2.0 over an MCP server's stdio: one message per line.
//!
//! What a server prints is not trusted to be well formed. A line that is
//! not a JSON-RPC message is reported as [`Incoming::Garbage`] and the
//! stream goes on; a line longer than the reader's limit is dropped as it
//! streams in — the reader's memory stays bounded whatever the server
//! prints — and reported as [`Incoming::Oversized`], with the id of the
//! response it was when its first or last bytes say so (JavaScript servers
//! write `"id"` last).
//!
//! A line that is meant as a response but cannot be read as one — not
//! JSON (a raw control byte in a string, nesting past the parser's limit,
//! a line cut short), or without exactly one of `result` and `error` — is
//! reported as [`Incoming::Malformed`] with the reason, when the id of its
//! outermost object can still be read by a plain scan of its bytes; a line
//! that names no id is garbage like any other.

use serde::Serialize;
use serde_json::error::Category;
use serde_json::Value;

/// How much of a dropped line's start and end is kept to find its id.
const KEPT: usize = 4096;
/// How much of a garbage line is kept for the log.
const GARBAGE_SHOWN: usize = 200;
/// How deep serde_json nests before it gives up (its recursion limit).
const MAX_DEPTH: usize = 128;

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
    /// A response that cannot be read: its id, and why (in the kernel's
    /// words, never the server's text).
    Malformed {
        /// The id its outermost object gives.
        id: u64,
        /// What is wrong with it.
        why: String,
    },
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

/// One message, as one line of stdio or one HTTP body or event carries
/// it.
pub fn parse(text: &str) -> Incoming {
    let garbage = || Incoming::Garbage(text.chars().take(GARBAGE_SHOWN).collect());
    let message = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(message)) => message,
        Ok(_) => return garbage(),
        Err(error) => {
            return match response_id_of(text) {
                Some(id) => Incoming::Malformed {
                    id,
                    why: unreadable(text, &error),
                },
                None => garbage(),
            }
        }
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
                (Some(_), Some(_)) => {
                    let why = "it has both a result and an error".to_owned();
                    return Incoming::Malformed { id, why };
                }
                (None, None) => {
                    let why = "it has neither a result nor an error".to_owned();
                    return Incoming::Malformed { id, why };
                }
            };
            Incoming::Response { id, outcome }
        }
        (None, None) => garbage(),
    }
}

/// A JSON-RPC error object as the kernel reads it.
pub fn rpc_error(error: &Value) -> RpcError {
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

/// Why `text` is not JSON, from the parser's `error`: its own words (which
/// hold no text of the server's), plainer for the faults a server is
/// likely to make.
fn unreadable(text: &str, error: &serde_json::Error) -> String {
    let said = error.to_string();
    // serde_json names these only in its message.
    if said.starts_with("recursion limit exceeded") {
        return format!("it is nested deeper than {MAX_DEPTH} levels");
    }
    if said.starts_with("control character") {
        // The column is the 1-based byte offset of the byte at fault (one
        // line: the reader split at newlines).
        let at = error.column().checked_sub(1);
        return match at.and_then(|at| text.as_bytes().get(at)) {
            Some(0) => "it holds a raw NUL byte inside a string".to_owned(),
            Some(byte) => format!("it holds a raw control byte (0x{byte:02x}) inside a string"),
            None => "it holds a raw control byte inside a string".to_owned(),
        };
    }
    match error.classify() {
        Category::Eof => "it ends in the middle of the message".to_owned(),
        _ => format!("it is not JSON ({said})"),
    }
}

/// The id of a response on a line that does not parse: the number after
/// the `"id"` key of the line's outermost object, found by a scan of its
/// bytes that keeps track of strings and nesting (so an `"id"` inside a
/// value is not taken, and what broke the parser — depth, a control byte,
/// a cut — does not hide it). A line with a `"method"` key is the server's
/// own request or notification, whose `"id"` is not the kernel's: none.
/// So is an object with two ids, or one that is not a number.
fn response_id_of(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'{') {
        return None;
    }
    let mut id = None;
    let mut depth = 0usize;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                let Some(end) = string_end(bytes, at) else {
                    // Cut inside a string: what came before is all there is.
                    break;
                };
                let after = skip_space(bytes, end + 1);
                if depth == 1 && bytes.get(after) == Some(&b':') {
                    match &bytes[at + 1..end] {
                        b"method" => return None,
                        b"id" if id.is_none() => id = Some(number_at(bytes, after + 1)?),
                        b"id" => return None,
                        _ => {}
                    }
                }
                at = end + 1;
            }
            b'{' | b'[' => {
                depth += 1;
                at += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
                at += 1;
            }
            _ => at += 1,
        }
    }
    id
}

/// Where the string that opens at `open` closes (its closing quote).
fn string_end(bytes: &[u8], open: usize) -> Option<usize> {
    let mut at = open + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'"' => return Some(at),
            _ => at += 1,
        }
    }
    None
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// The whole number that starts at `at` (after spaces), if one does and
/// nothing but a delimiter follows it (`5.0` or `5e3` are not ids the
/// kernel sent).
fn number_at(bytes: &[u8], at: usize) -> Option<u64> {
    let start = skip_space(bytes, at);
    let digits = bytes
        .get(start..)?
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let end = start + digits;
    let ends_well = matches!(bytes.get(end), None | Some(b',' | b'}'))
        || bytes.get(end).is_some_and(u8::is_ascii_whitespace);
    if digits == 0 || !ends_well {
        return None;
    }
    std::str::from_utf8(&bytes[start..end]).ok()?.parse().ok()
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
    line(&Outgoing {
        id: Some(&Value::from(id)),
        method: Some(method),
        params: Some(params),
        ..Outgoing::default()
    })
}

/// A notification line (no params when `params` is null).
pub fn notification(method: &str, params: Value) -> Vec<u8> {
    line(&Outgoing {
        method: Some(method),
        params: Some(params).filter(|p| !p.is_null()),
        ..Outgoing::default()
    })
}

/// A response line to a server's request.
pub fn response(id: &Value, result: Value) -> Vec<u8> {
    line(&Outgoing {
        id: Some(id),
        result: Some(result),
        ..Outgoing::default()
    })
}

/// An error response line to a server's request.
pub fn error_response(id: &Value, code: i64, message: &str) -> Vec<u8> {
    line(&Outgoing {
        id: Some(id),
        error: Some(OutgoingError { code, message }),
        ..Outgoing::default()
    })
}

/// A message the kernel sends a server: a request, a notification or a
/// response, by which fields it has.
#[derive(Default, Serialize)]
struct Outgoing<'a> {
    jsonrpc: Version,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<OutgoingError<'a>>,
}

/// `"2.0"`, the only JSON-RPC version there is.
#[derive(Default)]
struct Version;

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("2.0")
    }
}

#[derive(Serialize)]
struct OutgoingError<'a> {
    code: i64,
    message: &'a str,
}

fn line<T: Serialize>(message: &T) -> Vec<u8> {
    // serde_json escapes newlines inside strings: one message, one line.
    let mut bytes = serde_json::to_vec(message).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn an_unreadable_response_names_its_id_and_the_fault() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let malformed = |id: u64, why: &str| Incoming::Malformed {
            id,
            why: why.to_owned(),
        };
        let cases = [
            (
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"text\":\"a\0b\"}}".to_owned(),
                malformed(1, "it holds a raw NUL byte inside a string"),
            ),
            (
                "{\"id\": 2 ,\"result\":\"\u{1b}[0m\"}".to_owned(),
                malformed(2, "it holds a raw control byte (0x1b) inside a string"),
            ),
            // The id last, past the depth the parser stops at; the ids of
            // inner objects, and "id" inside strings, are not the message's.
            (
                format!(
                    "{{\"result\":{{\"id\":7,\"t\":\"\\\"id\\\":8,\",\"d\":{deep}}},\"id\":3}}"
                ),
                malformed(3, "it is nested deeper than 128 levels"),
            ),
            (
                "{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{\"content\":[".to_owned(),
                malformed(4, "it ends in the middle of the message"),
            ),
            (
                "{\"id\":5}".to_owned(),
                malformed(5, "it has neither a result nor an error"),
            ),
            (
                "{\"id\":6,\"result\":1,\"error\":{}}".to_owned(),
                malformed(6, "it has both a result and an error"),
            ),
        ];
        for (line, expected) in cases {
            let mut reader = LineReader::new(1 << 20);
            assert_eq!(
                read(&mut reader, format!("{line}\n").as_bytes()),
                [expected]
            );
        }
        // No id of the kernel's to be read: garbage.
        for line in [
            "{\"broken\": ",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\0\"}",
            "{\"method\":\"notifications/message\",\"params\":{\"id\":1,\"x\":\"\0\"}}",
            "{\"id\":\"s-1\",\"result\":\"\0\"}",
            "{\"id\":1.5,\"result\":\"\0\"}",
            "{\"id\":1,\"id\":2,\"result\":\"\0\"}",
            "{\"text\":\"\\\"id\\\":1\0\"}",
            "[{\"id\":1,\"result\":\"\0\"}]",
        ] {
            let mut reader = LineReader::new(1 << 20);
            let got = read(&mut reader, format!("{line}\n").as_bytes());
            assert!(
                matches!(&got[..], [Incoming::Garbage(_)]),
                "{line:?}: {got:?}"
            );
        }
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
