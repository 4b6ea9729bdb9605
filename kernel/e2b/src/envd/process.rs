//! envd's `process.Process` service over the kernel's processes in a
//! session: Start and Connect stream a process's output as it comes (the
//! kernel's `output` follows), List, SendInput, StreamInput, CloseStdin,
//! SendSignal and Update are one kernel op each.
//!
//! A process belongs to the sandbox, not to the request: a client that
//! goes leaves it running, as envd does. Start's `Connect-Timeout-Ms` is
//! the process's own timeout, as it is in envd.

use std::collections::BTreeMap;

use agentos_http::Body;
use agentos_http::RequestBody;
use agentos_proto::payload::{
    OutputStream, ProcEnd, ProcStart, ProcState, ProcessInfo, PtySize, Signal, MAX_PROC_TIMEOUT_MS,
};
use http::{HeaderMap, Response};
use serde::{Deserialize, Serialize};

use super::connect::{stream, unary, ConnectError, EnvelopeReader, StreamSender};
use super::session::{Named, Session};

/// The home the SDKs assume; a relative `cwd` or `~` is under it.
pub const HOME: &str = "/home/user";

/// How long a follow waits for output before a keepalive is sent, when
/// the client names no `Keepalive-Ping-Interval` (envd's default).
const DEFAULT_KEEPALIVE_SECS: u64 = 90;
/// The longest a kernel follow may wait.
const MAX_FOLLOW_MS: u64 = 60_000;

#[derive(Debug, Deserialize)]
pub struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct PtyConfig {
    size: Option<PtyCells>,
}

#[derive(Debug, Default, Deserialize)]
struct PtyCells {
    #[serde(default)]
    cols: u32,
    #[serde(default)]
    rows: u32,
}

#[derive(Debug, Deserialize)]
pub struct StartRequest {
    process: ProcessConfig,
    pty: Option<PtyConfig>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// `{"pid": N}` or `{"tag": "..."}`.
#[derive(Debug, Default, Deserialize)]
pub struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn named(self) -> Result<Named, ConnectError> {
        match (self.pid, self.tag) {
            (Some(pid), None) => Ok(Named::Pid(pid)),
            (None, Some(tag)) => Ok(Named::Tag(tag)),
            _ => Err(ConnectError::invalid("name the process by pid or by tag")),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct Selected {
    #[serde(default)]
    process: Selector,
}

/// `{"stdin": base64}` or `{"pty": base64}`.
#[derive(Debug, Default, Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

impl Input {
    fn data(self) -> String {
        self.stdin.or(self.pty).unwrap_or_default()
    }
}

#[derive(Debug, Deserialize)]
pub struct SendInputRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Input,
}

#[derive(Debug, Deserialize)]
pub struct SendSignalRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: serde_json::Value,
}

#[derive(Debug, Deserialize)]
pub struct UpdateRequest {
    #[serde(default)]
    process: Selector,
    pty: Option<PtyConfig>,
}

/// StreamInput's messages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StreamInputMessage {
    Start(Selected),
    Data {
        #[serde(default)]
        input: Input,
    },
    Keepalive(serde::de::IgnoredAny),
}

/// An empty message: what most calls answer.
#[derive(Debug, Serialize)]
pub struct Empty {}

