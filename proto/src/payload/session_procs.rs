//! EXEC's process ops: programs started inside one of the caller's
//! sessions, as `docker exec` starts them in a container — sharing the
//! session's processes, network and files — each read, written to,
//! signalled and resized by its pid (in the session) or its tag.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, validate_name};
use super::session_open::check_env;
use crate::error::ErrorReply;

/// Items `argv` may hold.
pub const MAX_ARGV_ITEMS: usize = 4096;
/// Bytes `argv` may hold in all.
pub const MAX_ARGV_BYTES: usize = 512 << 10;
/// Bytes one `input` may carry, and one `output` reply.
pub const MAX_PROC_CHUNK_BYTES: usize = 256 << 10;
/// The longest a process may be given to run: a day.
pub const MAX_PROC_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// The longest an `output` follow waits.
pub const MAX_OUTPUT_WAIT_MS: u64 = 60_000;
/// The longest tag.
pub const MAX_TAG_BYTES: usize = 128;
/// A PTY's largest side, in cells.
pub const MAX_PTY_CELLS: u16 = 1000;

/// A PTY's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns, 1 to 1000.
    pub cols: u16,
    /// Rows, 1 to 1000.
    pub rows: u16,
}

impl PtySize {
    fn check(self, field: &str) -> Result<(), ErrorReply> {
        let fits = |cells: u16| (1..=MAX_PTY_CELLS).contains(&cells);
        if fits(self.cols) && fits(self.rows) {
            return Ok(());
        }
        Err(bad_request(format!(
            "EXEC field `{field}`: {}x{} is not 1 to {MAX_PTY_CELLS} columns and rows",
            self.cols, self.rows
        )))
    }
}

/// `start`: a program to run in a session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcStart {
    /// The session.
    pub session: String,
    /// The program and its arguments: `argv[0]` absolute, or looked up on
    /// the process's `PATH`.
    pub argv: Vec<String>,
    /// Its environment, over the session's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Where it starts (absolute; default: the session's home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its input is written with `input` (else it reads `/dev/null`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// It runs on a PTY of this size (its input always open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// A name to find it by, unique among the session's live processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The kernel kills its process group after this long (paused time
    /// not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl ProcStart {
    fn check(&self) -> Result<(), ErrorReply> {
        validate_name("session", &self.session)?;
        let bytes: usize = self.argv.iter().map(String::len).sum();
        if self.argv.is_empty() || self.argv.len() > MAX_ARGV_ITEMS || bytes > MAX_ARGV_BYTES {
            return Err(bad_request(format!(
                "EXEC field `argv`: give the program and its arguments, 1 to {MAX_ARGV_ITEMS} \
                 items and at most {MAX_ARGV_BYTES} bytes"
            )));
        }
        if self.argv.iter().any(|arg| arg.contains('\0')) || self.argv[0].is_empty() {
            return Err(bad_request(
                "EXEC field `argv`: no argument may hold NUL, and the program must be named",
            ));
        }
        check_env(&self.env)?;
        if let Some(cwd) = &self.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(bad_request(format!(
                    "EXEC field `cwd`: {cwd:?} is not an absolute path"
                )));
            }
        }
        if let Some(pty) = self.pty {
            pty.check("pty")?;
        }
        if let Some(tag) = &self.tag {
            check_tag(tag)?;
        }
        match self.timeout_ms {
            Some(ms) if ms == 0 || ms > MAX_PROC_TIMEOUT_MS => Err(bad_request(format!(
                "EXEC field `timeout_ms`: {ms} is not 1 to {MAX_PROC_TIMEOUT_MS} (a day)"
            ))),
            _ => Ok(()),
        }
    }
}

/// A tag: 1 to 128 bytes, no control characters.
fn check_tag(tag: &str) -> Result<(), ErrorReply> {
    if tag.is_empty() || tag.len() > MAX_TAG_BYTES || tag.chars().any(char::is_control) {
        return Err(bad_request(format!(
            "EXEC field `tag`: {tag:?} is not 1 to {MAX_TAG_BYTES} bytes without control \
             characters"
        )));
    }
    Ok(())
}

/// Which process of a session an op names: by `pid` (its live process of
/// that pid, else the latest ended one) or by `tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcRef {
    /// By its pid in the session.
    Pid(u32),
    /// By its tag.
    Tag(String),
}

