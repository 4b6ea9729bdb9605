//! `/execute`: code run in a context, answered as the code interpreter
//! answers — lines of JSON as they come (`number_of_executions`,
//! `stdout` and `stderr` with a `timestamp`, `result`, `error`,
//! `keepalive` while quiet) and `end_of_execution` last.
//!
//! The request goes to the context's process as a line on its input; its
//! answers come back as lines on its output, read through the kernel's
//! `output` follow. They are the sandbox's words, so each is read as no
//! more than what it may say: a line of at most 1 MiB, an answer of the
//! execution asked (by its random id), a file only from the context's
//! own results directory, of at most 16 MiB.

use std::collections::BTreeMap;
use std::time::SystemTime;

use agentos_http::kernel_link::Wait;
use agentos_proto::payload::{
    FileCall, FilePath, FileRead, FileReadReply, FileRemovedReply, OutputStream, Signal,
    MAX_READ_BYTES,
};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::contexts::Context;
use crate::envd::connect::ConnectError;
use crate::envd::session::{Named, Session};

/// How long a quiet execution waits before a keepalive line.
const KEEPALIVE_MS: u64 = 5_000;
/// The longest answer line taken from a context.
const MAX_LINE_BYTES: usize = 1 << 20;
/// The largest answer taken from a results file.
const MAX_RESULT_FILE_BYTES: u64 = 8 << 20;
/// A request's input is written in parts of this many bytes.
const INPUT_PART: usize = 128 << 10;

/// `/execute`'s body.
#[derive(Debug, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    pub context_id: Option<String>,
    pub language: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// The line a context reads.
#[derive(Serialize)]
struct ContextRequest<'a> {
    id: u64,
    code: &'a str,
    env: &'a BTreeMap<String, String>,
}

/// A line of the answer.
fn line(value: &impl Serialize) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

#[derive(Serialize)]
struct Typed<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    name: &'a str,
    value: &'a str,
    traceback: &'a str,
}

/// Sends `code` to `context` and streams its answers to `sender` until
/// its end; the caller holds the context's turn. A client that goes
/// interrupts the execution (SIGINT), as the code interpreter does.
pub async fn run(
    session: Session,
    context: Context,
    asked: ExecuteRequest,
    sender: mpsc::Sender<Bytes>,
) {
    let failed = |name: &str, value: &str| {
        [
            line(&ErrorLine {
                kind: "error",
                name,
                value,
                traceback: "",
            }),
            line(&Typed {
                kind: "end_of_execution",
            }),
        ]
    };
    let id = match random_id() {
        Ok(id) => id,
        Err(err) => {
            for part in failed("ExecutionError", &err.message) {
                let _ = sender.send(part).await;
            }
            return;
        }
    };
    let env = asked.env_vars.unwrap_or_default();
    let request = ContextRequest {
        id,
        code: &asked.code,
        env: &env,
    };
    let mut written = serde_json::to_vec(&request).unwrap_or_default();
    written.push(b'\n');
    // Where this execution's answers start: after all the context has
    // said so far.
    let mut after = context.offset;
    for part in written.chunks(INPUT_PART) {
        let sent = session
            .input(&Named::Pid(context.pid), STANDARD.encode(part), false)
            .await;
        if let Err(err) = sent {
            for part in failed("ContextUnavailable", &err.message) {
                let _ = sender.send(part).await;
            }
            return;
        }
    }
    let mut reader = LineReader::default();
    loop {
        let output = tokio::select! {
            output = session.output(context.pid, after, KEEPALIVE_MS) => output,
            () = sender.closed() => {
                let _ = session.signal(&Named::Pid(context.pid), Signal::SIGINT).await;
                return;
            }
        };
        let output = match output {
            Ok(output) => output,
            Err(err) => {
                for part in failed("UnexpectedEndOfExecution", &err.message) {
                    let _ = sender.send(part).await;
                }
                return;
            }
        };
        after = output.offset;
        let mut answers = Vec::new();
        for chunk in &output.chunks {
            if chunk.stream != OutputStream::Stdout {
                continue;
            }
            if let Ok(bytes) = STANDARD.decode(chunk.data.as_bytes()) {
                answers.extend(reader.push(&bytes));
            }
        }
        for answer in answers {
            match translate(&session, answer, id).await {
                Translated::Line(bytes) => {
                    if sender.send(bytes).await.is_err() {
                        let _ = session
                            .signal(&Named::Pid(context.pid), Signal::SIGINT)
                            .await;
                        return;
                    }
                }
                Translated::End => {
                    let _ = sender
                        .send(line(&Typed {
                            kind: "end_of_execution",
                        }))
                        .await;
                    return;
                }
                Translated::Skip => {}
            }
        }
        if output.ended {
            let why = "the context's process ended; it is started again on the next execution";
            for part in failed("ContextRestarting", why) {
                let _ = sender.send(part).await;
            }
            return;
        }
        if output.chunks.is_empty()
            && sender
                .send(line(&Typed { kind: "keepalive" }))
                .await
                .is_err()
        {
            let _ = session
                .signal(&Named::Pid(context.pid), Signal::SIGINT)
                .await;
            return;
        }
    }
}

