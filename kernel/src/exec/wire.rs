//! What the kernel and an exec host say to each other, written once: the
//! zygote's side (`zygote/*.py`) takes every name and size it shares with
//! the kernel from a prelude made from this file ([`python_prelude`]).
//!
//! **The host's channel** is a `SOCK_SEQPACKET` pair: one datagram per
//! message, descriptors as `SCM_RIGHTS`, the zygote's end at
//! [`CHANNEL_FD`].
//! - kernel → zygote, first: its [`Settings`], at most [`SETTINGS_MAX`]
//!   bytes (never the environment: every run can read PID 1's).
//! - kernel → zygote, then: a [`HostOrder`] each, at most
//!   [`CHANNEL_MESSAGE_MAX`] bytes. `{"cgroup": c}` asks for one more run
//!   child, with the files it writes `0` into to move itself into run
//!   cgroup `c` (no files and 0: it stays in the host's);
//!   `{"reload_tools": true}` has the zygote import `tools` again.
//! - zygote → kernel: `{"ready": n, "cgroup": c}` for each run child
//!   prepared ([`Ready`]), with three descriptors: its socket and the read
//!   ends of its stdout and stderr pipes; `c` is the cgroup it moved into.
//!
//! **A run child's socket** is a `SOCK_STREAM` pair. The child first sends
//! one byte, [`PIDFD_MARK`], with a pidfd of itself: PID 1 of its run's
//! namespace, so killing it ends everything the run started. Then frames
//! go both ways, each a [`FRAME_HEADER`]-byte little-endian length and
//! JSON:
//! - kernel → child, once it is ready: a [`PrepareOrder`], with its first
//!   run's own kernel connection attached (a shell, if asked, starts with
//!   it at once);
//! - kernel → child, then: a [`RunOrder`] (`op` run, snapshot or restore)
//!   with its descriptors attached to its first bytes: the
//!   [`RunOrder::join`] files that move the child into a cgroup inside its
//!   agent's first, then the run's own kernel connection (none for the
//!   first run: it came with the prepare order) or the snapshot's memfd;
//! - child → kernel: a [`RunEnd`], at most [`MAX_END_FRAME`] bytes, once
//!   its output pipes are closed. A child kept for a session
//!   ([`RunOrder::keep`]) then sends one byte, [`PIPES_MARK`], with the
//!   read ends of fresh stdout and stderr pipes, and waits for its next
//!   order.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use agentos_proto::payload::{
    FileCall, Language, WatchEvent, MAX_LIST_ENTRIES, MAX_METADATA_BYTES, MAX_READ_BYTES,
};
use nix::sys::socket::MsgFlags;
use serde::{Deserialize, Serialize};

use crate::sandbox::spec::fds;
use crate::{fd, process};

/// Where the zygote finds its channel.
pub const CHANNEL_FD: RawFd = fds::CHANNEL;
/// Largest settings datagram.
pub const SETTINGS_MAX: usize = 1 << 20;
/// Largest channel datagram after the settings, either way.
pub const CHANNEL_MESSAGE_MAX: usize = 256;
/// The most descriptors the zygote or a run child takes with one message:
/// a cgroup's join files (one per hierarchy) and a connection or memfd.
pub const ZYGOTE_FDS_MAX: usize = 8;
/// The most descriptors one message to the kernel carries: a ready run
/// child's three.
const KERNEL_FDS_MAX: usize = 4;
/// Bytes of a frame's length, before its JSON.
pub const FRAME_HEADER: usize = 4;
/// Python's `struct` format of a frame's length: a little-endian `u32`,
/// as [`frame`] writes it.
const FRAME_LENGTH_FORMAT: &str = "<I";
/// The most a run's end frame may hold: the reply's own limit, which its
/// collected files must fit in.
pub const MAX_END_FRAME: usize = agentos_proto::MAX_REPLY_BYTES as usize;
/// The byte a run child's first message carries, with its pidfd.
pub const PIDFD_MARK: [u8; 1] = *b"R";
/// The byte a session's child sends with its fresh pipes.
pub const PIPES_MARK: [u8; 1] = *b"P";
/// The key of a [`HostOrder::Prepare`].
const HOST_PREPARE: &str = "cgroup";
/// The key of a [`HostOrder::ReloadTools`].
const HOST_RELOAD_TOOLS: &str = "reload_tools";

