//! Snapshots of a session's `/workspace`, as the kernel keeps them.
//!
//! A snapshot is taken by the session's own child, which writes its
//! directories and regular files as a gzip'd tar into a memfd the kernel
//! sends with the order; symlinks and special files are left out, never
//! followed. The kernel then seals the memfd (no write, grow or shrink
//! ever again: the child, whose code is the caller's, may still hold it)
//! and keeps it here. Nothing of it passes through the reactor, and its
//! pages are charged to the run's memory limit as they are written.
//!
//! Restoring restarts the interpreter: the session's child is killed and a
//! fresh one, from the ready pool, fills its empty `/workspace` from the
//! snapshot — only directories and regular files at plain relative paths,
//! each opened without following a symlink — and becomes the session's
//! child, with the session's queue, age and run count carried over (the
//! orders and their turns are `sessions`).
//!
//! Snapshots last as long as their session: closing it, or its interpreter
//! dying, deletes them. Each session keeps at most [`MAX_SNAPSHOTS`], each
//! owner at most `exec.snapshot_bytes` of them in all, and the kernel at
//! most [`MAX_SNAPSHOTS_TOTAL`] and `exec.snapshot_bytes_total`.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::time::SystemTime;

use agentos_proto::payload::{RestoredReply, SnapshotInfo, SnapshotReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::order::{Finished, Order};
use super::waiting::SessionKey;
use crate::address::Answer;
use crate::clock::rfc3339;

/// Snapshots one session may keep.
pub const MAX_SNAPSHOTS: usize = 16;
/// Snapshots all sessions together may keep (each holds a descriptor of
/// the kernel's).
pub const MAX_SNAPSHOTS_TOTAL: usize = 1024;

/// One snapshot: a sealed memfd holding a gzip'd tar.
#[derive(Debug)]
struct Snapshot {
    name: String,
    /// Bytes of the files in it.
    bytes: u64,
    /// Bytes it takes (compressed).
    stored: u64,
    created_at: SystemTime,
    data: OwnedFd,
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

/// Every session's snapshots, oldest first, within what one owner and the
/// kernel may keep.
#[derive(Debug)]
pub struct Snapshots {
    kept: HashMap<SessionKey, Vec<Snapshot>>,
    /// Bytes of snapshots one owner may keep (`exec.snapshot_bytes`).
    per_owner: u64,
    /// Bytes of snapshots everyone together may keep
    /// (`exec.snapshot_bytes_total`).
    in_all: u64,
}

impl Snapshots {
    /// None yet, with these caps on their bytes.
    pub fn new(per_owner: u64, in_all: u64) -> Snapshots {
        Snapshots {
            kept: HashMap::new(),
            per_owner,
            in_all,
        }
    }

    /// Deletes a session's snapshots: it has ended.
    pub fn remove(&mut self, key: &SessionKey) {
        self.kept.remove(key);
    }

    /// Whether session `key` may take one more snapshot named `name`
    /// (one that replaces another of that name always may): at most
    /// [`MAX_SNAPSHOTS`] of a session's, [`MAX_SNAPSHOTS_TOTAL`] in all.
    pub fn room_for(&self, key: &SessionKey, name: &str) -> Result<(), ErrorReply> {
        let held = self.kept.get(key).map_or(0, Vec::len);
        let replaces = self
            .kept
            .get(key)
            .is_some_and(|kept| kept.iter().any(|s| s.name == name));
        if held >= MAX_SNAPSHOTS && !replaces {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session {:?} holds {held} snapshots, the most one may; take it under an \
                     existing name to replace that one",
                    key.1
                ),
            ));
        }
        let total: usize = self.kept.values().map(Vec::len).sum();
        if total >= MAX_SNAPSHOTS_TOTAL && !replaces {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("the kernel holds {total} snapshots, the most it keeps; retry later"),
            ));
        }
        Ok(())
    }

    /// The memfd of session `key`'s snapshot named `name`, if it has one.
    pub fn data(&self, key: &SessionKey, name: &str) -> Option<&OwnedFd> {
        self.kept
            .get(key)
            .and_then(|kept| kept.iter().find(|s| s.name == name))
            .map(|snapshot| &snapshot.data)
    }

    /// A copy of the memfd of session `key`'s snapshot named `name`, for a
    /// restore.
    pub fn copy_of(&self, key: &SessionKey, name: &str) -> Result<OwnedFd, ErrorReply> {
        let snapshot = self.data(key, name).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!("session {:?} has no snapshot named {name:?}", key.1),
            )
        })?;
        snapshot.try_clone().map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot read the snapshot: {err}"),
            )
        })
    }

    /// Session `key`'s snapshots, oldest first.
    pub fn list(&self, key: &SessionKey) -> Vec<SnapshotInfo> {
        self.kept
            .get(key)
            .map(|kept| kept.iter().map(Snapshot::info).collect())
            .unwrap_or_default()
    }

    /// Seals a snapshot written by a session's child and keeps it (in
    /// place of one of the same name), within the owner's room and the
    /// kernel's.
    pub fn keep(
        &mut self,
        key: &SessionKey,
        name: String,
        data: OwnedFd,
        bytes: u64,
    ) -> Result<SnapshotInfo, ErrorReply> {
        let stored = seal(&data).map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!(
                    "cannot seal the snapshot (the session may still hold it open for \
                     writing): {err}"
                ),
            )
        })?;
        // The owner's snapshots, less the one this replaces.
        let replaced = name.as_str();
        let held: u64 = self
            .kept
            .iter()
            .filter(|(k, _)| k.0 == key.0)
            .flat_map(|(k, kept)| {
                kept.iter()
                    .filter(move |s| !(k == key && s.name == replaced))
            })
            .map(|s| s.stored)
            .sum();
        let (per_owner, in_all) = (self.per_owner, self.in_all);
        if held + stored > per_owner {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "this snapshot takes {stored} bytes and your snapshots {held} already, over \
                     exec.snapshot_bytes ({per_owner}); close a session or replace a snapshot"
                ),
            ));
        }
        let everyone: u64 = self.kept.values().flatten().map(|s| s.stored).sum();
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
        let kept = self.kept.entry(key.clone()).or_default();
        kept.retain(|s| s.name != snapshot.name);
        kept.push(snapshot);
        Ok(info)
    }

    /// The reply to a finished order of session `key`'s: a run's is its
    /// own, a snapshot's (kept here if it succeeded) or restore's says what
    /// was saved or restored.
    pub fn answer(&mut self, key: &SessionKey, finished: Finished) -> Answer {
        let failure = match (&finished.reply.exit_code, &finished.reply.error) {
            (Some(0), None) => None,
            (_, Some(error)) => Some(error.clone()),
            (_, None) => Some("the session's interpreter ended before it was done".to_owned()),
        };
        match finished.order {
            Order::Run => finished.reply.into(),
            Order::Restore { .. } => match failure {
                None => Answer::json(&RestoredReply {
                    success: true,
                    left_out: finished.left_out,
                }),
                Some(error) => ErrorReply::new(ErrorCode::Internal, error).into(),
            },
            Order::Snapshot { name, data } => {
                let bytes = finished.snapshot_bytes.unwrap_or(0);
                let taken = match failure {
                    None => self.keep(key, name, data, bytes),
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
}

/// A memfd for a snapshot to be written into, which may be sealed; the
/// error a client is told if none can be made.
pub fn fresh() -> Result<OwnedFd, ErrorReply> {
    memfd().map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot make room for the snapshot: {err}"),
        )
    })
}

