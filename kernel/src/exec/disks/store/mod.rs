//! Snapshots on disk: each owner's store under `<state>/snapshots/<owner>/`
//! holds the contents of files by their BLAKE3 hash (`objects`) and one
//! manifest per snapshot (`sessions/<session>/<name>.json`) naming each
//! directory and file of it with its content's hash. Two snapshots that
//! differ by one file share every other object, and a file unchanged since
//! the session's last snapshot (same inode, size and change time) is not
//! read again.
//!
//! A snapshot is taken from the session's disk as the kernel mounted it
//! (`walk`): directories and regular files only, never through a symlink,
//! their modes made 0644 or 0755 (no setuid bit, no device is ever kept;
//! a hard link is one more file). The manifest is written last and renamed
//! into place, so a kernel killed midway leaves no snapshot — only objects
//! nothing names, removed when the kernel starts. Restoring (`restore`)
//! writes copies, checked, beside the disk's parts before it swaps them in.
//!
//! Everything here blocks; it runs on the disks' thread.

mod manifest;
mod objects;
mod restore;
mod walk;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use self::manifest::{remove_if_there, Damage, Entry, Hashes, ObjectError, StateRef};
pub use self::manifest::{Manifest, StoreError};
pub use self::objects::is_hash;
use self::objects::Objects;
use self::walk::Walk;
use super::image::RunUser;
use super::names::dir_name;

/// Where a snapshot lies in the store (see [`Store::files_of`]).
#[derive(Debug)]
pub struct SnapshotFiles {
    /// Its manifest's file.
    pub manifest: PathBuf,
    /// Each object it names, by hash, with the file that holds it.
    pub contents: Vec<(String, PathBuf)>,
    /// Bytes of its files.
    pub bytes: u64,
}

/// Bytes a snapshot may still add to the store.
#[derive(Clone, Copy, Debug)]
pub struct Room {
    /// Its owner's (`exec.snapshot_bytes` less what its store holds).
    pub owner: u64,
    /// Everyone's (`exec.snapshot_bytes_total` less what all stores hold,
    /// and within the host's free space).
    pub kernel: u64,
}

/// Every owner's store, beneath `<state>/snapshots`.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    /// Bytes each owner's objects take.
    held: HashMap<String, u64>,
}

impl Store {
    /// The stores beneath `root`, their objects not yet counted (see
    /// [`Store::collect`]: what a kernel killed midway left goes then).
    pub fn open(root: PathBuf) -> Store {
        Store {
            root,
            held: HashMap::new(),
        }
    }

    /// Where the stores lie.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The owners with a store.
    pub fn owners(&self) -> Vec<String> {
        let Ok(listed) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        listed
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect()
    }

    /// Bytes `owner`'s objects take.
    pub fn held_by(&self, owner: &str) -> u64 {
        // A delegate's (`uid-N~name`) count with its operator's, and all
        // that operator's delegates'.
        let quota_owner = |dir: &str| dir.split('~').next().unwrap_or(dir).to_owned();
        let counted = quota_owner(owner);
        (self.held.iter())
            .filter(|(dir, _)| quota_owner(dir) == counted)
            .map(|(_, bytes)| bytes)
            .sum()
    }

    /// Bytes every owner's objects take.
    pub fn held(&self) -> u64 {
        self.held.values().sum()
    }

    fn objects(&self, owner: &str) -> Objects {
        Objects::new(self.root.join(owner).join("objects"))
    }

    fn sessions_dir(&self, owner: &str) -> PathBuf {
        self.root.join(owner).join("sessions")
    }

    fn manifest_path(&self, owner: &str, session: &str, name: &str) -> PathBuf {
        let file = format!("{}.json", dir_name(name));
        self.sessions_dir(owner).join(dir_name(session)).join(file)
    }

    /// Every manifest of `owner`'s that reads whole; one cut short by a
    /// kernel killed midway is removed, one that does not read is named in
    /// the log and left.
    pub fn manifests(&self, owner: &str) -> Vec<Manifest> {
        let mut found = Vec::new();
        let Ok(sessions) = fs::read_dir(self.sessions_dir(owner)) else {
            return found;
        };
        for session in sessions.flatten() {
            for file in fs::read_dir(session.path()).into_iter().flatten().flatten() {
                let path = file.path();
                if path.extension().is_none_or(|e| e != "json") {
                    let _ = fs::remove_file(&path);
                    continue;
                }
                match manifest::read(&path) {
                    Ok(manifest) => found.push(manifest),
                    Err(err) => log::warn!("snapshot {}: {err}", path.display()),
                }
            }
        }
        found
    }

    /// `owner`'s snapshot `name` of `session`, read from its manifest.
    pub fn manifest(&self, owner: &str, session: &str, name: &str) -> Result<Manifest, StoreError> {
        let path = self.manifest_path(owner, session, name);
        manifest::read(&path).map_err(|err| StoreError::Damaged {
            name: name.to_owned(),
            why: Damage::Manifest(err),
        })
    }