/// What a run child is asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderOp {
    /// Once ready: take the first run's kernel connection attached, and
    /// start a shell with it if asked ([`PrepareOrder`]).
    Prepare,
    /// Run code, with the run's own kernel connection attached.
    #[default]
    Run,
    /// Pickle the session's globals into the memfd attached, if one is.
    Snapshot,
    /// Say which globals of a restored snapshot could not be loaded.
    Restore,
    /// Fork the session's steward on the socket attached; run nothing.
    Steward,
}

impl OrderOp {
    /// Every op.
    pub const ALL: [OrderOp; 5] = [
        OrderOp::Prepare,
        OrderOp::Run,
        OrderOp::Snapshot,
        OrderOp::Restore,
        OrderOp::Steward,
    ];
}

/// The languages a [`RunOrder`] may be in.
pub const LANGUAGES: [Language; 2] = [Language::Python, Language::Bash];

/// What a ready run child is told first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PrepareOrder {
    /// Always [`OrderOp::Prepare`].
    op: OrderOp,
    /// Start a shell at once, with the connection attached, for a bash
    /// run to come.
    shell: bool,
    /// A template has been mounted: put its packages on the path now, so
    /// the run to come finds them there (sent alone, with no connection).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    template: bool,
}

impl PrepareOrder {
    /// The prepare order, with a shell or not.
    pub fn new(shell: bool) -> PrepareOrder {
        PrepareOrder {
            op: OrderOp::Prepare,
            shell,
            template: false,
        }
    }

    /// The order to a child that waits warm with a template.
    pub fn template() -> PrepareOrder {
        PrepareOrder {
            op: OrderOp::Prepare,
            shell: false,
            template: true,
        }
    }
}

/// What a run child is told to do: run code, or a session's snapshot or
/// restore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOrder {
    /// What to do (the fields below matter for `run` only).
    #[serde(default)]
    pub op: OrderOp,
    /// The program text.
    pub code: String,
    /// What it is written in.
    pub language: Language,
    /// The run's whole environment.
    pub env: BTreeMap<String, String>,
    /// Its working directory, if not the host's.
    pub cwd: Option<String>,
    /// Files to write under `/workspace` first: path to base64 content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Files under `/workspace` to send back once the code has ended.
    #[serde(default)]
    pub collect: Vec<String>,
    /// Largest file collected, in bytes.
    #[serde(default)]
    pub max_file_bytes: u64,
    /// Most bytes collected in all: what fits in the reply, base64-encoded
    /// beside the output.
    #[serde(default)]
    pub max_collect_bytes: u64,
    /// Keep the run child for more orders (a session).
    #[serde(default)]
    pub keep: bool,
    /// The session's disk is mounted over `/workspace`, `/tmp` and the
    /// session's home: the child works there, with the session's own
    /// Python environment.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_disk: bool,
    /// A template is mounted at its root (read-only): its packages are on
    /// the run's path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template: bool,
    /// How many of the descriptors attached are files the child writes
    /// `0` into first, to move itself into a cgroup inside its agent's
    /// (they come first; the run's connection or a memfd after them).
    #[serde(default)]
    pub join: usize,
    /// The run's span as a W3C `traceparent`, with tracing on: the code
    /// sees it as `TRACEPARENT` (set beside the environment, which stays
    /// the prepared one, so a traced run costs no rebuild of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Python: a last bare expression's value is printed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub print_last_expression: bool,
    /// Python: code that does not parse or only states values is not run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_if_not_code: bool,
    /// The last descriptor attached holds pickled globals to load into
    /// the session's fresh interpreter before the order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub load_state: bool,
}

/// How a run ended, as the run child reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// The code's exit status.
    pub exit_code: i32,
    /// An uncaught exception's `Type: message`, or why the code could not
    /// run.
    pub error: Option<String>,
    /// The collected files: path to base64 content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Why some of `collect` could not be sent back, if any could not.
    #[serde(default)]
    pub uncollected: Vec<String>,
    /// Bytes of files in `/workspace` after the run (a session's).
    #[serde(default)]
    pub workspace_bytes: Option<u64>,
    /// The globals a snapshot could not save, or a restore load (each
    /// name, with why).
    #[serde(default)]
    pub left_out: Vec<String>,
    /// Why the code was not run, when it was asked to be skipped if it is
    /// not code and it is not.
    #[serde(default)]
    pub not_code: Option<String>,
}

