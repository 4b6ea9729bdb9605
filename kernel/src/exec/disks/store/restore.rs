//! Restoring a snapshot onto a session's disk: a copy of each object
//! (never a link: a sandbox must not reach the store) written into a
//! directory beside the disk's parts, every path checked as it goes and
//! every object's hash checked on a thread of its own meanwhile, and only
//! then swapped for the parts. A damaged snapshot is refused by name and
//! the disk is left as it was.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::manifest::{remove_if_there, Damage, Manifest, ObjectError, StoreError};
use super::objects::Objects;
use super::walk::SNAPSHOT_PARTS;
use crate::exec::disks::image::RunUser;

/// Where a restore is written on a disk before it replaces the parts.
const RESTORING: &str = ".restoring";
/// Where a part replaced by a restore goes until it is removed.
const REPLACED: &str = ".replaced";

/// Restores `manifest` from `objects` onto the disk mounted at `disk`, its
/// files owned by `user`.
pub fn restore(
    objects: &Objects,
    manifest: &Manifest,
    disk: &Path,
    user: RunUser,
) -> Result<(), StoreError> {
    let staging = disk.join(RESTORING);
    remove_if_there(&staging)?;
    fs::DirBuilder::new().mode(0o700).create(&staging)?;
    if let Err(err) = write_entries(objects, manifest, &staging, user) {
        let _ = fs::remove_dir_all(&staging);
        return Err(err);
    }
    for part in SNAPSHOT_PARTS {
        let (old, new) = (disk.join(part), staging.join(part));
        let replaced = disk.join(format!("{REPLACED}-{part}"));
        remove_if_there(&replaced)?;
        if old.exists() {
            fs::rename(&old, &replaced)?;
        }
        fs::rename(&new, &old)?;
        remove_if_there(&replaced)?;
    }
    remove_if_there(&staging)?;
    Ok(())
}

/// Writes `manifest`'s entries beneath `staging` while a second thread
/// checks the objects they are copied from: the copy and the check each
/// read every byte, so side by side they take the time of one.
fn write_entries(
    objects: &Objects,
    manifest: &Manifest,
    staging: &Path,
    user: RunUser,
) -> Result<(), StoreError> {
    let give_up = Arc::new(AtomicBool::new(false));
    let files: Vec<(usize, String, u64)> = (manifest.entries.iter().enumerate())
        .filter_map(|(at, entry)| Some((at, entry.hash.clone()?, entry.size)))
        .collect();
    let checking = {
        let (objects, give_up) = (objects.clone(), Arc::clone(&give_up));
        agentos_primitives::threads::spawn("agentos-snapshot-check", move || {
            check_objects(&objects, &files, &give_up)
        })?
    };
    let copied = copy_entries(objects, manifest, staging, user, &give_up);
    if copied.is_err() {
        give_up.store(true, Ordering::Relaxed);
    }
    let checked = checking
        .join()
        .map_err(|_| std::io::Error::other("the thread checking a snapshot's objects panicked"))?;
    // A damaged object is the reason a copy of it failed, if one did.
    if let Err((at, err)) = checked {
        let path = manifest.entries[at].path.clone();
        return Err(damaged(manifest, Damage::Object { path, err }));
    }
    copied
}

/// Checks each of `files` (an entry's place, its object and size) until
/// one is not what was saved, or until told to give up.
fn check_objects(
    objects: &Objects,
    files: &[(usize, String, u64)],
    give_up: &AtomicBool,
) -> Result<(), (usize, ObjectError)> {
    for (at, hash, size) in files {
        if give_up.load(Ordering::Relaxed) {
            break;
        }
        if let Err(err) = objects.check(hash, *size) {
            give_up.store(true, Ordering::Relaxed);
            return Err((*at, err));
        }
    }
    Ok(())
}

fn copy_entries(
    objects: &Objects,
    manifest: &Manifest,
    staging: &Path,
    user: RunUser,
    give_up: &AtomicBool,
) -> Result<(), StoreError> {
    let unwritable = |path: &str, err| Damage::Entry {
        path: path.to_owned(),
        err,
    };
    for part in SNAPSHOT_PARTS {
        make_owned_dir(&staging.join(part), 0o700, user)?;
    }
    for entry in &manifest.entries {
        if give_up.load(Ordering::Relaxed) {
            // The check found an object damaged: that is the error.
            return Ok(());
        }
        let relative = plain_path(&entry.path)
            .ok_or_else(|| damaged(manifest, Damage::NotPlain(entry.path.clone())))?;
        let target = staging.join(relative);
        let Some(hash) = &entry.hash else {
            make_owned_dir(&target, 0o755, user)
                .map_err(|err| damaged(manifest, unwritable(&entry.path, err)))?;
            continue;
        };
        let mode = if entry.exec { 0o755 } else { 0o644 };
        let sink = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(|err| damaged(manifest, unwritable(&entry.path, err)))?;
        objects.copy_out(hash, entry.size, &sink).map_err(|err| {
            let path = entry.path.clone();
            damaged(manifest, Damage::Object { path, err })
        })?;
        // The mode asked at creation is masked: set it whole.
        sink.set_permissions(fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::fchown(&sink, Some(user.uid), Some(user.gid))?;
    }
    Ok(())
}

fn damaged(manifest: &Manifest, why: Damage) -> StoreError {
    StoreError::Damaged {
        name: manifest.name.clone(),
        why,
    }
}

/// `path` if it is plain components beneath a part a snapshot covers: no
/// `..`, `.`, empty or absolute component.
fn plain_path(path: &str) -> Option<&Path> {
    let mut parts = path.split('/');
    let first = parts.next()?;
    let plain = SNAPSHOT_PARTS.contains(&first)
        && parts.clone().next().is_some()
        && parts.all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'));
    plain.then(|| Path::new(path))
}

/// Makes directory `path` (not one that is there: a manifest naming one
/// twice is damaged), owned by `user`.
fn make_owned_dir(path: &Path, mode: u32, user: RunUser) -> std::io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_beneath_a_part_are_restored() {
        assert!(plain_path("workspace/a/b.txt").is_some());
        assert!(plain_path("home/.venv/bin/pip").is_some());
        for hostile in [
            "workspace",
            "tmp/x",
            "/etc/passwd",
            "workspace/../../etc",
            "workspace//x",
            "workspace/./x",
            "..",
            "",
            "workspace/a\0b",
        ] {
            assert!(plain_path(hostile).is_none(), "{hostile:?}");
        }
    }
}