/// One context answer, as the client is to see it.
enum Translated {
    Line(Bytes),
    End,
    Skip,
}

/// The answer `message` of execution `id`, as the code interpreter's
/// line; a results file is read (and removed) first.
async fn translate(session: &Session, mut message: Map<String, Value>, id: u64) -> Translated {
    if message.get("id").and_then(Value::as_u64) != Some(id) {
        return Translated::Skip;
    }
    if message.get("type").and_then(Value::as_str) == Some("file") {
        let Some(path) = message.get("path").and_then(Value::as_str) else {
            return Translated::Skip;
        };
        match read_result_file(session, path).await {
            Some(held) if held.get("id").and_then(Value::as_u64) == Some(id) => message = held,
            _ => return Translated::Skip,
        }
    }
    message.remove("id");
    let kind = message
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match kind.as_str() {
        "end" => return Translated::End,
        "count" => {
            message.insert("type".into(), Value::from("number_of_executions"));
        }
        "stdout" | "stderr" => {
            let now = DateTime::<Utc>::from(SystemTime::now());
            let stamp = now.to_rfc3339_opts(SecondsFormat::Micros, true);
            message.insert("timestamp".into(), Value::from(stamp));
        }
        "result" | "error" => {}
        _ => return Translated::Skip,
    }
    Translated::Line(line(&message))
}

/// A results file of the context's, read whole and removed; none if it
/// is not one (only a context's own results directory is read).
async fn read_result_file(session: &Session, path: &str) -> Option<Map<String, Value>> {
    let inside = path
        .strip_prefix("/tmp/.e2b-results-")
        .is_some_and(|rest| !rest.contains("..") && rest.ends_with(".json"));
    if !inside {
        return None;
    }
    let mut bytes = Vec::new();
    loop {
        let read = FileCall::Read(FileRead {
            session: session.id.clone(),
            path: path.to_owned(),
            offset: bytes.len() as u64,
            length: Some(MAX_READ_BYTES),
        });
        let read: FileReadReply = session.op(&read, Wait::AsLongAsTheKernel).await.ok()?;
        // A file larger than the bound is not read on.
        if read.size > MAX_RESULT_FILE_BYTES {
            bytes.clear();
            break;
        }
        bytes.extend(STANDARD.decode(read.data.as_bytes()).ok()?);
        if read.eof {
            break;
        }
    }
    let remove = FileCall::Remove(FilePath {
        session: session.id.clone(),
        path: path.to_owned(),
    });
    let _: Result<FileRemovedReply, ConnectError> = session.op(&remove, Wait::Quick).await;
    serde_json::from_slice(&bytes).ok()
}

/// Lines of JSON objects from a byte stream; a line past the bound is
/// dropped whole.
#[derive(Default)]
struct LineReader {
    pending: Vec<u8>,
    overlong: bool,
}

impl LineReader {
    fn push(&mut self, mut bytes: &[u8]) -> Vec<Map<String, Value>> {
        let mut lines = Vec::new();
        while let Some(end) = bytes.iter().position(|byte| *byte == b'\n') {
            if !self.overlong {
                self.pending.extend_from_slice(&bytes[..end]);
                if let Ok(message) = serde_json::from_slice(&self.pending) {
                    lines.push(message);
                }
            }
            self.pending.clear();
            self.overlong = false;
            bytes = &bytes[end + 1..];
        }
        if !self.overlong {
            self.pending.extend_from_slice(bytes);
            if self.pending.len() > MAX_LINE_BYTES {
                self.pending.clear();
                self.overlong = true;
            }
        }
        lines
    }
}

/// An execution's id: the context answers with it, so answers of an
/// execution interrupted before are not taken for this one's.
fn random_id() -> Result<u64, ConnectError> {
    let random = agentos_http::random::bytes::<8>()
        .map_err(|err| ConnectError::new("internal", format!("reading random bytes: {err}")))?;
    // JSON numbers above 2^53 lose digits in some readers.
    Ok(u64::from_le_bytes(random) >> 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_across_chunks_and_an_overlong_one_is_dropped() {
        let mut reader = LineReader::default();
        assert!(reader.push(b"{\"id\":1,").is_empty());
        let lines = reader.push(b"\"type\":\"end\"}\nnot json\n{\"a\":2}\n");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["type"], "end");
        let mut long = vec![b'x'; MAX_LINE_BYTES + 10];
        long.extend_from_slice(b"\n{\"b\":3}\n");
        let lines = reader.push(&long);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0]["b"], 3);
        assert!(random_id().unwrap() < 1 << 53);
    }
}
