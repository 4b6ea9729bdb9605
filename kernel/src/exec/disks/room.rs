//! How the host's disk is shared: whose share each owner's disks count
//! against (an operator's uid with its delegates, or an agent's whole
//! tree), what each share may take (`exec.owner_disk_bytes`), and what the
//! host keeps free for itself.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use agentos_proto::{ErrorCode, ErrorReply};

use super::image;
use super::stored::Stored;
use super::volumes::Volumes;
use crate::exec::queues::Share;
use crate::exec::waiting::SessionKey;
use crate::identity::Principal;

/// Bytes of the host's disk that sessions' and volumes' disks never take:
/// the kernel's own records and logs, and the host's, go on.
pub const HOST_RESERVE: u64 = 512 << 20;

/// The disk's room, and whose share each owner's disks take it from.
#[derive(Debug)]
pub struct DiskRoom {
    /// The state directory, on the disk whose free space counts.
    state_dir: PathBuf,
    /// A session's disk.
    pub session_bytes: u64,
    /// What one share's disks may take together.
    pub owner_bytes: u64,
    /// Whose share of the disk each agent's or run's disks count against:
    /// the whole tree of an agent (its runs' and children's with it), or
    /// an operator's uid, as their share of EXEC is counted.
    shares: HashMap<Principal, Share>,
}

impl DiskRoom {
    /// Room on the disk `state_dir` lies on, sessions' disks of
    /// `session_bytes`, `owner_bytes` a share.
    pub fn new(state_dir: PathBuf, session_bytes: u64, owner_bytes: u64) -> DiskRoom {
        DiskRoom {
            state_dir,
            session_bytes,
            owner_bytes,
            shares: HashMap::new(),
        }
    }

    /// `owner`'s disks count against `share` from now on.
    pub fn counts_for(&mut self, owner: Principal, share: Share) {
        self.shares.insert(owner, share);
    }

    /// `owner` is gone, and so are its disks.
    pub fn forget(&mut self, owner: Principal) {
        self.shares.remove(&owner);
    }

    /// Whose share of the disk `owner`'s disks count against.
    fn share_of(&self, owner: Principal) -> Option<Share> {
        match owner {
            // A delegate's disks count as its operator's.
            Principal::Operator { uid } | Principal::Delegate { uid, .. } => {
                Some(Share::Operator(uid))
            }
            owner => self.shares.get(&owner).copied(),
        }
    }

    /// Bytes the disks counted against `share` take (a delegate's: its
    /// operator's, and all its delegates'): its owners' sessions' among
    /// `stored` and volumes among `volumes`.
    pub fn share_bytes(&self, share: Share, stored: &Stored, volumes: &Volumes) -> u64 {
        let held_as = |share: Share| share.held_as();
        let of_share = |owner| self.share_of(owner).map(held_as) == Some(share.held_as());
        let sessions = stored.count_where(of_share);
        self.session_bytes
            .saturating_mul(sessions as u64)
            .saturating_add(volumes.bytes_where(of_share))
    }

    /// Whether a new disk for session `key` fits `share`, with those
    /// waiting runs will make (`to_make`), and the host's free space.
    pub fn may_make<'a>(
        &self,
        (key, share): (&SessionKey, Share),
        to_make: impl Iterator<Item = &'a SessionKey>,
        stored: &Stored,
        volumes: &Volumes,
    ) -> Result<(), ErrorReply> {
        let owner = key.0;
        let mut new: HashSet<&SessionKey> = to_make
            .filter(|k| k.0 == owner && stored.record(k).is_none())
            .collect();
        new.insert(key);
        let wanted = (self.share_bytes(share, stored, volumes))
            .saturating_add(self.session_bytes.saturating_mul(new.len() as u64));
        if wanted > self.owner_bytes {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "your sessions' and volumes' disks (with those of the agents and runs \
                     you started) would take {wanted} bytes, more than \
                     exec.owner_disk_bytes ({}) allows; close a session ({{\"op\":\"close\"}}) \
                     or remove a volume first",
                    self.owner_bytes
                ),
            ));
        }
        self.host_has_room(
            "a session's disk (exec.session_disk_bytes)",
            self.session_bytes,
        )
    }

    /// `limit_exceeded` unless the host's disk has `bytes` free for `what`
    /// and [`HOST_RESERVE`] beside.
    pub fn host_has_room(&self, what: &str, bytes: u64) -> Result<(), ErrorReply> {
        // One that cannot be measured is no reason to refuse.
        let free = image::free_bytes(&self.state_dir).unwrap_or(u64::MAX);
        if free < bytes.saturating_add(HOST_RESERVE) {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the host's disk has {free} bytes free: not enough for {what}, {bytes}, \
                     and the {HOST_RESERVE} the kernel keeps free for itself"
                ),
            ));
        }
        Ok(())
    }
}