/// A process event, in a Start or Connect stream.
#[derive(Debug, Serialize)]
struct EventMessage<'a> {
    event: Event<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Event<'a> {
    Start { pid: u32 },
    Data(Data<'a>),
    End(EndEvent),
    Keepalive {},
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Data<'a> {
    Stdout(&'a str),
    Stderr(&'a str),
    Pty(&'a str),
}

#[derive(Debug, Serialize)]
struct EndEvent {
    #[serde(rename = "exitCode", skip_serializing_if = "is_zero")]
    exit_code: i32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    exited: bool,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn is_zero(code: &i32) -> bool {
    *code == 0
}

impl EndEvent {
    /// How the process ended, as Go's `ProcessState` words it.
    fn of(end: &ProcEnd) -> EndEvent {
        let (exit_code, exited, status) = match (end.exit_code, end.signal) {
            (Some(code), _) => (code, true, format!("exit status {code}")),
            (None, Some(signal)) => (-1, false, format!("signal: {}", signal_name(signal))),
            (None, None) => (
                -1,
                false,
                end.reason.clone().unwrap_or_else(|| "ended".to_owned()),
            ),
        };
        let error = (exit_code != 0).then(|| status.clone());
        EndEvent {
            exit_code,
            exited,
            status,
            error,
        }
    }
}

/// A signal's name as Go prints it.
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGKILL => "killed".to_owned(),
        libc::SIGTERM => "terminated".to_owned(),
        libc::SIGINT => "interrupt".to_owned(),
        libc::SIGHUP => "hangup".to_owned(),
        libc::SIGQUIT => "quit".to_owned(),
        libc::SIGSEGV => "segmentation fault".to_owned(),
        libc::SIGABRT => "aborted".to_owned(),
        libc::SIGPIPE => "broken pipe".to_owned(),
        other => format!("signal {other}"),
    }
}

/// `path` as the SDKs mean it: `~` and relative paths are under the
/// home.
pub fn resolve(path: &str) -> String {
    if path == "~" || path.is_empty() {
        return HOME.to_owned();
    }
    if let Some(rest) = path.strip_prefix("~/") {
        return format!("{HOME}/{rest}");
    }
    if path.starts_with('/') {
        return path.to_owned();
    }
    format!("{HOME}/{path}")
}

/// The wait a follow is given: the client's keepalive interval.
pub fn follow_wait_ms(headers: &HeaderMap) -> u64 {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .filter(|secs| *secs > 0)
        .unwrap_or(DEFAULT_KEEPALIVE_SECS);
    secs.saturating_mul(1000).min(MAX_FOLLOW_MS)
}

/// `Connect-Timeout-Ms` as a process's timeout: none when absent or 0,
/// at most the kernel's day.
fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("connect-timeout-ms")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| ms.min(MAX_PROC_TIMEOUT_MS))
}

/// A PTY's size as the kernel takes it.
fn pty_size(pty: PtyConfig) -> Result<PtySize, ConnectError> {
    let cells = pty.size.unwrap_or_default();
    let side = |cells: u32| u16::try_from(cells).ok().filter(|cells| *cells > 0);
    match (side(cells.cols), side(cells.rows)) {
        (Some(cols), Some(rows)) => Ok(PtySize { cols, rows }),
        _ => Err(ConnectError::invalid(format!(
            "pty size {}x{}: give columns and rows",
            cells.cols, cells.rows
        ))),
    }
}

/// `Start`: the process started, then its output as a stream.
pub async fn start(session: Session, headers: &HeaderMap, asked: StartRequest) -> Response<Body> {
    let pty = match asked.pty.map(pty_size).transpose() {
        Ok(pty) => pty,
        Err(err) => return super::connect::stream_error(err),
    };
    let mut argv = vec![asked.process.cmd];
    argv.extend(asked.process.args);
    let start = ProcStart {
        session: String::new(),
        argv,
        env: asked.process.envs,
        cwd: asked.process.cwd.as_deref().map(resolve),
        stdin: pty.is_none() && asked.stdin.unwrap_or(true),
        pty,
        tag: asked.tag,
        timeout_ms: timeout_ms(headers),
    };
    let started = match session.start(start).await {
        Ok(started) => started,
        Err(err) => return super::connect::stream_error(err),
    };
    let wait_ms = follow_wait_ms(headers);
    let (sender, response) = stream();
    tokio::spawn(follow(session, sender, started.pid, 0, wait_ms));
    response
}

/// `Connect`: a process's output from now on, or, if it has ended, its
/// start and end.
pub async fn connect(session: Session, headers: &HeaderMap, asked: Selected) -> Response<Body> {
    let found = match asked.process.named() {
        Ok(named) => session.process(&named).await,
        Err(err) => Err(err),
    };
    let process = match found {
        Ok(process) => process,
        Err(err) => return super::connect::stream_error(err),
    };
    let wait_ms = follow_wait_ms(headers);
    let (sender, response) = stream();
    tokio::spawn(follow(
        session,
        sender,
        process.pid,
        process.offset,
        wait_ms,
    ));
    response
}