/// The zygote's settings: the first datagram on its channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// The seccomp filter every run installs on top of the host's: its
    /// BPF program's bytes, in hex.
    pub run_filter: String,
    /// Size of each run's `/tmp`, in bytes.
    pub tmp_bytes: u64,
    /// Size of each run's `/workspace`, in bytes.
    pub workspace_bytes: u64,
    /// Entries under a run's `/proc` hidden behind `/dev/null`.
    pub proc_masked: &'static [&'static str],
    /// Directories under a run's `/proc` made read-only.
    pub proc_read_only: &'static [&'static str],
    /// The environment every run starts with.
    pub run_env: BTreeMap<String, String>,
    /// Where runs import the `tools` package from, if there is one.
    pub tools_path: Option<&'static str>,
}

impl Settings {
    /// The datagram.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What the kernel asks of an exec host's zygote after its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostOrder {
    /// Prepare one more run child, which moves itself into the run cgroup
    /// numbered `cgroup` (0: none) through the files sent along.
    Prepare {
        /// The cgroup's number, for the child's [`Ready`].
        cgroup: u64,
    },
    /// Import the `tools` package again.
    ReloadTools,
}

impl HostOrder {
    /// The datagram: `{"cgroup": c}` or `{"reload_tools": true}`.
    fn encode(self) -> Vec<u8> {
        let (key, value) = match self {
            HostOrder::Prepare { cgroup } => (HOST_PREPARE, serde_json::Value::from(cgroup)),
            HostOrder::ReloadTools => (HOST_RELOAD_TOOLS, serde_json::Value::from(true)),
        };
        let message = serde_json::Map::from_iter([(key.to_owned(), value)]);
        serde_json::to_vec(&message).unwrap_or_default()
    }
}

/// A run child the host has prepared.
#[derive(Debug)]
pub struct Ready {
    /// The host's number for it.
    pub number: u64,
    /// The number of the cgroup it moved itself into (0: none).
    pub cgroup: u64,
    /// Its socket: the order goes in, its end comes out.
    pub socket: OwnedFd,
    /// The read end of its stdout.
    pub stdout: OwnedFd,
    /// The read end of its stderr.
    pub stderr: OwnedFd,
}

/// A [`Ready`] as the zygote writes it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReadyMessage {
    /// The host's number for the child.
    pub ready: u64,
    /// The number of the cgroup it moved itself into (0: none).
    #[serde(default)]
    pub cgroup: u64,
}

/// What an exec host or a run child sent that it should not have.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A channel datagram that is not a [`Ready`].
    #[error("bad message from an exec host: {0}")]
    BadReady(#[source] serde_json::Error),
    /// A ready message with other than three descriptors.
    #[error("an exec host's ready message carried {0} descriptors, not 3")]
    ReadyDescriptors(usize),
    /// A run child's first message without its pidfd.
    #[error("a run child's first message carried no pidfd")]
    NoPidfd,
    /// The prepare order did not go whole.
    #[error("the prepare message went in part ({sent} of {length} bytes)")]
    PreparePartly {
        /// Bytes sent.
        sent: usize,
        /// Bytes it has.
        length: usize,
    },
    /// A session's child sent something other than its fresh pipes.
    #[error("a session's child sent what it should not")]
    NotPipes,
}

/// Tells a zygote to import the `tools` package again.
pub fn send_reload_tools(channel: BorrowedFd<'_>) -> io::Result<()> {
    fd::send_with_fds::<OwnedFd>(channel, &HostOrder::ReloadTools.encode(), &[])?;
    Ok(())
}

/// Gives a host the cgroup numbered `number` for its next run child: the
/// files to write `0` into, one per hierarchy (none: that child goes
/// without a cgroup of its own).
pub fn send_cgroup(channel: BorrowedFd<'_>, number: u64, files: &[OwnedFd]) -> io::Result<()> {
    let order = HostOrder::Prepare { cgroup: number };
    fd::send_with_fds(channel, &order.encode(), files)?;
    Ok(())
}

// The steward's wire: a session's steward (forked by its run child on a
// `steward` order) reads orders and writes reports as frames on its own
// socket, descriptors attached to an order's first bytes.

