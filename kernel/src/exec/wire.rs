//! What the kernel and an exec host say to each other (the host's side is
//! `zygote.py`).
//!
//! The host's channel carries one datagram per prepared run child —
//! `{"ready": n, "cgroup": c}` with three descriptors: the run's socket and
//! the read ends of its stdout and stderr pipes; `c` names the run's own
//! cgroup (0: none). The other way, after the settings, the kernel sends
//! `{"cgroup": c}` with the files the next run child writes `0` into to
//! move itself into its cgroup (no descriptors: that run goes without). A
//! run's socket carries frames both ways, each a 4-byte little-endian
//! length and JSON: the kernel's [`RunOrder`], then the run's [`RunEnd`].

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::socket::MsgFlags;
use serde::{Deserialize, Serialize};

use crate::fd;

/// The zygote's source, run as `python -I -S -c`.
pub const ZYGOTE: &str = include_str!("zygote.py");

/// Largest channel datagram the host sends.
const READY_MAX: usize = 256;
/// The most descriptors one message to the kernel carries: a ready run
/// child's three.
const RECEIVED_FDS: usize = 4;

/// What a run child is asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderOp {
    /// Run code, with the run's own kernel connection attached.
    #[default]
    Run,
    /// Write the session's `/workspace` into the memfd attached.
    Snapshot,
    /// Fill `/workspace` from the snapshot in the memfd attached.
    Restore,
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOrder {
    /// What to do (the fields below matter for `run` only).
    #[serde(default)]
    pub op: OrderOp,
    /// The program text.
    pub code: String,
    /// `python` or `bash`.
    pub language: String,
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
    /// How many of the descriptors attached are files the child writes
    /// `0` into first, to move itself into a cgroup inside its agent's
    /// (they come first; the run's connection or a memfd after them).
    #[serde(default)]
    pub join: usize,
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
    /// A snapshot's bytes of files saved.
    #[serde(default)]
    pub snapshot_bytes: Option<u64>,
    /// Paths a snapshot or restore left out (symlinks, special files,
    /// paths that are not plain).
    #[serde(default)]
    pub left_out: Vec<String>,
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

#[derive(Deserialize)]
struct ReadyMessage {
    ready: u64,
    #[serde(default)]
    cgroup: u64,
}

/// Tells a zygote to import the `tools` package again.
pub fn send_reload_tools(channel: BorrowedFd<'_>) -> io::Result<()> {
    nix::sys::socket::send(
        channel.as_raw_fd(),
        b"{\"reload_tools\": true}",
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
    )?;
    Ok(())
}

/// Gives a host the cgroup numbered `number` for its next run child: the
/// files to write `0` into, one per hierarchy (none: that child goes
/// without a cgroup of its own).
pub fn send_cgroup(channel: BorrowedFd<'_>, number: u64, files: &[OwnedFd]) -> io::Result<()> {
    let message = format!("{{\"cgroup\": {number}}}");
    fd::send_with_fds(channel, message.as_bytes(), files)?;
    Ok(())
}

/// Encodes one frame.
pub fn frame<T: Serialize>(value: &T) -> Vec<u8> {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + json.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Takes one whole frame off the front of `buffer`, if one is there.
pub fn take_frame<T: for<'de> Deserialize<'de>>(buffer: &mut Vec<u8>) -> Option<io::Result<T>> {
    let header: [u8; 4] = buffer.get(..4)?.try_into().ok()?;
    let length = u32::from_le_bytes(header) as usize;
    let body = buffer.get(4..4 + length)?;
    let value = serde_json::from_slice(body).map_err(io::Error::other);
    buffer.drain(..4 + length);
    Some(value)
}

/// Receives one `ready` datagram from a host's channel. `Ok(None)`: the
/// host has gone.
pub fn receive_ready(channel: BorrowedFd<'_>) -> io::Result<Option<Ready>> {
    let mut bytes = [0u8; READY_MAX];
    let (length, owned) = match receive(channel, &mut bytes, MsgFlags::MSG_DONTWAIT) {
        // It went with cgroups sent to it still unread.
        Err(err) if err.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
        received => received?,
    };
    if length == 0 && owned.is_empty() {
        return Ok(None);
    }
    let message: ReadyMessage = serde_json::from_slice(&bytes[..length])
        .map_err(|err| io::Error::other(format!("bad message from an exec host: {err}")))?;
    let [socket, stdout, stderr]: [OwnedFd; 3] = owned.try_into().map_err(|fds: Vec<_>| {
        io::Error::other(format!(
            "an exec host's ready message carried {} descriptors, not 3",
            fds.len()
        ))
    })?;
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
        (_, None) => Err(io::Error::other(
            "a run child's first message carried no pidfd",
        )),
    }
}

/// One recvmsg(2) on a host's channel or a run's socket, with room for
/// the descriptors either sends at once.
fn receive(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    flags: MsgFlags,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    Ok(fd::receive_with_fds(socket, buffer, flags, RECEIVED_FDS)?)
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
            snapshot_bytes: None,
            left_out: Vec::new(),
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
}