/// Streams `pid`'s start, its output from `after`, keepalives while it
/// is quiet, and its end; stops early, leaving it running, once the
/// client goes.
async fn follow(session: Session, sender: StreamSender, pid: u32, mut after: u64, wait_ms: u64) {
    let started = EventMessage {
        event: Event::Start { pid },
    };
    if !sender.send(&started).await {
        return;
    }
    loop {
        let output = tokio::select! {
            output = session.output(pid, after, wait_ms) => output,
            () = sender.closed() => return,
        };
        let output = match output {
            Ok(output) => output,
            Err(err) => return sender.end(Some(err)).await,
        };
        for chunk in &output.chunks {
            let data = match chunk.stream {
                OutputStream::Stdout => Data::Stdout(&chunk.data),
                OutputStream::Stderr => Data::Stderr(&chunk.data),
                OutputStream::Pty => Data::Pty(&chunk.data),
            };
            let message = EventMessage {
                event: Event::Data(data),
            };
            if !sender.send(&message).await {
                return;
            }
        }
        after = output.offset;
        if output.ended {
            // A process ended by its sandbox's end has no end of its own
            // to report: the stream fails as the sandbox's would.
            if output.end.exit_code.is_none() && session.tenant.sandbox(&session.id).await.is_err()
            {
                let gone = format!("The sandbox {} was not found", session.id);
                return sender
                    .end(Some(ConnectError::new("unavailable", gone)))
                    .await;
            }
            let end = EventMessage {
                event: Event::End(EndEvent::of(&output.end)),
            };
            if sender.send(&end).await {
                sender.end(None).await;
            }
            return;
        }
        if output.chunks.is_empty() {
            let alive = EventMessage {
                event: Event::Keepalive {},
            };
            if !sender.send(&alive).await {
                return;
            }
        }
    }
}

/// `List`: the sandbox's running processes.
pub async fn list(session: &Session) -> Response<Body> {
    #[derive(Serialize)]
    struct Listed {
        processes: Vec<Listing>,
    }
    #[derive(Serialize)]
    struct Listing {
        config: Config,
        pid: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        tag: Option<String>,
    }
    #[derive(Serialize)]
    struct Config {
        cmd: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
        cwd: String,
    }
    let listing = |process: ProcessInfo| {
        let mut argv = process.argv.into_iter();
        Listing {
            config: Config {
                cmd: argv.next().unwrap_or_default(),
                args: argv.collect(),
                cwd: process.cwd,
            },
            pid: process.pid,
            tag: process.tag,
        }
    };
    unary(session.processes().await.map(|processes| {
        Listed {
            processes: processes
                .into_iter()
                .filter(|process| process.state == ProcState::Running)
                .map(listing)
                .collect(),
        }
    }))
}

/// `SendInput`.
pub async fn send_input(session: &Session, asked: SendInputRequest) -> Response<Body> {
    let sent = match asked.process.named() {
        Ok(named) => session.input(&named, asked.input.data(), false).await,
        Err(err) => Err(err),
    };
    unary(sent.map(|()| Empty {}))
}

/// `CloseStdin`.
pub async fn close_stdin(session: &Session, asked: Selected) -> Response<Body> {
    let closed = match asked.process.named() {
        Ok(named) => session.input(&named, String::new(), true).await,
        Err(err) => Err(err),
    };
    unary(closed.map(|()| Empty {}))
}

/// `SendSignal`: SIGKILL and SIGTERM, by name or number, as envd takes.
pub async fn send_signal(session: &Session, asked: SendSignalRequest) -> Response<Body> {
    let signal = match &asked.signal {
        serde_json::Value::String(name) if name == "SIGNAL_SIGKILL" => Some(Signal::SIGKILL),
        serde_json::Value::String(name) if name == "SIGNAL_SIGTERM" => Some(Signal::SIGTERM),
        serde_json::Value::Number(number) if number.as_u64() == Some(9) => Some(Signal::SIGKILL),
        serde_json::Value::Number(number) if number.as_u64() == Some(15) => Some(Signal::SIGTERM),
        _ => None,
    };
    let sent = match (asked.process.named(), signal) {
        (Ok(named), Some(signal)) => session.signal(&named, signal).await,
        (Err(err), _) => Err(err),
        (_, None) => Err(ConnectError::new("unimplemented", "invalid signal")),
    };
    unary(sent.map(|()| Empty {}))
}