/// The largest report a steward owing a file op may send: a `read` of 4
/// MiB in base64, or a `list` of 10 000 entries (it stops short of this).
pub const FILE_REPORT_MAX: usize = 8 << 20;

/// An order to a steward.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum StewardOrder<'a> {
    /// Start `argv` on the pipes attached (stdout, stderr, then stdin if
    /// `stdin`).
    Start {
        /// The kernel's number for the order.
        #[serde(rename = "ref")]
        reference: u64,
        /// The program and its arguments.
        argv: &'a [String],
        /// Its environment over the steward's own.
        env: &'a BTreeMap<String, String>,
        /// Where it starts, if not the session's home.
        cwd: Option<&'a str>,
        /// Its stdin is the third descriptor (else `/dev/null`).
        stdin: bool,
        /// The one descriptor is a PTY's slave: its stdin, stdout, stderr
        /// and controlling terminal.
        pty: bool,
    },
    /// Send `signal` to the process group of `pid`.
    Signal {
        /// The kernel's number for the order.
        #[serde(rename = "ref")]
        reference: u64,
        /// The process (a group's leader).
        pid: u32,
        /// The signal's number.
        signal: i32,
    },
    /// Carry out a file op in the session.
    File {
        /// The kernel's number for the order.
        #[serde(rename = "ref")]
        reference: u64,
        /// The op, as the caller gave it (checked).
        call: &'a FileCall,
    },
    /// Stop watch `ref` (the order that made it); answered with nothing.
    Unwatch {
        /// The watch's order.
        #[serde(rename = "ref")]
        reference: u64,
    },
}

/// What a steward says.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum Report {
    /// It is ready: its pid in the session.
    Hello {
        /// Its pid.
        hello: u32,
    },
    /// Order `started` started a process.
    Started {
        /// The order.
        started: u64,
        /// The process's pid in the session.
        pid: u32,
        /// Where it started.
        cwd: String,
    },
    /// Order `failed` could not be carried out.
    Failed {
        /// The order.
        failed: u64,
        /// Why, as an errno.
        errno: i32,
        /// Why, in words.
        error: String,
    },
    /// Order `signalled` was carried out (`sent`: the process was there).
    Signalled {
        /// The order.
        signalled: u64,
        /// Whether it was sent.
        sent: bool,
    },
    /// Order `done` (a file op) was carried out: its reply. Read by
    /// [`DoneReport`] (its reply kept as the JSON text it came as, read
    /// once into what the op's reply is), never as one of the others.
    #[serde(skip_deserializing)]
    Done {
        /// The order.
        done: u64,
        /// The op's reply, JSON, as the caller is to get it (checked
        /// first).
        reply: String,
    },
    /// Watch `events` (the order that made it) saw these.
    Events {
        /// The watch's order.
        events: u64,
        /// What it saw, oldest first.
        list: Vec<WatchEvent>,
    },
    /// A process it started has ended.
    Ended {
        /// Its pid.
        ended: u32,
        /// Its exit code, if it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
}

/// A `done` report as it is read: its reply left as text, so that a long
/// one is not first built into a tree of values.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoneReport<'a> {
    /// The order.
    pub done: u64,
    /// The op's reply.
    #[serde(borrow)]
    pub reply: &'a serde_json::value::RawValue,
}

impl DoneReport<'_> {
    /// How one begins, as the steward writes it: only a report that
    /// begins so may be longer than the usual cap on a report.
    pub const OPENING: &'static [u8] = br#"{"done":"#;
}

