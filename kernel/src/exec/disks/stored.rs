//! Sessions with disks, as the kernel remembers them: each one's record
//! (beside its disk, `record`), found again when the kernel starts, kept up
//! to date as it is used, and what is to be restored onto it — a snapshot's
//! files before its next interpreter starts, the snapshot's globals for
//! that interpreter to load.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use agentos_proto::payload::{SessionInfo, SessionState};
use agentos_proto::{ErrorCode, ErrorReply};

use super::found::{self, Found};
use super::image::DiskDir;
use super::names::{disk_path, owner_dir_name};
use super::record::{seconds, SessionRecord, SnapshotRef};
use super::worker::SessionDisk;
use crate::clock::rfc3339;
use crate::exec::order::HIBERNATED;
use crate::exec::session_meta::{Ends, SessionMeta};
use crate::exec::waiting::SessionKey;
use crate::identity::Principal;

/// Every session with a disk, by owner and name.
#[derive(Debug)]
pub struct Stored {
    /// `<state>/sessions`.
    root: PathBuf,
    /// Each session's disk's size.
    session_bytes: u64,
    records: HashMap<SessionKey, SessionRecord>,
}

impl Stored {
    /// None yet, under `root`, each of `session_bytes`.
    pub fn new(root: PathBuf, session_bytes: u64) -> Stored {
        Stored {
            root,
            session_bytes,
            records: HashMap::new(),
        }
    }

    /// Takes in what an earlier kernel left: operators' sessions used
    /// within their retention; the rest is returned, to be removed.
    pub fn find(&mut self, retention_secs: u64) -> Found<SessionRecord> {
        let now = SystemTime::now();
        let retention = Duration::from_secs(retention_secs);
        let lasts = |record: &SessionRecord| {
            let unused = now.duration_since(record.last_used()).unwrap_or_default();
            retention_secs == 0 || unused < retention
        };
        let read = |dir: &DiskDir| SessionRecord::read(&dir.0).ok();
        let mut found = found::owned_disks(&self.root, read, lasts);
        for (key, _, record) in found.kept.drain(..) {
            self.records.insert(key, record);
        }
        found
    }

    /// Every record, by session.
    pub fn records(&self) -> &HashMap<SessionKey, SessionRecord> {
        &self.records
    }

    /// The directory of `owner`'s sessions.
    pub fn owner_dir(&self, owner: Principal) -> PathBuf {
        self.root.join(owner_dir_name(owner))
    }

    /// Session `key`'s directory.
    pub fn dir(&self, key: &SessionKey) -> DiskDir {
        DiskDir(disk_path(&self.root, key.0, &key.1))
    }

    /// Session `key`'s record, if it has a disk.
    pub fn record(&self, key: &SessionKey) -> Option<&SessionRecord> {
        self.records.get(key)
    }

    /// What session `key` was opened from, if it has been opened (on a
    /// disk): a template, or none.
    pub fn opened(&self, key: &SessionKey) -> Option<Option<String>> {
        self.records.get(key).map(|record| record.template.clone())
    }

    /// `owner`'s sessions, by name.
    pub fn keys_of(&self, owner: Principal) -> Vec<SessionKey> {
        let keys = self.records.keys().filter(|(o, _)| *o == owner);
        keys.cloned().collect()
    }

    /// How many sessions the owners `pick` picks hold.
    pub fn count_where(&self, pick: impl Fn(Principal) -> bool) -> usize {
        self.records
            .keys()
            .filter(|(owner, _)| pick(*owner))
            .count()
    }