    /// Takes snapshot `name` of `owner`'s `session`: the files of its disk
    /// mounted at `disk` (none: only its globals, a hibernation), with the
    /// pickled globals `state` holds if it was asked for them, within
    /// `room`. One of that name is replaced only once this one is whole.
    /// Returns it with the paths it left out.
    pub fn take(
        &mut self,
        (owner, session, name): (&str, &str, &str),
        disk: Option<&Path>,
        state: Option<&OwnedFd>,
        room: Room,
        now: u64,
    ) -> Result<(Manifest, Vec<String>), StoreError> {
        let known = self.known_files(owner, session);
        let objects = self.objects(owner);
        let room_is = if room.owner <= room.kernel {
            "your snapshots' room (exec.snapshot_bytes)"
        } else {
            "the kernel's room for snapshots (exec.snapshot_bytes_total, and the host's free disk)"
        };
        let mut walk = Walk::new(&objects, room.owner.min(room.kernel), room_is.to_owned());
        let walked = match disk {
            Some(disk) => walk.disk(disk, &known),
            None => Ok((Vec::new(), 0)),
        };
        let taken = walked.and_then(|(entries, bytes)| {
            let state = match state {
                Some(fd) => {
                    use std::io::Seek;
                    let mut file = File::from(fd.try_clone()?);
                    file.seek(std::io::SeekFrom::Start(0))?;
                    let (hash, bytes) = walk.put(file)?;
                    Some(StateRef { hash, bytes })
                }
                None => None,
            };
            Ok((entries, bytes, state))
        });
        let added_bytes = walk.added_bytes;
        let (left_out, added) = (walk.left_out, walk.added);
        let path = self.manifest_path(owner, session, name);
        let replaces = path.exists();
        let written = taken.and_then(|(entries, bytes, state)| {
            let manifest = Manifest {
                hashes: Hashes::Blake3,
                session: session.to_owned(),
                name: name.to_owned(),
                created_at: now,
                bytes,
                state,
                entries,
            };
            manifest::write(&path, &manifest)?;
            Ok(manifest)
        });
        match written {
            Ok(manifest) => {
                *self.held.entry(owner.to_owned()).or_default() += added_bytes;
                if replaces {
                    // What the snapshot it replaced held alone goes.
                    self.collect(owner)?;
                }
                Ok((manifest, left_out))
            }
            Err(err) => {
                for hash in added {
                    let _ = fs::remove_file(objects.path(&hash));
                }
                Err(err.into())
            }
        }
    }

    /// Keeps globals `state` (an object of `owner`'s) as snapshot `name` of
    /// `session`, with no files: what a branch's first interpreter loads.
    pub fn keep_state(
        &mut self,
        (owner, session, name): (&str, &str, &str),
        state: StateRef,
        created_at: u64,
    ) -> std::io::Result<()> {
        let manifest = Manifest {
            hashes: Hashes::Blake3,
            session: session.to_owned(),
            name: name.to_owned(),
            created_at,
            bytes: 0,
            state: Some(state),
            entries: Vec::new(),
        };
        manifest::write(&self.manifest_path(owner, session, name), &manifest)
    }

    /// What `owner`'s snapshots of `session` saw of each file, by path.
    fn known_files(&self, owner: &str, session: &str) -> HashMap<String, Entry> {
        let mut known = HashMap::new();
        let dir = self.sessions_dir(owner).join(dir_name(session));
        for file in fs::read_dir(dir).into_iter().flatten().flatten() {
            if let Ok(manifest) = manifest::read(&file.path()) {
                for entry in manifest.entries.into_iter().filter(|e| e.hash.is_some()) {
                    known.insert(entry.path.clone(), entry);
                }
            }
        }
        known
    }

    /// Restores `owner`'s snapshot `manifest` onto the disk mounted at
    /// `disk`, its files owned by `user`.
    pub fn restore(
        &self,
        owner: &str,
        manifest: &Manifest,
        disk: &Path,
        user: RunUser,
    ) -> Result<(), StoreError> {
        restore::restore(&self.objects(owner), manifest, disk, user)
    }

    /// A descriptor of `owner`'s state object `state` (of snapshot `name`),
    /// to be read by the session's sandbox alone; refused if it is cut
    /// short.
    pub fn open_state(
        &self,
        owner: &str,
        name: &str,
        state: &StateRef,
    ) -> Result<File, StoreError> {
        let damaged = |err| StoreError::Damaged {
            name: name.to_owned(),
            why: Damage::Object {
                path: "its interpreter state".to_owned(),
                err,
            },
        };
        let file = self.objects(owner).open(&state.hash).map_err(damaged)?;
        if file.metadata()?.len() != state.bytes {
            return Err(damaged(ObjectError::CutShort));
        }
        Ok(file)
    }

    /// Removes `owner`'s snapshots of `session` (`name`, or all of them),
    /// then the objects no snapshot names any more.
    pub fn remove(
        &mut self,
        owner: &str,
        session: &str,
        name: Option<&str>,
    ) -> std::io::Result<()> {
        self.forget(owner, session, name)?;
        self.collect(owner)
    }