/// Encodes one frame.
pub fn frame<T: Serialize>(value: &T) -> Vec<u8> {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let mut out = Vec::with_capacity(FRAME_HEADER + json.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Takes one whole frame off the front of `buffer`, if one is there.
pub fn take_frame<T: for<'de> Deserialize<'de>>(buffer: &mut Vec<u8>) -> Option<io::Result<T>> {
    let header: [u8; FRAME_HEADER] = buffer.get(..FRAME_HEADER)?.try_into().ok()?;
    let length = u32::from_le_bytes(header) as usize;
    let body = buffer.get(FRAME_HEADER..FRAME_HEADER + length)?;
    let value = serde_json::from_slice(body).map_err(io::Error::other);
    buffer.drain(..FRAME_HEADER + length);
    Some(value)
}

/// Receives one `ready` datagram from a host's channel. `Ok(None)`: the
/// host has gone.
pub fn receive_ready(channel: BorrowedFd<'_>) -> io::Result<Option<Ready>> {
    let mut bytes = [0u8; CHANNEL_MESSAGE_MAX];
    let (length, owned) = match receive(channel, &mut bytes, MsgFlags::MSG_DONTWAIT) {
        // It went with cgroups sent to it still unread.
        Err(err) if err.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
        received => received?,
    };
    if length == 0 && owned.is_empty() {
        return Ok(None);
    }
    let message: ReadyMessage = serde_json::from_slice(&bytes[..length])
        .map_err(|err| io::Error::other(WireError::BadReady(err)))?;
    let [socket, stdout, stderr]: [OwnedFd; 3] = owned
        .try_into()
        .map_err(|fds: Vec<_>| io::Error::other(WireError::ReadyDescriptors(fds.len())))?;
    Ok(Some(Ready {
        number: message.ready,
        cgroup: message.cgroup,
        socket,
        stdout,
        stderr,
    }))
}

/// Receives what a run's socket holds (non-blocking if the socket is),
/// with any descriptors that came along. `Ok((0, _))`: it closed.
pub fn receive_with_fds(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    receive(socket, buffer, MsgFlags::empty())
}

/// Receives a run child's first message: a pidfd of itself, PID 1 of its
/// namespace. Blocks if the socket does; `Ok(None)`: it went away first.
pub fn receive_pidfd(socket: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let (length, fds) = receive(socket, &mut byte, MsgFlags::empty())?;
    match (length, fds.into_iter().next()) {
        (0, _) => Ok(None),
        (_, Some(pidfd)) => Ok(Some(pidfd)),
        (_, None) => Err(io::Error::other(WireError::NoPidfd)),
    }
}

/// One recvmsg(2) on a host's channel or a run's socket, with room for
/// the descriptors either sends at once.
fn receive(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    flags: MsgFlags,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    Ok(fd::receive_with_fds(socket, buffer, flags, KERNEL_FDS_MAX)?)
}

/// The zygote's first lines: every name and size above that its side of
/// the wire uses, as Python constants. Its parts use these, never their
/// own copies.
pub fn python_prelude() -> String {
    let mut out = String::from(
        "# The wire's names and sizes, from the kernel's exec/wire.rs (one source\n\
         # for both sides).\n",
    );
    let mut constant = |name: &str, value: String| {
        let _ = writeln!(out, "{name} = {value}");
    };
    constant("CHANNEL_FD", CHANNEL_FD.to_string());
    constant("SETTINGS_MAX", SETTINGS_MAX.to_string());
    constant("CHANNEL_MESSAGE_MAX", CHANNEL_MESSAGE_MAX.to_string());
    constant("FDS_MAX", ZYGOTE_FDS_MAX.to_string());
    constant("FRAME_HEADER", FRAME_HEADER.to_string());
    constant("FRAME_LENGTH", python_str(FRAME_LENGTH_FORMAT));
    constant("PIDFD_MARK", python_bytes(&PIDFD_MARK));
    constant("PIPES_MARK", python_bytes(&PIPES_MARK));
    constant("HOST_PREPARE", python_str(HOST_PREPARE));
    constant("HOST_RELOAD_TOOLS", python_str(HOST_RELOAD_TOOLS));
    constant("BACKGROUND_NICE", process::BACKGROUND_NICE.to_string());
    constant("FILE_REPORT_MAX", FILE_REPORT_MAX.to_string());
    constant("FILE_LIST_MAX", MAX_LIST_ENTRIES.to_string());
    constant("FILE_READ_MAX", MAX_READ_BYTES.to_string());
    constant("FILE_METADATA_MAX", MAX_METADATA_BYTES.to_string());
    for op in OrderOp::ALL {
        let name = serde_name(&op);
        constant(&format!("OP_{}", name.to_uppercase()), python_str(&name));
    }
    for language in LANGUAGES {
        let name = serde_name(&language);
        constant(
            &format!("LANGUAGE_{}", name.to_uppercase()),
            python_str(&name),
        );
    }
    out
}

/// A value's name as serde writes it (a unit variant: a JSON string).
fn serde_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// A Python string literal of plain ASCII text.
fn python_str(text: &str) -> String {
    format!("{:?}", text)
}

/// A Python bytes literal of plain ASCII bytes.
fn python_bytes(bytes: &[u8]) -> String {
    format!("b{:?}", String::from_utf8_lossy(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_apart_as_they_went_together_even_in_pieces() {
        let end = RunEnd {
            exit_code: 3,
            error: Some("ValueError: no".into()),
            files: BTreeMap::from([("out.txt".into(), "aGk=".into())]),
            uncollected: Vec::new(),
            workspace_bytes: None,
            left_out: Vec::new(),
            not_code: None,
        };
        let bytes = [frame(&end), frame(&end)].concat();
        let mut buffer = Vec::new();
        let mut got = Vec::new();
        for piece in bytes.chunks(5) {
            buffer.extend_from_slice(piece);
            while let Some(value) = take_frame::<RunEnd>(&mut buffer) {
                got.push(value.unwrap());
            }
        }
        assert_eq!(got, vec![end.clone(), end]);
        assert!(buffer.is_empty());
    }

    #[test]
    fn a_frame_that_is_not_json_is_an_error_not_a_hang() {
        let mut buffer = vec![3, 0, 0, 0, b'n', b'o', b'!'];
        assert!(take_frame::<RunEnd>(&mut buffer).unwrap().is_err());
        assert!(buffer.is_empty());
    }

    #[test]
    fn orders_read_as_the_zygote_reads_them() {
        let prepare: serde_json::Value =
            serde_json::from_slice(&frame(&PrepareOrder::new(true))[FRAME_HEADER..]).unwrap();
        assert_eq!(prepare, serde_json::json!({"op": "prepare", "shell": true}));
        let cgroup: serde_json::Value =
            serde_json::from_slice(&HostOrder::Prepare { cgroup: 5 }.encode()).unwrap();
        assert_eq!(cgroup, serde_json::json!({"cgroup": 5}));
        let reload: serde_json::Value =
            serde_json::from_slice(&HostOrder::ReloadTools.encode()).unwrap();
        assert_eq!(reload, serde_json::json!({"reload_tools": true}));
        let ready: ReadyMessage = serde_json::from_str(r#"{"ready": 2, "cgroup": 7}"#).unwrap();
        assert_eq!((ready.ready, ready.cgroup), (2, 7));
        assert!(HostOrder::Prepare { cgroup: u64::MAX }.encode().len() <= CHANNEL_MESSAGE_MAX);
    }

    #[test]
    fn the_python_prelude_says_what_the_rust_says() {
        let prelude = python_prelude();
        let says = |line: String| {
            assert!(
                prelude.lines().any(|l| l == line),
                "the prelude lacks {line:?}:\n{prelude}"
            )
        };
        for op in OrderOp::ALL {
            let name = serde_json::to_value(op).unwrap();
            let name = name.as_str().unwrap();
            says(format!("OP_{} = \"{name}\"", name.to_uppercase()));
        }
        for language in LANGUAGES {
            let name = serde_json::to_value(language).unwrap();
            let name = name.as_str().unwrap();
            says(format!("LANGUAGE_{} = \"{name}\"", name.to_uppercase()));
        }
        says(format!("CHANNEL_FD = {}", fds::CHANNEL));
        says(format!("SETTINGS_MAX = {SETTINGS_MAX}"));
        says(format!("CHANNEL_MESSAGE_MAX = {CHANNEL_MESSAGE_MAX}"));
        says(format!("FDS_MAX = {ZYGOTE_FDS_MAX}"));
        says(format!("FRAME_HEADER = {FRAME_HEADER}"));
        says("PIDFD_MARK = b\"R\"".to_owned());
        says("PIPES_MARK = b\"P\"".to_owned());
        says("HOST_PREPARE = \"cgroup\"".to_owned());
        says("HOST_RELOAD_TOOLS = \"reload_tools\"".to_owned());
        says("BACKGROUND_NICE = 10".to_owned());
        says(format!("FILE_REPORT_MAX = {}", 8 << 20));
        says("FILE_LIST_MAX = 10000".to_owned());
        says(format!("FILE_READ_MAX = {}", 4 << 20));
        says("FILE_METADATA_MAX = 4096".to_owned());
        // A frame's length is the u32 `frame` writes.
        assert_eq!(FRAME_HEADER, std::mem::size_of::<u32>());
        says("FRAME_LENGTH = \"<I\"".to_owned());
    }
}
