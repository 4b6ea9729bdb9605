//! The operations on a session that run no code of the caller's —
//! snapshot, restore, hibernate (asked for, or when it is idle), wake —
//! and what they share: the memfd globals are pickled into, and
//! the refusal of an operation on a session without an interpreter.

use std::os::fd::OwnedFd;

use agentos_proto::{ErrorCode, ErrorReply};

use super::waiting::SessionKey;

/// An operation on a session that runs no code of the caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionOp<'a> {
    /// `op: snapshot`: save the session's files (and globals, with
    /// `state`) under `name`.
    Snapshot {
        /// The snapshot's name.
        name: &'a str,
        /// Save the interpreter's globals too.
        state: bool,
    },
    /// `op: restore`: put back the files (and globals) saved under `name`,
    /// or restore them `into` a new session.
    Restore {
        /// The snapshot's name.
        name: &'a str,
        /// The new session to restore into.
        into: Option<&'a str>,
    },
    /// PAUSE with `hibernate`: save the globals, end the interpreter.
    Hibernate,
    /// RESUME of a hibernated session: a fresh interpreter, with its
    /// globals.
    Wake,
}

/// What becomes of a session whose idle time has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// It has been used since.
    Used,
    /// Its interpreter ends.
    Ends,
    /// It hibernates: the order is queued.
    Hibernates,
}

/// `bad_request`: session `key` has no interpreter running for `op`.
pub fn no_interpreter(key: &SessionKey, op: SessionOp<'_>) -> ErrorReply {
    let what = match op {
        SessionOp::Wake => "resume",
        SessionOp::Hibernate => "pause or hibernate",
        SessionOp::Snapshot { .. } | SessionOp::Restore { .. } => "do that to",
    };
    ErrorReply::new(
        ErrorCode::BadRequest,
        format!(
            "session {:?} has no interpreter running (it is stored on its disk; its next run \
             starts one): there is nothing to {what}",
            key.1
        ),
    )
}

/// A memfd for a session's globals to be pickled into.
pub fn memfd() -> Result<OwnedFd, ErrorReply> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    memfd_create(c"agentos-globals", MFdFlags::MFD_CLOEXEC).map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot make room for the session's globals: {err}"),
        )
    })
}