    /// Removes `owner`'s manifests of `session`'s snapshots (`name`, or
    /// all of them), leaving their objects for [`Store::collect`].
    pub fn forget(&self, owner: &str, session: &str, name: Option<&str>) -> std::io::Result<()> {
        match name {
            Some(name) => remove_if_there(&self.manifest_path(owner, session, name)),
            None => remove_if_there(&self.sessions_dir(owner).join(dir_name(session))),
        }
    }

    /// Where `owner`'s snapshot `manifest` of `session` lies: its
    /// manifest's file, and each object it names with the file holding it.
    pub fn files_of(&self, owner: &str, manifest: &Manifest) -> SnapshotFiles {
        let objects = self.objects(owner);
        let mut named: Vec<String> = manifest.clone().objects().collect();
        named.sort_unstable();
        named.dedup();
        SnapshotFiles {
            manifest: self.manifest_path(owner, &manifest.session, &manifest.name),
            contents: (named.into_iter())
                .map(|hash| {
                    let path = objects.path(&hash);
                    (hash, path)
                })
                .collect(),
            bytes: manifest.bytes,
        }
    }

    /// Brings in a snapshot another node took, as `owner`'s snapshot `name`
    /// of `session`: its manifest (`manifest`, as that node wrote it) and
    /// the objects it names, each read from a file of `staging` named by
    /// its hash and checked against it, within `room`. Nothing is kept of
    /// one that is damaged or does not fit; `staging` goes either way.
    pub fn import(
        &mut self,
        (owner, session, name): (&str, &str, &str),
        manifest: &[u8],
        staging: &Path,
        room: Room,
    ) -> Result<Manifest, StoreError> {
        let damaged = |why: Damage| StoreError::Damaged {
            name: name.to_owned(),
            why,
        };
        let objects = self.objects(owner);
        let mut added = Vec::new();
        let mut added_bytes = 0u64;
        let limit = room.owner.min(room.kernel);
        let imported = (|| {
            let mut manifest: Manifest = serde_json::from_slice(manifest)
                .map_err(|err| damaged(Damage::Manifest(err.into())))?;
            (manifest.session, manifest.name) = (session.to_owned(), name.to_owned());
            for hash in manifest.clone().objects() {
                let missing = |err| {
                    let (path, hash) = (hash.clone(), hash.clone());
                    damaged(Damage::Object {
                        path,
                        err: ObjectError::Missing { hash, err },
                    })
                };
                if !objects::is_hash(&hash) {
                    return Err(missing(std::io::Error::other("it is not named by a hash")));
                }
                if objects.has(&hash) {
                    continue;
                }
                let file = File::open(staging.join(&hash)).map_err(missing)?;
                let left = limit.saturating_sub(added_bytes);
                let put = objects.put(file, |bytes| {
                    if bytes <= left {
                        return Ok(());
                    }
                    Err(std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        "it does not fit your snapshots' room (exec.snapshot_bytes), or the \
                         kernel's (exec.snapshot_bytes_total, and the host's free disk)",
                    ))
                })?;
                if put.added {
                    added.push(put.hash.clone());
                    added_bytes += put.bytes;
                }
                if put.hash != hash {
                    let path = hash.clone();
                    return Err(damaged(Damage::Object {
                        path,
                        err: ObjectError::Differs,
                    }));
                }
            }
            manifest::write(&self.manifest_path(owner, session, name), &manifest)?;
            Ok(manifest)
        })();
        let _ = remove_if_there(staging);
        match imported {
            Ok(manifest) => {
                *self.held.entry(owner.to_owned()).or_default() += added_bytes;
                Ok(manifest)
            }
            Err(err) => {
                for hash in added {
                    let _ = fs::remove_file(objects.path(&hash));
                }
                Err(err)
            }
        }
    }

    /// `owner`'s `session`, brought from another node as its snapshot
    /// `name` ([`Store::import`]), is made on its disk: its files are there
    /// now, and only its globals (if it `keeps_state`) stay here.
    pub fn made_from_import(
        &mut self,
        (owner, session, name): (&str, &str, &str),
        keeps_state: bool,
    ) {
        if !keeps_state {
            let _ = self.forget(owner, session, Some(name));
        }
        if let Err(err) = self.collect(owner) {
            log::warn!("snapshots of {owner}: {err}");
        }
    }

    /// Removes `owner`'s whole store.
    pub fn remove_owner(&mut self, owner: &str) -> std::io::Result<()> {
        self.held.remove(owner);
        remove_if_there(&self.root.join(owner))
    }

    /// Removes the objects of `owner`'s that no manifest names (and those
    /// cut short), and counts what is left.
    pub fn collect(&mut self, owner: &str) -> std::io::Result<()> {
        let named: HashSet<String> = self
            .manifests(owner)
            .into_iter()
            .flat_map(Manifest::objects)
            .collect();
        let mut held = 0;
        for (path, name, bytes) in self.objects(owner).list() {
            if named.contains(&name) {
                held += bytes;
            } else {
                remove_if_there(&path)?;
            }
        }
        self.held.insert(owner.to_owned(), held);
        Ok(())
    }
}
