//! What an earlier kernel left beneath a directory of owners' disks
//! (`<state>/sessions`, `<state>/volumes`) and in the snapshots' store:
//! operators' disks with their records, kept; an agent's or a run's (which
//! end with it), and a disk never recorded, to be removed with the owners'
//! directories that go with them.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use agentos_proto::payload::SnapshotInfo;

use super::image::DiskDir;
use super::names::owner_of;
use super::store::Store;
use crate::exec::order::HIBERNATED;
use crate::exec::waiting::SessionKey;

/// What [`owned_disks`] found.
#[derive(Debug)]
pub struct Found<R> {
    /// Disks kept, each with its owner and name, and its record.
    pub kept: Vec<(SessionKey, DiskDir, R)>,
    /// Disks to remove.
    pub stale: Vec<DiskDir>,
    /// Owners' directories to remove, once their disks are.
    pub stale_owners: Vec<PathBuf>,
}

/// The disks beneath `root`: an operator's is kept if it has a disk and a
/// record (`read`) that `lasts`.
pub fn owned_disks<R>(
    root: &Path,
    read: impl Fn(&DiskDir) -> Option<R>,
    lasts: impl Fn(&R) -> bool,
) -> Found<R> {
    let mut found = Found {
        kept: Vec::new(),
        stale: Vec::new(),
        stale_owners: Vec::new(),
    };
    for owner_dir in fs::read_dir(root).into_iter().flatten().flatten() {
        let owner = owner_of(&owner_dir.file_name().to_string_lossy())
            .filter(|owner| owner.outlives_kernels());
        for disk in fs::read_dir(owner_dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = DiskDir(disk.path());
            let name = disk.file_name().to_string_lossy().into_owned();
            let record = owner.and_then(|_| read(&dir).filter(|r| dir.has_disk() && lasts(r)));
            match (owner, record) {
                (Some(owner), Some(record)) => found.kept.push(((owner, name), dir, record)),
                _ => found.stale.push(dir),
            }
        }
        if owner.is_none() {
            found.stale_owners.push(owner_dir.path());
        }
    }
    found
}

/// The snapshots in `store` of the sessions kept (`sessions`), to be
/// listed; the rest (an agent's or a run's, a closed session's) are
/// removed from it, and what each owner's store holds then is counted
/// once.
pub fn snapshots<R>(
    store: &mut Store,
    sessions: &HashMap<SessionKey, R>,
) -> Vec<(SessionKey, SnapshotInfo)> {
    let mut listed = Vec::new();
    for owner_dir in store.owners() {
        let Some(owner) = owner_of(&owner_dir).filter(|o| o.outlives_kernels()) else {
            if let Err(err) = store.remove_owner(&owner_dir) {
                log::warn!("snapshots of {owner_dir}: cannot remove them: {err}");
            }
            continue;
        };
        for manifest in store.manifests(&owner_dir) {
            let key = (owner, manifest.session.clone());
            if sessions.contains_key(&key) {
                // A hibernated session's globals are not one of its
                // snapshots (no client can give such a name).
                if manifest.name != HIBERNATED {
                    listed.push((key, manifest.info()));
                }
            } else if let Err(err) = store.forget(&owner_dir, &manifest.session, None) {
                log::warn!(
                    "snapshots of session {:?}: cannot remove them: {err}",
                    key.1
                );
            }
        }
        if let Err(err) = store.collect(&owner_dir) {
            log::warn!("snapshots of {owner_dir}: {err}");
        }
    }
    listed
}