    /// `open`, `owner`'s sessions with an interpreter, with their disks'
    /// sizes, and then its sessions stored on disk alone, oldest first.
    pub fn list(&self, owner: Principal, mut open: Vec<SessionInfo>) -> Vec<SessionInfo> {
        for info in &mut open {
            let key = (owner, info.session.clone());
            if self.records.contains_key(&key) {
                info.disk_bytes = Some(self.session_bytes);
                info.disk_used_bytes = self.dir(&key).used_bytes();
            }
        }
        let mut stored: Vec<SessionInfo> = (self.records.iter())
            .filter(|((o, name), _)| *o == owner && !open.iter().any(|i| &i.session == name))
            .map(|(key, record)| SessionInfo {
                session: key.1.clone(),
                created_at: rfc3339(record.created()),
                last_used_at: rfc3339(record.last_used()),
                runs: record.runs,
                workspace_bytes: record.workspace_bytes,
                state: if record.state_from.is_some() {
                    SessionState::Hibernated
                } else {
                    SessionState::Stored
                },
                disk_bytes: Some(self.session_bytes),
                disk_used_bytes: self.dir(key).used_bytes(),
                labels: record.meta.labels.clone(),
                ends_at: record.meta.ends.map(Ends::text),
                then: record.meta.ends.map(|ends| ends.then),
                limits: None,
                usage: None,
            })
            .collect();
        stored.sort_by(|a, b| (&a.created_at, &a.session).cmp(&(&b.created_at, &b.session)));
        open.extend(stored);
        open
    }

    /// Session `key`'s record, made now if it is new (opened from
    /// `template`), with the environment, labels and lifetime its
    /// interpreter was opened with (`meta`).
    pub fn opening(
        &mut self,
        key: &SessionKey,
        template: Option<String>,
        meta: SessionMeta,
    ) -> SessionRecord {
        let record = self.entry(key, template);
        record.meta = meta;
        record.clone()
    }

    /// Session `key`'s record, made now if it is new.
    fn entry(&mut self, key: &SessionKey, template: Option<String>) -> &mut SessionRecord {
        self.records
            .entry(key.clone())
            .or_insert_with(|| SessionRecord {
                template,
                ..SessionRecord::new(SystemTime::now())
            })
    }

    /// Session `key`'s disk as the disks' thread is given it, with
    /// `record`.
    pub fn disk(&self, key: &SessionKey, record: SessionRecord) -> SessionDisk {
        SessionDisk {
            dir: self.dir(key),
            bytes: self.session_bytes,
            record,
            owner: owner_dir_name(key.0),
            session: key.1.clone(),
        }
    }

    /// Session `key`'s disk with its record as it stands, if it has one.
    pub fn disk_of(&self, key: &SessionKey) -> Option<SessionDisk> {
        let record = self.records.get(key)?.clone();
        Some(self.disk(key, record))
    }

    /// An order of session `key` has ended: its record, brought up to
    /// date, to be written.
    pub fn note(
        &mut self,
        key: &SessionKey,
        runs: u64,
        last_used: SystemTime,
        bytes: Option<u64>,
    ) -> Option<(DiskDir, SessionRecord)> {
        let record = self.records.get_mut(key)?;
        record.runs = runs;
        record.last_used_at = seconds(last_used);
        if let Some(bytes) = bytes {
            record.workspace_bytes = bytes;
        }
        let record = record.clone();
        Some((self.dir(key), record))
    }

    /// Changes session `key`'s record: what `change` says, and the record
    /// to write.
    pub fn change_record<R>(
        &mut self,
        key: &SessionKey,
        change: impl FnOnce(&mut SessionRecord) -> R,
    ) -> Option<(R, DiskDir, SessionRecord)> {
        let record = self.records.get_mut(key)?;
        let changed = change(record);
        let record = record.clone();
        Some((changed, self.dir(key), record))
    }