/// `pid` or `tag`, exactly one, checked.
fn proc_ref(pid: Option<u32>, tag: &Option<String>) -> Result<ProcRef, ErrorReply> {
    match (pid, tag) {
        (Some(0), None) => Err(bad_request("EXEC field `pid`: 0 is no process")),
        (Some(pid), None) => Ok(ProcRef::Pid(pid)),
        (None, Some(tag)) => {
            check_tag(tag)?;
            Ok(ProcRef::Tag(tag.clone()))
        }
        _ => Err(bad_request(
            "EXEC: name the process by `pid` or by `tag`, one of them",
        )),
    }
}

/// The fields every op on one process takes: its session, and the
/// process by `pid` or `tag`.
macro_rules! proc_op {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// The session.
            pub session: String,
            /// The process, by its pid in the session.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub pid: Option<u32>,
            /// The process, by its tag.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub tag: Option<String>,
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl $name {
            /// The process it names.
            pub fn process(&self) -> Result<ProcRef, ErrorReply> {
                proc_ref(self.pid, &self.tag)
            }
        }
    };
}

proc_op!(
    /// `output`: what a process has printed after `after` (default: the
    /// oldest byte kept); with `follow`, waiting up to `wait_ms` for more.
    ProcOutput {
        /// The offset to read from (a reply's `offset` is the next one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        /// Wait for output (or its end) if there is none yet.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        follow: bool,
        /// How long a follow waits (default 10 000, at most 60 000).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    }
);

proc_op!(
    /// `input`: bytes for a process's input (its stdin, or its PTY).
    ProcInput {
        /// The bytes, base64 (at most 256 KiB of them).
        #[serde(default)]
        data: String,
        /// Close its stdin after them (not on a PTY: send `\u0004`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        eof: bool,
    }
);

proc_op!(
    /// `signal`: a signal to a process's group.
    ProcSignal {
        /// Which.
        signal: Signal,
    }
);

proc_op!(
    /// `resize`: a PTY's new size.
    ProcResize {
        /// Columns, 1 to 1000.
        cols: u16,
        /// Rows, 1 to 1000.
        rows: u16,
    }
);

/// The signals a process may be sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[allow(clippy::upper_case_acronyms)]
pub enum Signal {
    /// Terminate.
    #[default]
    SIGTERM,
    /// Kill.
    SIGKILL,
    /// Interrupt.
    SIGINT,
    /// Hang up.
    SIGHUP,
    /// Quit.
    SIGQUIT,
    /// User signal 1.
    SIGUSR1,
    /// User signal 2.
    SIGUSR2,
    /// Stop.
    SIGSTOP,
    /// Continue.
    SIGCONT,
}

impl Signal {
    /// Its number.
    pub fn number(self) -> i32 {
        match self {
            Signal::SIGTERM => libc::SIGTERM,
            Signal::SIGKILL => libc::SIGKILL,
            Signal::SIGINT => libc::SIGINT,
            Signal::SIGHUP => libc::SIGHUP,
            Signal::SIGQUIT => libc::SIGQUIT,
            Signal::SIGUSR1 => libc::SIGUSR1,
            Signal::SIGUSR2 => libc::SIGUSR2,
            Signal::SIGSTOP => libc::SIGSTOP,
            Signal::SIGCONT => libc::SIGCONT,
        }
    }
}

/// A process op, parsed and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ProcCall {
    /// Start a program in a session.
    Start(Box<ProcStart>),
    /// List a session's processes.
    Processes {
        /// The session.
        session: String,
    },
    /// Read a process's output.
    Output(ProcOutput),
    /// Write to a process's input.
    Input(ProcInput),
    /// Signal a process's group.
    Signal(ProcSignal),
    /// Resize a process's PTY.
    Resize(ProcResize),
}

impl ProcCall {
    /// The session it is about.
    pub fn session(&self) -> &str {
        match self {
            ProcCall::Start(start) => &start.session,
            ProcCall::Processes { session } => session,
            ProcCall::Output(output) => &output.session,
            ProcCall::Input(input) => &input.session,
            ProcCall::Signal(signal) => &signal.session,
            ProcCall::Resize(resize) => &resize.session,
        }
    }
}

/// The process ops, by their `op`.
#[derive(Clone, Copy, Debug)]
pub(super) enum ProcOp {
    Start,
    Processes,
    Output,
    Input,
    Signal,
    Resize,
}

/// The fields of `processes`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionOnly {
    session: String,
}

