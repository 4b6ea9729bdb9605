//! A snapshot's manifest: the directories and files it holds, each file by
//! its content's hash, and the interpreter state it keeps. Written whole
//! to a new file and renamed into place.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use std::time::{Duration, UNIX_EPOCH};

use agentos_proto::payload::SnapshotInfo;
use serde::{Deserialize, Serialize};

use crate::clock::rfc3339;

/// What a manifest or object is called while it is written.
pub const BEING_WRITTEN: &str = ".new";

/// One directory or file of a snapshot, beneath a disk's root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its path beneath the disk's root (`workspace/a/b.txt`).
    pub path: String,
    /// Its content's hash; none for a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Its size in bytes.
    #[serde(default)]
    pub size: u64,
    /// It may be executed (0755, else 0644).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exec: bool,
    /// Its inode and change time (ns) when it was read: a file with both
    /// unchanged at the next snapshot is not read again.
    #[serde(default)]
    pub seen: (u64, i64),
}

/// The interpreter state a snapshot keeps: an object of pickled globals,
/// unpickled only inside the session's sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRef {
    /// Its hash.
    pub hash: String,
    /// Its bytes.
    pub bytes: u64,
}

/// How a manifest's objects are named: by their BLAKE3 hash. A manifest
/// that does not say so is refused as one that does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hashes {
    /// BLAKE3, in hex.
    #[serde(rename = "blake3")]
    Blake3,
}

/// A snapshot as its manifest says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// How its objects are named.
    pub hashes: Hashes,
    /// The session it was taken of.
    pub session: String,
    /// Its name.
    pub name: String,
    /// When it was taken, in seconds since the epoch.
    pub created_at: u64,
    /// Bytes of the files in it.
    pub bytes: u64,
    /// The interpreter's globals, when it was taken with `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateRef>,
    /// Its directories and files, each directory before what it holds.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// It, as `snapshots` lists it.
    pub fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            name: self.name.clone(),
            bytes: self.bytes,
            created_at: rfc3339(UNIX_EPOCH + Duration::from_secs(self.created_at)),
            state: self.state.is_some(),
        }
    }

    /// The hashes of the objects it names.
    pub fn objects(self) -> impl Iterator<Item = String> {
        let state = self.state.map(|s| s.hash);
        self.entries.into_iter().filter_map(|e| e.hash).chain(state)
    }
}

/// Why a manifest cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// It cannot be read.
    #[error("its manifest cannot be read: {0}")]
    Read(#[from] io::Error),
    /// It does not parse (cut short, or changed).
    #[error("its manifest does not parse: {0}")]
    Parse(#[from] serde_json::Error),
}

/// Reads the manifest at `path`.
pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
    Ok(serde_json::from_slice(&fs::read(path)?)?)
}

/// Writes `manifest` to a new file beside `path`, then renames it over
/// `path`: a reader sees the old whole or the new whole.
pub fn write(path: &Path, manifest: &Manifest) -> io::Result<()> {
    let bytes = serde_json::to_vec(manifest).map_err(io::Error::from)?;
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let temporary = path.with_extension(BEING_WRITTEN.trim_start_matches('.'));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)?;
    if let Err(err) = file.write_all(&bytes) {
        let _ = fs::remove_file(&temporary);
        return Err(err);
    }
    fs::rename(&temporary, path)
}

/// Why a snapshot could not be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// It would take the owner past its room, or the host's disk is full.
    #[error("{0}")]
    Full(String),
    /// It is damaged: a manifest or object is not what it should be.
    #[error("snapshot {name:?} is damaged ({why}); it is refused and nothing was changed")]
    Damaged {
        /// The snapshot.
        name: String,
        /// What is wrong.
        why: Damage,
    },
    /// Reading or writing failed.
    #[error("{0}")]
    Io(io::Error),
}

impl From<io::Error> for StoreError {
    /// A full disk, or a full room, is the owner's to hear of as a limit.
    fn from(err: io::Error) -> StoreError {
        if err.kind() == io::ErrorKind::StorageFull {
            // What was left as it was is the caller's to say.
            let why = match err.raw_os_error() {
                Some(_) => "the host's disk is full".to_owned(),
                None => err.to_string(),
            };
            return StoreError::Full(why);
        }
        StoreError::Io(err)
    }
}

/// What is wrong with a damaged snapshot.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    /// Its manifest.
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    /// An entry's path is not a plain one beneath a part of the disk.
    #[error("{0:?} is not a plain path")]
    NotPlain(String),
    /// An entry could not be written where it goes (named twice, say).
    #[error("{path:?}: {err}")]
    Entry {
        /// The entry's path.
        path: String,
        /// Why.
        err: io::Error,
    },
    /// An object is missing, or is not what was saved.
    #[error("{path:?}: {err}")]
    Object {
        /// The entry's path (or what the object holds).
        path: String,
        /// Why.
        err: ObjectError,
    },
}

/// Why an object cannot be copied out as it was saved.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// It cannot be read.
    #[error("object {hash}: {err}")]
    Missing {
        /// Its hash.
        hash: String,
        /// Why.
        err: io::Error,
    },
    /// Copying it failed.
    #[error("{0}")]
    Copy(io::Error),
    /// Its content is not what was saved.
    #[error("its content is not what was saved")]
    Differs,
    /// It is cut short.
    #[error("it is cut short")]
    CutShort,
}

/// Removes what is at `path`, whatever it is, if anything is.
pub fn remove_if_there(path: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    match removed {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}
