//! Sessions' snapshots as the kernel lists them. The snapshots themselves
//! lie on disk, in each owner's store (`disks::store`): this index, read
//! from the stores' manifests when the kernel starts and kept as snapshots
//! are taken and removed, answers `snapshots` and says which exist without
//! touching the disk on the reactor.
//!
//! A snapshot belongs to its session: removing it (`remove_snapshot`) or
//! closing the session deletes it, and an agent's or a run's go when it
//! ends. Each session keeps at most [`MAX_SNAPSHOTS`]; the bytes each
//! owner's store may take are `exec.snapshot_bytes`, counted on disk once
//! for a file any number of its snapshots hold.

use std::collections::HashMap;

use agentos_proto::payload::SnapshotInfo;
use agentos_proto::{ErrorCode, ErrorReply};

use crate::exec::waiting::SessionKey;

/// Snapshots one session may keep.
pub const MAX_SNAPSHOTS: usize = 16;

/// Every session's snapshots, oldest first.
#[derive(Debug, Default)]
pub struct Snapshots {
    kept: HashMap<SessionKey, Vec<SnapshotInfo>>,
}

impl Snapshots {
    /// Keeps `info` for session `key`, in place of one of its name.
    pub fn insert(&mut self, key: &SessionKey, info: SnapshotInfo) {
        let kept = self.kept.entry(key.clone()).or_default();
        kept.retain(|s| s.name != info.name);
        kept.push(info);
        kept.sort_by(|a, b| a.created_at.cmp(&b.created_at));
    }

    /// Forgets session `key`'s snapshots.
    pub fn remove_session(&mut self, key: &SessionKey) {
        self.kept.remove(key);
    }

    /// Forgets session `key`'s snapshot `name`: whether it had one.
    pub fn remove(&mut self, key: &SessionKey, name: &str) -> bool {
        let Some(kept) = self.kept.get_mut(key) else {
            return false;
        };
        let before = kept.len();
        kept.retain(|s| s.name != name);
        before != kept.len()
    }

    /// Session `key`'s snapshot `name`, else `not_found` naming it.
    pub fn find(&self, key: &SessionKey, name: &str) -> Result<&SnapshotInfo, ErrorReply> {
        self.kept
            .get(key)
            .and_then(|kept| kept.iter().find(|s| s.name == name))
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("session {:?} has no snapshot named {name:?}", key.1),
                )
            })
    }

    /// Session `key`'s snapshots, oldest first.
    pub fn list(&self, key: &SessionKey) -> Vec<SnapshotInfo> {
        self.kept.get(key).cloned().unwrap_or_default()
    }

    /// Whether session `key` may take one more snapshot named `name` (one
    /// that replaces another of that name always may).
    pub fn room_for(&self, key: &SessionKey, name: &str) -> Result<(), ErrorReply> {
        let kept = self.kept.get(key).map(Vec::as_slice).unwrap_or_default();
        if kept.len() >= MAX_SNAPSHOTS && !kept.iter().any(|s| s.name == name) {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session {:?} holds {} snapshots, the most one may; remove one \
                     ({{\"op\":\"remove_snapshot\"}}) or take it under an existing name to \
                     replace that one",
                    key.1,
                    kept.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Principal;

    fn info(name: &str, at: &str) -> SnapshotInfo {
        SnapshotInfo {
            name: name.into(),
            bytes: 1,
            created_at: at.into(),
            state: false,
        }
    }

    #[test]
    fn a_session_keeps_its_snapshots_by_name_within_its_cap() {
        let mut snapshots = Snapshots::default();
        let mine = (Principal::Operator { uid: 1 }, "s".to_owned());
        let theirs = (Principal::Operator { uid: 2 }, "s".to_owned());
        for n in 0..MAX_SNAPSHOTS {
            snapshots.insert(
                &mine,
                info(&format!("n{n}"), &format!("2026-01-01T00:00:{n:02}Z")),
            );
        }
        let over = snapshots.room_for(&mine, "another").unwrap_err();
        assert_eq!(over.code, ErrorCode::LimitExceeded);
        assert!(
            snapshots.room_for(&mine, "n3").is_ok(),
            "a replacement fits"
        );
        assert!(snapshots.room_for(&theirs, "another").is_ok());
        assert_eq!(
            snapshots.find(&theirs, "n3").unwrap_err().code,
            ErrorCode::NotFound
        );
        assert!(snapshots.remove(&mine, "n3"));
        assert!(!snapshots.remove(&mine, "n3"));
        assert_eq!(snapshots.list(&mine).len(), MAX_SNAPSHOTS - 1);
        assert_eq!(snapshots.list(&mine)[0].name, "n0", "oldest first");
        snapshots.remove_session(&mine);
        assert!(snapshots.list(&mine).is_empty());
    }
}