impl ProcOp {
    /// Parses `value` as this op, checked (its `op`, already read, aside).
    pub(super) fn parse(self, mut value: serde_json::Value) -> Result<ProcCall, ErrorReply> {
        if let Some(fields) = value.as_object_mut() {
            fields.remove("op");
        }
        fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ErrorReply> {
            super::parse::from_value("EXEC", value)
        }
        Ok(match self {
            ProcOp::Start => {
                let start: ProcStart = from(value)?;
                start.check()?;
                ProcCall::Start(Box::new(start))
            }
            ProcOp::Processes => {
                let SessionOnly { session } = from(value)?;
                validate_name("session", &session)?;
                ProcCall::Processes { session }
            }
            ProcOp::Output => {
                let output: ProcOutput = from(value)?;
                output.process()?;
                if output.wait_ms.is_some_and(|ms| ms > MAX_OUTPUT_WAIT_MS) {
                    return Err(bad_request(format!(
                        "EXEC field `wait_ms`: at most {MAX_OUTPUT_WAIT_MS}"
                    )));
                }
                ProcCall::Output(output)
            }
            ProcOp::Input => {
                let input: ProcInput = from(value)?;
                input.process()?;
                // Base64 carries 3 bytes in 4 characters.
                if input.data.len() > MAX_PROC_CHUNK_BYTES.div_ceil(3) * 4 {
                    return Err(bad_request(format!(
                        "EXEC field `data`: more than {MAX_PROC_CHUNK_BYTES} bytes; send them \
                         in parts"
                    )));
                }
                ProcCall::Input(input)
            }
            ProcOp::Signal => {
                let signal: ProcSignal = from(value)?;
                signal.process()?;
                ProcCall::Signal(signal)
            }
            ProcOp::Resize => {
                let resize: ProcResize = from(value)?;
                resize.process()?;
                let size = PtySize {
                    cols: resize.cols,
                    rows: resize.rows,
                };
                size.check("cols")?;
                ProcCall::Resize(resize)
            }
        })
    }
}

/// The reply to `start`: the process runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcStartedReply {
    /// Always true.
    pub success: bool,
    /// The session.
    pub session: String,
    /// Its pid in the session.
    pub pid: u32,
    /// Its tag, if it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Where a process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    /// It runs (or is stopped, or its session paused).
    Running,
    /// It has ended.
    Ended,
}

/// How a process ended, once it has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcEnd {
    /// Its exit code, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did (its number).
    pub signal: Option<i32>,
    /// The kernel killed it at its `timeout_ms`.
    #[serde(default)]
    pub timed_out: bool,
    /// Why it ended, when the kernel knows more than its status: `timeout`
    /// (its `timeout_ms` passed), or `its steward or its session ended`
    /// (how it ended is then unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One of a session's processes (`processes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessInfo {
    /// Its pid in the session.
    pub pid: u32,
    /// Its tag, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// What it runs.
    pub argv: Vec<String>,
    /// Where it started.
    pub cwd: String,
    /// It runs on a PTY.
    pub pty: bool,
    /// Its input is open for `input`.
    pub stdin: bool,
    /// `running` or `ended`.
    pub state: ProcState,
    /// How it ended (all `null` while it runs).
    #[serde(flatten)]
    pub end: ProcEnd,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended, once it has (RFC 3339).
    pub ended_at: Option<String>,
    /// Bytes of output it has printed so far (the next `after`).
    pub offset: u64,
    /// Bytes of its output dropped, oldest first, beyond what is kept.
    pub dropped: u64,
}

/// The reply to `processes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessesReply {
    /// Always true.
    pub success: bool,
    /// The session's live processes, then those ended lately.
    pub processes: Vec<ProcessInfo>,
}

/// Which of a process's streams a chunk of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Its standard output.
    Stdout,
    /// Its standard error.
    Stderr,
    /// Its PTY (both, as a terminal shows them).
    Pty,
}

/// A chunk of a process's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OutputChunk {
    /// Its stream.
    pub stream: OutputStream,
    /// Its bytes, base64.
    pub data: String,
}

/// The reply to `output`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcOutputReply {
    /// Always true.
    pub success: bool,
    /// The process.
    pub pid: u32,
    /// Its output after `after`, in the order it was printed (at most
    /// 256 KiB).
    pub chunks: Vec<OutputChunk>,
    /// The offset after the last chunk: the next `after`.
    pub offset: u64,
    /// Bytes between `after` and the first chunk that were dropped.
    pub dropped: u64,
    /// The process has ended and this reply reaches the end of its
    /// output.
    pub ended: bool,
    /// How it ended, once `ended`.
    #[serde(flatten)]
    pub end: ProcEnd,
}

/// The reply to `input`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcInputReply {
    /// Always true.
    pub success: bool,
    /// Bytes written.
    pub written: u64,
}

/// The reply to `signal`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcSignalledReply {
    /// Always true.
    pub success: bool,
    /// The process was there to be signalled (it may have just ended).
    pub signalled: bool,
}

