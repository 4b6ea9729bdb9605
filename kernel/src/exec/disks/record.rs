//! What the kernel remembers of a disk beside it: of a session
//! (`session.json`), when it was opened and last used, its runs, the bytes
//! its `/workspace` held, its template; of a template (`template.json`),
//! when and from what it was built; of a volume (`volume.json`), when it
//! was made and its size. Written whole to a new file and renamed
//! over the old, so a kernel killed while writing leaves the old record.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::exec::session_meta::SessionMeta;

const RECORD: &str = "session.json";
const TEMPLATE_RECORD: &str = "template.json";
const VOLUME_RECORD: &str = "volume.json";
/// What a record is called while it is written.
const BEING_WRITTEN: &str = ".new";

/// A session's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// When it was opened, in seconds since the epoch.
    pub created_at: u64,
    /// When a run of it last started, in seconds since the epoch.
    pub last_used_at: u64,
    /// Its runs so far.
    pub runs: u64,
    /// Bytes of files in its `/workspace` after its last run.
    pub workspace_bytes: u64,
    /// The template it was opened from, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A snapshot whose files its disk is given before its next
    /// interpreter starts (a restore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<SnapshotRef>,
    /// A snapshot whose globals its next interpreter starts with (a
    /// restore, a branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_from: Option<SnapshotRef>,
    /// Its environment, labels and lifetime (`open`).
    #[serde(flatten)]
    pub meta: SessionMeta,
    /// The fleet keeps its hibernation, as this publication, which is
    /// claimed before it wakes here (docs/fleet.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<i64>,
}

/// A snapshot of one of the owner's sessions, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    /// The session it was taken of.
    pub session: String,
    /// Its name.
    pub name: String,
}

impl SessionRecord {
    /// A session opened now.
    pub fn new(now: SystemTime) -> SessionRecord {
        let at = seconds(now);
        SessionRecord {
            created_at: at,
            last_used_at: at,
            runs: 0,
            workspace_bytes: 0,
            template: None,
            restore_from: None,
            state_from: None,
            meta: SessionMeta::default(),
            published: None,
        }
    }

    /// When it was opened.
    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.created_at)
    }

    /// When it was last used.
    pub fn last_used(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.last_used_at)
    }

    /// Reads the record in session directory `dir`.
    pub fn read(dir: &Path) -> io::Result<SessionRecord> {
        read(dir, RECORD)
    }

    /// Writes it in session directory `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        write(self, dir, RECORD)
    }
}

/// A template's record: written once its build has succeeded, so a
/// template without one (a build cut short) is never served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRecord {
    /// When it was built, in seconds since the epoch.
    pub created_at: u64,
    /// The operator who built it.
    pub built_by: u32,
    /// What it was built from.
    pub packages: Vec<String>,
    /// Bytes its disk takes on the host, once shrunk.
    #[serde(default)]
    pub bytes: u64,
    /// The BLAKE3 hash of its disk's image (which never changes once
    /// built), once found: what a session from it carries through the
    /// fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_hash: Option<String>,
}

impl TemplateRecord {
    /// Reads the record in template directory `dir`.
    pub fn read(dir: &Path) -> io::Result<TemplateRecord> {
        read(dir, TEMPLATE_RECORD)
    }

    /// Writes it in template directory `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        write(self, dir, TEMPLATE_RECORD)
    }

    /// When it was built.
    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.created_at)
    }
}

/// A volume's record: written once its disk is made, so a volume without
/// one (a kernel killed while making it) is removed, never served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// When it was made, in seconds since the epoch.
    pub created_at: u64,
    /// Its size.
    pub bytes: u64,
}

impl VolumeRecord {
    /// Reads the record in volume directory `dir`.
    pub fn read(dir: &Path) -> io::Result<VolumeRecord> {
        read(dir, VOLUME_RECORD)
    }

    /// Writes it in volume directory `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        write(self, dir, VOLUME_RECORD)
    }

    /// When it was made.
    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.created_at)
    }
}

fn read<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> io::Result<T> {
    let text = fs::read(dir.join(name))?;
    serde_json::from_slice(&text).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

fn write<T: Serialize>(record: &T, dir: &Path, name: &str) -> io::Result<()> {
    let text = serde_json::to_vec(record).map_err(io::Error::other)?;
    let new = dir.join(format!("{name}{BEING_WRITTEN}"));
    fs::write(&new, text)?;
    fs::rename(new, dir.join(name))
}

/// Seconds since the epoch.
pub fn seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