/// `Update`: a PTY's new size.
pub async fn update(session: &Session, asked: UpdateRequest) -> Response<Body> {
    let resized = match (asked.process.named(), asked.pty.map(pty_size)) {
        (Ok(named), Some(Ok(size))) => session.resize(&named, size.cols, size.rows).await,
        (Err(err), _) | (_, Some(Err(err))) => Err(err),
        (_, None) => Err(ConnectError::invalid("give the pty's size")),
    };
    unary(resized.map(|()| Empty {}))
}

/// `StreamInput`: a `start` naming the process, then its input in order
/// as the client sends it; answered once the client closes its side.
pub async fn stream_input(session: &Session, body: RequestBody) -> Response<Body> {
    let mut reader = EnvelopeReader::new(body);
    let named = match reader.next::<StreamInputMessage>().await {
        Ok(Some(StreamInputMessage::Start(selected))) => selected.process.named(),
        Ok(Some(_)) => Err(ConnectError::invalid("the first message must be start")),
        Ok(None) => Err(ConnectError::invalid("no start message")),
        Err(err) => Err(err),
    };
    let named = match named {
        Ok(named) => named,
        Err(err) => return super::connect::stream_error(err),
    };
    loop {
        match reader.next::<StreamInputMessage>().await {
            Ok(Some(StreamInputMessage::Data { input })) => {
                if let Err(err) = session.input(&named, input.data(), false).await {
                    return super::connect::stream_error(err);
                }
            }
            Ok(Some(StreamInputMessage::Keepalive(_))) => {}
            Ok(Some(StreamInputMessage::Start(_))) => {
                return super::connect::stream_error(ConnectError::invalid(
                    "start may be sent once",
                ))
            }
            Ok(None) => break,
            Err(err) => return super::connect::stream_error(err),
        }
    }
    let (sender, response) = stream();
    tokio::spawn(async move {
        if sender.send(&Empty {}).await {
            sender.end(None).await;
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_is_worded_as_envd_words_it() {
        let ok = EndEvent::of(&ProcEnd {
            exit_code: Some(0),
            ..ProcEnd::default()
        });
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"exited":true,"status":"exit status 0"}"#
        );
        let failed = EndEvent::of(&ProcEnd {
            exit_code: Some(3),
            ..ProcEnd::default()
        });
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}"#
        );
        let killed = EndEvent::of(&ProcEnd {
            signal: Some(9),
            ..ProcEnd::default()
        });
        assert_eq!(
            serde_json::to_string(&killed).unwrap(),
            r#"{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}"#
        );
    }

    #[test]
    fn events_and_paths_are_as_the_sdks_read_them() {
        let start = EventMessage {
            event: Event::Start { pid: 42 },
        };
        assert_eq!(
            serde_json::to_string(&start).unwrap(),
            r#"{"event":{"start":{"pid":42}}}"#
        );
        let data = EventMessage {
            event: Event::Data(Data::Stdout("aGkK")),
        };
        assert_eq!(
            serde_json::to_string(&data).unwrap(),
            r#"{"event":{"data":{"stdout":"aGkK"}}}"#
        );
        let alive = EventMessage {
            event: Event::Keepalive {},
        };
        assert_eq!(
            serde_json::to_string(&alive).unwrap(),
            r#"{"event":{"keepalive":{}}}"#
        );
        assert_eq!(resolve("~"), "/home/user");
        assert_eq!(resolve("~/a"), "/home/user/a");
        assert_eq!(resolve("a/b"), "/home/user/a/b");
        assert_eq!(resolve("/tmp"), "/tmp");
    }

    #[test]
    fn stream_input_messages_are_told_apart() {
        let start: StreamInputMessage =
            serde_json::from_str(r#"{"start":{"process":{"pid":4}}}"#).unwrap();
        assert!(matches!(start, StreamInputMessage::Start(_)));
        let data: StreamInputMessage =
            serde_json::from_str(r#"{"data":{"input":{"stdin":"aGk="}}}"#).unwrap();
        assert!(matches!(data, StreamInputMessage::Data { .. }));
        let alive: StreamInputMessage = serde_json::from_str(r#"{"keepalive":{}}"#).unwrap();
        assert!(matches!(alive, StreamInputMessage::Keepalive(_)));
    }
}
