//! Snapshots of a session's `/workspace`, and restoring one.
//!
//! A snapshot is taken by the session's own child, which writes its
//! directories and regular files as a gzip'd tar into a memfd the kernel
//! sends with the order; symlinks and special files are left out, never
//! followed. The kernel then seals the memfd (no write, grow or shrink
//! ever again: the child, whose code is the caller's, may still hold it)
//! and keeps it. Nothing of it passes through the reactor, and its pages
//! are charged to the run's memory limit as they are written.
//!
//! Restoring restarts the interpreter: the session's child is killed and a
//! fresh one, from the ready pool, fills its empty `/workspace` from the
//! snapshot — only directories and regular files at plain relative paths,
//! each opened without following a symlink — and becomes the session's
//! child, with the session's queue, age and run count carried over.
//!
//! Snapshots last as long as their session: closing it, or its interpreter
//! dying, deletes them. Each session keeps at most [`MAX_SNAPSHOTS`], each
//! owner at most `exec.snapshot_bytes` of them in all, and the kernel at
//! most [`MAX_SNAPSHOTS_TOTAL`] and `exec.snapshot_bytes_total`.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{ExecRequest, RestoredReply, SnapshotInfo, SnapshotReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::run::{Finished, Work};
use super::sessions::{RunAsk, SessionKey};
use super::{Exec, RunCaller, Waiting};
use crate::address::{Answer, Reply, ReplyTo};
use crate::clock::rfc3339;
use crate::identity::Principal;

/// Snapshots one session may keep.
pub const MAX_SNAPSHOTS: usize = 16;
/// Snapshots all sessions together may keep (each holds a descriptor of
/// the kernel's).
pub const MAX_SNAPSHOTS_TOTAL: usize = 1024;

/// One snapshot: a sealed memfd holding a gzip'd tar.
#[derive(Debug)]
pub(super) struct Snapshot {
    name: String,
    /// Bytes of the files in it.
    bytes: u64,
    /// Bytes it takes (compressed).
    stored: u64,
    created_at: SystemTime,
    data: OwnedFd,
}

/// What a session carries from its old child to the fresh one a restore
/// gives it.
#[derive(Debug)]
pub(super) struct Carried {
    pub(super) created_at: SystemTime,
    pub(super) runs: u64,
    pub(super) queue: VecDeque<Waiting>,
    pub(super) grant: RunAsk,
}

