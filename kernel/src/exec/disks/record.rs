//! What the kernel remembers of a session beside its disk
//! (`session.json`): when it was opened and last used, its runs, the
//! bytes its `/workspace` held. Written whole to a new file and renamed
//! over the old, so a kernel killed while writing leaves the old record.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

const RECORD: &str = "session.json";
const RECORD_BEING_WRITTEN: &str = "session.json.new";

/// A session's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// When it was opened, in seconds since the epoch.
    pub created_at: u64,
    /// When a run of it last started, in seconds since the epoch.
    pub last_used_at: u64,
    /// Its runs so far.
    pub runs: u64,
    /// Bytes of files in its `/workspace` after its last run.
    pub workspace_bytes: u64,
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
        let text = fs::read(dir.join(RECORD))?;
        serde_json::from_slice(&text).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
    }

    /// Writes it in session directory `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<()> {
        let text = serde_json::to_vec(self).map_err(io::Error::other)?;
        let new = dir.join(RECORD_BEING_WRITTEN);
        fs::write(&new, text)?;
        fs::rename(new, dir.join(RECORD))
    }
}

/// Seconds since the epoch.
pub fn seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
