//! Where sessions fetched from the fleet's store wait, each in a
//! directory of its own, to be brought into their owner's store by the
//! disks' thread (which removes the directory either way).

use std::fs;
use std::path::{Path, PathBuf};

use super::names::owner_dir_name;
use crate::exec::waiting::SessionKey;
use crate::identity::Principal;

/// `<state>/fleet-staging`, once the node is in a fleet.
#[derive(Debug)]
pub struct FleetStaging {
    dir: PathBuf,
    on: bool,
    /// The most one session fetched may hold: an owner's room for
    /// snapshots (`exec.snapshot_bytes`), and the image of the template it
    /// carries (`exec.template_disk_bytes`).
    max_bytes: (u64, u64),
}

impl FleetStaging {
    /// Off: the node is in no fleet.
    pub fn new(state_dir: &Path) -> FleetStaging {
        FleetStaging {
            dir: state_dir.join("fleet-staging"),
            on: false,
            max_bytes: (0, 0),
        }
    }

    /// The node is in a fleet (and sessions have disks): operators' and
    /// delegates' sessions hibernate for the fleet to keep (their files
    /// with their globals), and one fetched holds at most `snapshot_bytes`,
    /// and a template's image of `template_bytes`. What an earlier kernel
    /// left half fetched goes.
    pub fn turn_on(&mut self, snapshot_bytes: u64, template_bytes: u64) {
        self.max_bytes = (snapshot_bytes, template_bytes);
        if let Err(err) = fs::remove_dir_all(&self.dir) {
            if err.kind() != std::io::ErrorKind::NotFound {
                log::warn!("{}: {err}", self.dir.display());
            }
        }
        self.on = true;
    }

    /// Whether `owner`'s hibernations are for the fleet to keep.
    pub fn keeps(&self, owner: Principal) -> bool {
        self.on && owner.outlives_kernels()
    }

    /// The most one session fetched may hold: its snapshot, and the image
    /// of the template it carries.
    pub fn max_bytes(&self) -> (u64, u64) {
        self.max_bytes
    }

    /// A directory of its own to fetch session `key` into.
    pub fn dir_for(&self, key: &SessionKey) -> Option<PathBuf> {
        if !self.on {
            return None;
        }
        let mut nonce = [0u8; 8];
        crate::random::fill(&mut nonce).ok()?;
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        Some(self.dir.join(format!("{}-{nonce}", owner_dir_name(key.0))))
    }
}