impl Exec {
    /// `op: snapshot`: queued behind the session's runs; answered once the
    /// session's child has written it.
    pub fn snapshot(
        &mut self,
        caller: RunCaller,
        session: &str,
        name: &str,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let key = (caller.principal, session.to_owned());
        self.live_session(&key)?;
        let held = self.snapshots.get(&key).map_or(0, Vec::len);
        let replaces = self
            .snapshots
            .get(&key)
            .is_some_and(|kept| kept.iter().any(|s| s.name == name));
        if held >= MAX_SNAPSHOTS && !replaces {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session {session:?} holds {held} snapshots, the most one may; take it \
                     under an existing name to replace that one"
                ),
            ));
        }
        let total: usize = self.snapshots.values().map(Vec::len).sum();
        if total >= MAX_SNAPSHOTS_TOTAL && !replaces {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("the kernel holds {total} snapshots, the most it keeps; retry later"),
            ));
        }
        let data = memfd().map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot make room for the snapshot: {err}"),
            )
        })?;
        let work = Work::Snapshot {
            name: name.to_owned(),
            data,
        };
        self.queue_for_session(key, caller, work, reply_to, replies)
    }

    /// `op: restore`: queued behind the session's runs; then the session
    /// gets a fresh interpreter whose `/workspace` is the snapshot's.
    pub fn restore(
        &mut self,
        caller: RunCaller,
        session: &str,
        name: &str,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let key = (caller.principal, session.to_owned());
        self.live_session(&key)?;
        let snapshot = self
            .snapshots
            .get(&key)
            .and_then(|kept| kept.iter().find(|s| s.name == name))
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("session {session:?} has no snapshot named {name:?}"),
                )
            })?;
        let data = snapshot.data.try_clone().map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot read the snapshot: {err}"),
            )
        })?;
        self.queue_for_session(key, caller, Work::Restore { data }, reply_to, replies)
    }

    /// `op: snapshots`: a session's snapshots, oldest first.
    pub fn snapshots(
        &self,
        owner: Principal,
        session: &str,
    ) -> Result<Vec<SnapshotInfo>, ErrorReply> {
        let key = (owner, session.to_owned());
        self.live_session(&key)?;
        Ok(self
            .snapshots
            .get(&key)
            .map(|kept| kept.iter().map(Snapshot::info).collect())
            .unwrap_or_default())
    }

    fn live_session(&self, key: &SessionKey) -> Result<(), ErrorReply> {
        if self.sessions.contains_key(key) {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!("no session {:?} (a run with `session` opens one)", key.1),
        ))
    }

    fn queue_for_session(
        &mut self,
        key: SessionKey,
        caller: RunCaller,
        work: Work,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let now = Instant::now();
        let limits = self.run_limits(&caller, None)?;
        self.may_wait(caller.share)?;
        let waiting = Waiting {
            request: ExecRequest {
                session: Some(key.1.clone()),
                ..ExecRequest::default()
            },
            reply_to,
            owner: caller.principal,
            share: caller.share,
            run: None,
            charged_to: caller.charged_to,
            limits,
            timeout: self.default_timeout,
            deadline: now + self.default_timeout,
            session: Some(key.clone()),
            work,
            carried: None,
            queued_at: now,
        };
        if let Some(session) = self.sessions.get_mut(&key) {
            session.queue.push_back(waiting);
        }
        self.serve_session(&key, replies, now);
        Ok(())
    }

    /// A restore's turn has come: the session's child goes, and the
    /// restore waits first in line for a fresh one, carrying the session.
    pub(super) fn begin_restore(
        &mut self,
        key: &SessionKey,
        mut waiting: Waiting,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let Some(session) = self.sessions.remove(key) else {
            return;
        };
        if let Some(child) = self.children.get(session.child) {
            child.kill_quietly();
        }
        self.drop_child(session.child);
        waiting.carried = Some(Carried {
            created_at: session.created_at,
            runs: session.runs,
            queue: session.queue,
            grant: session.grant,
        });
        self.queues.push_front(waiting.share, waiting);
        self.dispatch(replies, now);
    }

    /// The reply to a finished order of a session's: a run's is its own,
    /// a snapshot's or restore's says what was saved or restored.
    pub(super) fn snapshot_reply(&mut self, key: &SessionKey, finished: Finished) -> Answer {
        let failure = match (&finished.reply.exit_code, &finished.reply.error) {
            (Some(0), None) => None,
            (_, Some(error)) => Some(error.clone()),
            (_, None) => Some("the session's interpreter ended before it was done".to_owned()),
        };
        match finished.work {
            Work::Run => finished.reply.into(),
            Work::Restore { .. } => match failure {
                None => Answer::json(&RestoredReply {
                    success: true,
                    left_out: finished.left_out,
                }),
                Some(error) => ErrorReply::new(ErrorCode::Internal, error).into(),
            },
            Work::Snapshot { name, data } => {
                let taken = match failure {
                    None => self.keep(key, name, data, finished.snapshot_bytes.unwrap_or(0)),
                    Some(error) => Err(ErrorReply::new(ErrorCode::Internal, error)),
                };
                match taken {
                    Ok(snapshot) => Answer::json(&SnapshotReply {
                        success: true,
                        snapshot,
                        left_out: finished.left_out,
                    }),
                    Err(err) => err.into(),
                }
            }
        }
    }

    /// Seals a snapshot written by a session's child and keeps it, within
    /// the owner's room.
    fn keep(
        &mut self,
        key: &SessionKey,
        name: String,
        data: OwnedFd,
        bytes: u64,
    ) -> Result<SnapshotInfo, ErrorReply> {
        let stored = seal(&data).map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot seal the snapshot (the session may still hold it open for writing): {err}"),
            )
        })?;
        // The owner's snapshots, less the one this replaces.
        let replaced = name.as_str();
        let held: u64 = self
            .snapshots
            .iter()
            .filter(|(k, _)| k.0 == key.0)
            .flat_map(|(k, kept)| {
                kept.iter()
                    .filter(move |s| !(k == key && s.name == replaced))
            })
            .map(|s| s.stored)
            .sum();
        let (per_owner, in_all) = self.snapshot_bytes;
        if held + stored > per_owner {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this snapshot takes {stored} bytes and your snapshots {held} already, over \
                     exec.snapshot_bytes ({per_owner}); close a session or replace a snapshot"
                ),
            ));
        }
        let everyone: u64 = self.snapshots.values().flatten().map(|s| s.stored).sum();
        if everyone + stored > in_all {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this snapshot takes {stored} bytes and the kernel holds {everyone} of \
                     snapshots already, over exec.snapshot_bytes_total ({in_all}); retry later"
                ),
            ));
        }
        let snapshot = Snapshot {
            name,
            bytes,
            stored,
            created_at: SystemTime::now(),
            data,
        };
        let info = snapshot.info();
        let kept = self.snapshots.entry(key.clone()).or_default();
        kept.retain(|s| s.name != snapshot.name);
        kept.push(snapshot);
        Ok(info)
    }
}

impl Snapshot {
    fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            name: self.name.clone(),
            bytes: self.bytes,
            created_at: rfc3339(self.created_at),
        }
    }
}

fn memfd() -> std::io::Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    Ok(memfd_create(
        c"agentos-snapshot",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?)
}

/// Seals a memfd against any change; returns its size.
fn seal(data: &OwnedFd) -> std::io::Result<u64> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    let seals = SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_SEAL;
    fcntl(data.as_fd(), FcntlArg::F_ADD_SEALS(seals))?;
    Ok(nix::sys::stat::fstat(data.as_fd())?.st_size as u64)
}