/// A memfd for a snapshot to be written into, which may be sealed.
pub fn memfd() -> std::io::Result<OwnedFd> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Principal;

    fn written(bytes: usize) -> OwnedFd {
        let data = memfd().expect("a memfd");
        nix::unistd::write(&data, &vec![7u8; bytes]).expect("written");
        data
    }

    #[test]
    fn snapshots_are_sealed_and_kept_within_the_owners_room() {
        let mut snapshots = Snapshots::new(100, 150);
        let mine = (Principal::Operator { uid: 1 }, "s".to_owned());
        let theirs = (Principal::Operator { uid: 2 }, "s".to_owned());
        let info = snapshots
            .keep(&mine, "a".into(), written(60), 600)
            .expect("kept");
        assert_eq!((info.name.as_str(), info.bytes), ("a", 600));
        let data = snapshots.data(&mine, "a").expect("found");
        assert!(nix::unistd::write(data, b"x").is_err(), "sealed");
        // Replacing "a" frees its room; a second one would not fit.
        snapshots
            .keep(&mine, "a".into(), written(90), 9)
            .expect("replaced");
        let over = snapshots
            .keep(&mine, "b".into(), written(20), 2)
            .unwrap_err();
        assert!(
            over.error.contains("exec.snapshot_bytes (100)"),
            "{}",
            over.error
        );
        // The kernel's room is everyone's.
        let over = snapshots
            .keep(&theirs, "c".into(), written(70), 7)
            .unwrap_err();
        assert!(
            over.error.contains("snapshot_bytes_total (150)"),
            "{}",
            over.error
        );
        assert_eq!(snapshots.list(&mine).len(), 1);
        snapshots.remove(&mine);
        assert!(snapshots.list(&mine).is_empty());
        assert!(snapshots.room_for(&mine, "a").is_ok());
    }
}
