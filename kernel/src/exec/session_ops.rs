//! The operations on a session that run no code of the caller's —
//! snapshot, restore, hibernate (asked for, or when it is idle), wake —
//! and what they share: the memfd globals are pickled into, and
//! the refusal of an operation on a session without an interpreter.

use std::os::fd::OwnedFd;

use agentos_proto::{ErrorCode, ErrorReply};

use super::disks::{no_session, Asked, SessionDisks};
use super::order::Order;
use super::queues::Share;
use super::requests::Requests;
use super::sessions::Sessions;
use super::waiting::SessionKey;
use crate::address::ReplyTo;

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
    /// It hibernates: the order is queued (a paused session is to be let
    /// go for it).
    Hibernates,
}

/// The order `op` asks of session `key` (among `sessions`; one `requests`
/// are opening is busy), to wait its turn in the
/// session's queue; or none, the disks' thread asked to do it (a
/// snapshot or restore of a session without an interpreter, a branch)
/// and to answer `reply_to`.
pub fn order_for(
    (key, op, share, reply_to): (&SessionKey, SessionOp<'_>, Share, ReplyTo),
    sessions: &Sessions,
    requests: &Requests,
    disks: &mut SessionDisks,
) -> Result<Option<Order>, ErrorReply> {
    disks.require("snapshots")?;
    let open = sessions.contains(key);
    if !open && disks.stored.record(key).is_none() {
        return Err(no_session(key));
    }
    if !open && requests.sessions().any(|k| k == key) {
        return Err(ErrorReply::new(
            ErrorCode::Busy,
            format!(
                "session {:?} is being opened by a run; retry once it has run",
                key.1
            ),
        ));
    }
    let asked = Asked {
        key: key.clone(),
        reply_to,
        not_saved: Vec::new(),
        hibernate: false,
        fleet: false,
    };
    match op {
        SessionOp::Hibernate if open => return Ok(Some(Order::hibernate(memfd()?))),
        SessionOp::Hibernate | SessionOp::Wake => {
            let hibernated = disks.stored.is_hibernated(key);
            return match (op, hibernated) {
                (SessionOp::Wake, true) => {
                    sessions.may_open(key.0, requests.sessions())?;
                    Ok(Some(Order::Wake))
                }
                (SessionOp::Hibernate, true) => Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!("session {:?} is hibernated already", key.1),
                )),
                _ => Err(no_interpreter(key, op)),
            };
        }
        SessionOp::Snapshot { name, state } => {
            disks.snapshots.room_for(key, name)?;
            if open {
                let state = if state { Some(memfd()?) } else { None };
                let name = name.to_owned();
                let hibernate = false;
                return Ok(Some(Order::Snapshot {
                    name,
                    state,
                    hibernate,
                }));
            }
            if state {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!(
                        "EXEC field `state`: session {:?} has no interpreter running (it is \
                         stored on its disk), so it has no globals to save; take the \
                         snapshot without `state`",
                        key.1
                    ),
                ));
            }
            disks.take_snapshot(name.to_owned(), None, asked)?;
        }
        SessionOp::Restore { name, into: None } => {
            disks.snapshots.find(key, name)?;
            if open {
                let name = name.to_owned();
                return Ok(Some(Order::Restore { name }));
            }
            disks.restore_onto(key, name, asked);
        }
        SessionOp::Restore {
            name,
            into: Some(into),
        } => {
            disks.snapshots.find(key, name)?;
            let branch = (key.0, into.to_owned());
            let opening = requests.sessions().any(|k| *k == branch);
            if sessions.contains(&branch) || disks.stored.record(&branch).is_some() || opening {
                return Err(ErrorReply::new(
                    ErrorCode::AlreadyExists,
                    format!(
                        "EXEC field `into`: session {into:?} exists; a branch is restored \
                         into a new session (close that one first, or name another)"
                    ),
                ));
            }
            disks.may_make(&branch, share, requests.sessions())?;
            disks.restore_onto(&branch, name, asked);
        }
    }
    Ok(None)
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