/// The reply to `resize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcDoneReply {
    /// Always true.
    pub success: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ProcCall, ErrorReply> {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let op = match value["op"].as_str().unwrap() {
            "start" => ProcOp::Start,
            "processes" => ProcOp::Processes,
            "output" => ProcOp::Output,
            "input" => ProcOp::Input,
            "signal" => ProcOp::Signal,
            _ => ProcOp::Resize,
        };
        op.parse(value)
    }

    #[test]
    fn each_op_reads_its_fields_and_serialises_back_to_them() {
        for json in [
            r#"{"op":"start","session":"sb1","argv":["/bin/bash","-l","-c","echo hi"],
                "env":{"A":"b"},"cwd":"/home/user","stdin":true,"pty":{"cols":80,"rows":24},
                "tag":"ctx-7","timeout_ms":60000}"#,
            r#"{"op":"processes","session":"sb1"}"#,
            r#"{"op":"output","session":"sb1","pid":42,"after":10,"follow":true,"wait_ms":500}"#,
            r#"{"op":"input","session":"sb1","tag":"ctx-7","data":"aGk=","eof":true}"#,
            r#"{"op":"signal","session":"sb1","pid":42,"signal":"SIGINT"}"#,
            r#"{"op":"resize","session":"sb1","pid":42,"cols":120,"rows":40}"#,
        ] {
            let call = parse(json).unwrap_or_else(|err| panic!("{json}: {err:?}"));
            let again: serde_json::Value = serde_json::to_value(&call).unwrap();
            assert_eq!(parse(&again.to_string()).unwrap(), call, "{json}");
        }
    }

    #[test]
    fn hostile_fields_are_refused_by_name() {
        let long_tag = "t".repeat(129);
        let many = vec!["x"; MAX_ARGV_ITEMS + 1];
        let big_argv = vec!["x".repeat(1 << 20)];
        let big_data = "A".repeat(MAX_PROC_CHUNK_BYTES / 3 * 4 + 8);
        for (json, names) in [
            (
                r#"{"op":"start","session":"s","argv":[]}"#.to_owned(),
                "argv",
            ),
            (
                format!(
                    r#"{{"op":"start","session":"s","argv":{}}}"#,
                    serde_json::to_string(&many).unwrap()
                ),
                "argv",
            ),
            (
                format!(
                    r#"{{"op":"start","session":"s","argv":{}}}"#,
                    serde_json::to_string(&big_argv).unwrap()
                ),
                "argv",
            ),
            (
                r#"{"op":"start","session":"s","argv":["a\u0000b"]}"#.to_owned(),
                "NUL",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"cwd":"rel"}"#.to_owned(),
                "cwd",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"pty":{"cols":0,"rows":5}}"#
                    .to_owned(),
                "pty",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"pty":{"cols":5000,"rows":5}}"#
                    .to_owned(),
                "pty",
            ),
            (
                format!(r#"{{"op":"start","session":"s","argv":["sh"],"tag":"{long_tag}"}}"#),
                "tag",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"timeout_ms":0}"#.to_owned(),
                "timeout_ms",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"env":{"AGENTOS_SOCKET_FD":"3"}}"#
                    .to_owned(),
                "AGENTOS_",
            ),
            (
                r#"{"op":"start","session":"../s","argv":["sh"]}"#.to_owned(),
                "session",
            ),
            (
                r#"{"op":"start","session":"s","argv":["sh"],"user":"root"}"#.to_owned(),
                "user",
            ),
            (r#"{"op":"output","session":"s"}"#.to_owned(), "pid"),
            (
                r#"{"op":"output","session":"s","pid":1,"tag":"t"}"#.to_owned(),
                "pid",
            ),
            (r#"{"op":"output","session":"s","pid":0}"#.to_owned(), "pid"),
            (
                r#"{"op":"output","session":"s","pid":1,"wait_ms":60001}"#.to_owned(),
                "wait_ms",
            ),
            (
                format!(r#"{{"op":"input","session":"s","pid":1,"data":"{big_data}"}}"#),
                "data",
            ),
            (
                r#"{"op":"signal","session":"s","pid":1,"signal":"SIGSEGV"}"#.to_owned(),
                "signal",
            ),
            (
                r#"{"op":"resize","session":"s","pid":1,"cols":0,"rows":5}"#.to_owned(),
                "cols",
            ),
            (
                r#"{"op":"processes","session":"s","pid":1}"#.to_owned(),
                "pid",
            ),
        ] {
            let refused = parse(&json).unwrap_err();
            assert_eq!(refused.code.as_str(), "bad_request", "{json}");
            assert!(refused.error.contains(names), "{json}: {}", refused.error);
        }
    }
}