    /// Gives session `key`, brought from the fleet as publication
    /// `generation`, the environment and labels `meta` (JSON, as another
    /// node published them; no lifetime) says, and its template; a `meta`
    /// that does not parse gives it none. Returns what it has now.
    pub fn carry(
        &mut self,
        key: &SessionKey,
        (meta, template): Carried<'_>,
        generation: i64,
    ) -> (SessionMeta, Option<String>) {
        let mut carried: SessionMeta = serde_json::from_slice(meta).unwrap_or_else(|err| {
            log::warn!(
                "session {:?}: its env and labels from the fleet do not parse: {err}",
                key.1
            );
            SessionMeta::default()
        });
        carried.ends = None;
        if let Some(record) = self.records.get_mut(key) {
            record.meta = carried.clone();
            record.template = template.clone();
            record.published = Some(generation);
        }
        (carried, template)
    }

    /// Forgets session `key`: its directory, to be removed, if it had one.
    pub fn remove(&mut self, key: &SessionKey) -> Option<DiskDir> {
        self.records.remove(key).map(|_| self.dir(key))
    }

    /// Session `key`'s next interpreter starts on its snapshot `name`: the
    /// files restored onto its disk first, and its globals (if it kept
    /// them, `state`) loaded.
    pub fn restore_next(&mut self, key: &SessionKey, name: &str, state: bool) {
        if let Some(record) = self.records.get_mut(key) {
            let from = SnapshotRef {
                session: key.1.clone(),
                name: name.to_owned(),
            };
            record.state_from = state.then(|| from.clone());
            record.restore_from = Some(from);
        }
    }

    /// Session `into` (made now if it is new, from `from`'s template) is
    /// to be restored from `from`'s snapshot `name`: its next interpreter
    /// loads the snapshot's globals (if it kept them, `state`) from its own
    /// copy of them, which the disks' thread keeps as `into`'s hibernation
    /// before it takes another job. Its disk, for the disks' thread to
    /// restore the files onto now, and whether it is new.
    pub fn restoring(
        &mut self,
        into: &SessionKey,
        from: &SessionKey,
        name: &str,
        state: bool,
    ) -> (SessionDisk, bool) {
        let template = self.records.get(from).and_then(|s| s.template.clone());
        let snapshot = SnapshotRef {
            session: from.1.clone(),
            name: name.to_owned(),
        };
        let new = !self.records.contains_key(into);
        let record = self.entry(into, template);
        record.state_from = state.then(|| SnapshotRef {
            session: into.1.clone(),
            name: HIBERNATED.to_owned(),
        });
        let restoring = SessionRecord {
            restore_from: Some(snapshot),
            ..record.clone()
        };
        (self.disk(into, restoring), new)
    }

    /// Whether session `key` has no interpreter and its next one starts
    /// with saved globals (hibernated, or a branch not yet run).
    pub fn is_hibernated(&self, key: &SessionKey) -> bool {
        self.records
            .get(key)
            .is_some_and(|r| r.state_from.is_some())
    }

    /// Session `key` has hibernated: its next interpreter starts with the
    /// globals of its snapshot `name`. Its record, to be written.
    pub fn hibernated(&mut self, key: &SessionKey, name: &str) -> Option<(DiskDir, SessionRecord)> {
        let record = self.records.get_mut(key)?;
        record.restore_from = None;
        record.state_from = Some(SnapshotRef {
            session: key.1.clone(),
            name: name.to_owned(),
        });
        let record = record.clone();
        Some((self.dir(key), record))
    }

    /// What was to be restored onto session `key`'s disk is done with: its
    /// record is now `written` (a restore without an interpreter), or has
    /// nothing more to restore.
    pub fn restored_onto(&mut self, key: &SessionKey, written: Option<SessionRecord>) {
        let Some(record) = self.records.get_mut(key) else {
            return;
        };
        match written {
            Some(written) => *record = written,
            None => {
                record.restore_from = None;
                record.state_from = None;
            }
        }
    }
}

/// What a session brought from the fleet carries: its environment and
/// labels (JSON, as published), and its template's name.
pub type Carried<'a> = (&'a [u8], Option<String>);

/// `not_found` for session `key`.
pub fn no_session(key: &SessionKey) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::NotFound,
        format!("no session {:?} (a run with `session` opens one)", key.1),
    )
}
