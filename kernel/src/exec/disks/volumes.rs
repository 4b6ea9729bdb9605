//! Volumes: named disks a principal owns (`<state>/volumes/uid-N/NAME/`,
//! an image of a fixed size, mounted by the kernel), given by name to the
//! agents and runs it starts, read-write or read-only.
//!
//! What a principal may mount is what it owns and what it was given: an
//! agent or a run is given exactly the volumes its starter named, as its
//! starter had them or narrower (read-only stays read-only), and may name
//! them again for what it starts in turn. Another principal's volume is
//! `not_found`. An agent's or a run's own volumes, and what it was given,
//! end with it; an operator's volumes last until removed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::SystemTime;

use agentos_proto::payload::{VolumeInfo, VolumeMount, MIN_VOLUME_BYTES};
use agentos_proto::{ErrorCode, ErrorReply};

pub use super::super::waiting::VolumeUse;
use super::found::{owned_disks, Found};
use super::image::DiskDir;
use super::names::{disk_path, owner_dir_name};
use super::record::{seconds, VolumeRecord};
use crate::clock::rfc3339;
use crate::identity::Principal;
use crate::sandbox::attach::VolumePlace;

/// What a volume's disk holds at its root: its files.
pub const VOLUME_PARTS: [&str; 1] = ["data"];

/// A volume by its owner and name.
pub type VolumeKey = (Principal, String);

/// A volume one principal was given by another.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Given {
    key: VolumeKey,
    writable: bool,
}

/// Every volume, and who was given which.
#[derive(Debug)]
pub struct Volumes {
    /// `<state>/volumes`.
    root: PathBuf,
    /// The size of a volume whose request names none.
    default_bytes: u64,
    stored: HashMap<VolumeKey, VolumeRecord>,
    /// Volumes whose disks the kernel has mounted.
    mounted: HashSet<VolumeKey>,
    /// Volumes being made, each with its record to be.
    making: HashMap<VolumeKey, VolumeRecord>,
    given: HashMap<Principal, BTreeMap<String, Given>>,
}

impl Volumes {
    /// No volumes yet under `root`.
    pub fn empty(root: PathBuf, default_bytes: u64) -> Volumes {
        Volumes {
            root,
            default_bytes,
            stored: HashMap::new(),
            mounted: HashSet::new(),
            making: HashMap::new(),
            given: HashMap::new(),
        }
    }

    /// Takes in what an earlier kernel left: operators' volumes are kept
    /// (returned, to be mounted); an agent's or a run's, and one never
    /// recorded, are returned to be removed, with the owners' directories
    /// that go with them.
    pub fn find_stored(&mut self) -> Found<VolumeRecord> {
        let found = owned_disks(&self.root, |dir| VolumeRecord::read(&dir.0).ok(), |_| true);
        for (key, _, record) in &found.kept {
            self.stored.insert(key.clone(), record.clone());
        }
        found
    }

    /// Volume `key`'s directory.
    pub fn dir(&self, key: &VolumeKey) -> DiskDir {
        DiskDir(disk_path(&self.root, key.0, &key.1))
    }

    /// The directory of `owner`'s volumes.
    pub fn owner_dir(&self, owner: Principal) -> PathBuf {
        self.root.join(owner_dir_name(owner))
    }

    /// Bytes the volumes of the owners `of` picks take, those being made
    /// among them.
    pub fn bytes_where(&self, mut of: impl FnMut(Principal) -> bool) -> u64 {
        self.stored
            .iter()
            .chain(&self.making)
            .filter(|((owner, _), _)| of(*owner))
            .map(|(_, record)| record.bytes)
            .sum()
    }

    /// Reserves volume `name` of `bytes` (or the default) for `owner`,
    /// whose share of the disk has `used` of `limit` bytes taken: its
    /// directory and record, to be made.
    pub fn begin_create(
        &mut self,
        owner: Principal,
        name: &str,
        bytes: Option<u64>,
        used: u64,
        limit: u64,
    ) -> Result<(DiskDir, VolumeRecord), ErrorReply> {
        let key = (owner, name.to_owned());
        let given = self.given.get(&owner).is_some_and(|g| g.contains_key(name));
        if self.stored.contains_key(&key) || self.making.contains_key(&key) || given {
            let whose = if given {
                "you were given one"
            } else {
                "you have one"
            };
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!("volume {name:?}: {whose} of that name; choose another"),
            ));
        }
        let bytes = bytes.unwrap_or(self.default_bytes);
        if bytes < MIN_VOLUME_BYTES {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("EXEC field `bytes` is {bytes}: a volume has at least {MIN_VOLUME_BYTES}"),
            ));
        }
        let wanted = used.saturating_add(bytes);
        if wanted > limit {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "your sessions' and volumes' disks (with those of the agents and runs \
                     you started) would take {wanted} bytes, more than exec.owner_disk_bytes \
                     ({limit}) allows; remove a volume or close a session first"
                ),
            ));
        }
        let record = VolumeRecord {
            created_at: seconds(SystemTime::now()),
            bytes,
        };
        self.making.insert(key.clone(), record.clone());
        Ok((self.dir(&key), record))
    }

    /// Volume `key`'s disk has been made and mounted, or could not be.
    pub fn made(&mut self, key: &VolumeKey, succeeded: bool) -> Option<VolumeInfo> {
        let record = self.making.remove(key)?;
        if !succeeded {
            return None;
        }
        self.stored.insert(key.clone(), record);
        self.mounted.insert(key.clone());
        self.info(key, None)
    }

    /// Volume `key`'s disk is mounted (found again at start).
    pub fn mounted(&mut self, key: VolumeKey) {
        if self.stored.contains_key(&key) {
            self.mounted.insert(key);
        }
    }

    /// The volumes `mounts` names, as `caller` may have them: its own, or
    /// ones it was given, never more writable than given.
    pub fn resolve(
        &self,
        caller: Principal,
        what: &str,
        mounts: &[VolumeMount],
    ) -> Result<Vec<VolumeUse>, ErrorReply> {
        mounts
            .iter()
            .map(|mount| {
                let given = self.reach(caller, &mount.name).ok_or_else(|| {
                    ErrorReply::new(
                        ErrorCode::NotFound,
                        format!(
                            "{what} field `volumes`: no volume {:?} of yours (make one with \
                             {{\"op\":\"create_volume\"}})",
                            mount.name
                        ),
                    )
                })?;
                if !given.writable && !mount.read_only {
                    return Err(ErrorReply::new(
                        ErrorCode::PermissionDenied,
                        format!(
                            "{what} field `volumes`: volume {:?} was given to you read-only; \
                             pass it on with \"read_only\": true",
                            mount.name
                        ),
                    ));
                }
                Ok(VolumeUse {
                    name: mount.name.clone(),
                    place: VolumePlace {
                        source: self.dir(&given.key).mount_point().join(VOLUME_PARTS[0]),
                        target: PathBuf::from(&mount.path),
                        read_only: mount.read_only,
                    },
                    key: given.key,
                })
            })
            .collect()
    }

    /// Those of `uses` whose disks the kernel has not mounted (yet, or
    /// again: one a killed kernel's sandboxes still held).
    pub fn unmounted(&self, uses: &[VolumeUse]) -> Vec<(VolumeKey, DiskDir)> {
        uses.iter()
            .filter(|volume| !self.mounted.contains(&volume.key))
            .map(|volume| (volume.key.clone(), self.dir(&volume.key)))
            .collect()
    }

    /// Volume `name` as `caller` may reach it.
    fn reach(&self, caller: Principal, name: &str) -> Option<Given> {
        let own = (caller, name.to_owned());
        if self.stored.contains_key(&own) {
            return Some(Given {
                key: own,
                writable: true,
            });
        }
        let given = self.given.get(&caller)?.get(name)?;
        self.stored.contains_key(&given.key).then(|| given.clone())
    }

    /// `to` (an agent or a run just started) is given `uses`, by the names
    /// its starter used.
    pub fn give(&mut self, to: Principal, uses: &[VolumeUse]) {
        if uses.is_empty() {
            return;
        }
        let given = self.given.entry(to).or_default();
        for volume in uses {
            given.insert(
                volume.name.clone(),
                Given {
                    key: volume.key.clone(),
                    writable: !volume.place.read_only,
                },
            );
        }
    }

    /// `owner` has ended: its own volumes' directories are returned, to be
    /// removed, and what it was given is forgotten — but an agent's, which
    /// its next incarnation (a restart) still has mounted: those go once
    /// the agent has ended for good (see [`Volumes::retain_given`]).
    pub fn forget(&mut self, owner: Principal) -> Vec<DiskDir> {
        if !matches!(owner, Principal::Agent { .. }) {
            self.given.remove(&owner);
        }
        let keys: Vec<VolumeKey> = self
            .stored
            .keys()
            .filter(|(o, _)| *o == owner)
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|key| self.remove(&key))
            .collect()
    }

    /// Keeps what was given only to the principals `keep` picks.
    pub fn retain_given(&mut self, mut keep: impl FnMut(Principal) -> bool) {
        self.given.retain(|principal, _| keep(*principal));
    }

    /// Removes `owner`'s volume `name`: its directory, to be deleted.
    pub fn remove_named(&mut self, owner: Principal, name: &str) -> Result<DiskDir, ErrorReply> {
        let key = (owner, name.to_owned());
        if let Some(dir) = self.remove(&key) {
            return Ok(dir);
        }
        let given = self.reach(owner, name).is_some();
        Err(match given {
            true => ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!("volume {name:?} was given to you; only its owner removes it"),
            ),
            false => ErrorReply::new(ErrorCode::NotFound, format!("no volume {name:?} of yours")),
        })
    }

    fn remove(&mut self, key: &VolumeKey) -> Option<DiskDir> {
        self.stored.remove(key)?;
        self.mounted.remove(key);
        Some(self.dir(key))
    }

    /// `caller`'s volumes, then those it was given, each by name.
    pub fn list(&self, caller: Principal) -> Vec<VolumeInfo> {
        let mut own: Vec<VolumeInfo> = self
            .stored
            .keys()
            .filter(|(o, _)| *o == caller)
            .filter_map(|key| self.info(key, None))
            .collect();
        own.sort_by(|a, b| a.volume.cmp(&b.volume));
        let given = self.given.get(&caller).into_iter().flatten();
        own.extend(given.filter_map(|(name, given)| {
            let info = self.info(&given.key, Some(given.writable))?;
            Some(VolumeInfo {
                volume: name.clone(),
                ..info
            })
        }));
        own
    }

    /// Volume `key` as listed: its owner's (`given` `None`), or given,
    /// writable or not.
    fn info(&self, key: &VolumeKey, given: Option<bool>) -> Option<VolumeInfo> {
        let record = self.stored.get(key)?;
        Some(VolumeInfo {
            volume: key.1.clone(),
            bytes: record.bytes,
            used_bytes: self.dir(key).used_bytes(),
            created_at: rfc3339(record.created()),
            owned: given.is_none(),
            read_only: given == Some(false),
        })
    }

    /// Every volume's directory.
    pub fn dirs(&self) -> Vec<DiskDir> {
        self.stored.keys().map(|key| self.dir(key)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPERATOR: Principal = Principal::Operator { uid: 1000 };
    const AGENT: Principal = Principal::Agent { id: 7 };
    const CHILD: Principal = Principal::Run { number: 3 };

    fn volumes_with(name: &str) -> Volumes {
        let mut volumes = Volumes::empty("/state/volumes".into(), 64 << 20);
        let key = (OPERATOR, name.to_owned());
        volumes
            .begin_create(OPERATOR, name, None, 0, 1 << 30)
            .unwrap();
        volumes.made(&key, true).unwrap();
        volumes
    }

    fn mount(name: &str, read_only: bool) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            path: "/data".into(),
            read_only,
        }
    }

    #[test]
    fn a_volume_reaches_only_its_owner_and_those_given_it() {
        let mut volumes = volumes_with("data");
        let uses = volumes
            .resolve(OPERATOR, "SPAWN", &[mount("data", false)])
            .unwrap();
        assert_eq!(
            uses[0].place.source,
            PathBuf::from("/state/volumes/uid-1000/data/mnt/data")
        );
        let other = volumes.resolve(AGENT, "SPAWN", &[mount("data", true)]);
        assert_eq!(other.unwrap_err().code, ErrorCode::NotFound);
        volumes.give(AGENT, &uses);
        volumes
            .resolve(AGENT, "EXEC", &[mount("data", false)])
            .unwrap();
        assert!(!volumes.list(AGENT)[0].owned);
        assert_eq!(
            volumes.remove_named(AGENT, "data").unwrap_err().code,
            ErrorCode::PermissionDenied
        );
        // A restart keeps what the agent was given; its end for good
        // does not.
        volumes.forget(AGENT);
        let again = volumes.resolve(AGENT, "EXEC", &[mount("data", true)]);
        assert!(again.is_ok());
        volumes.retain_given(|principal| principal != AGENT);
        let forgotten = volumes.resolve(AGENT, "EXEC", &[mount("data", true)]);
        assert!(forgotten.is_err());
        assert_eq!(volumes.list(OPERATOR).len(), 1);
    }

    #[test]
    fn read_only_stays_read_only_down_the_line() {
        let mut volumes = volumes_with("data");
        let ro = volumes
            .resolve(OPERATOR, "SPAWN", &[mount("data", true)])
            .unwrap();
        volumes.give(AGENT, &ro);
        let widened = volumes.resolve(AGENT, "EXEC", &[mount("data", false)]);
        assert_eq!(widened.unwrap_err().code, ErrorCode::PermissionDenied);
        let again = volumes
            .resolve(AGENT, "EXEC", &[mount("data", true)])
            .unwrap();
        volumes.give(CHILD, &again);
        assert!(volumes.list(CHILD)[0].read_only);
        assert!(volumes
            .resolve(CHILD, "EXEC", &[mount("data", false)])
            .is_err());
    }

    #[test]
    fn sizes_are_held_to_the_owners_share_and_names_to_one_each() {
        let mut volumes = volumes_with("data");
        let used = volumes.bytes_where(|owner| owner == OPERATOR);
        assert_eq!(used, 64 << 20);
        let again = volumes.begin_create(OPERATOR, "data", None, used, 1 << 30);
        assert_eq!(again.unwrap_err().code, ErrorCode::AlreadyExists);
        let tiny = volumes.begin_create(OPERATOR, "t", Some(1), 0, 1 << 30);
        assert_eq!(tiny.unwrap_err().code, ErrorCode::BadRequest);
        let over = volumes.begin_create(OPERATOR, "big", Some(1 << 30), used, 1 << 30);
        assert_eq!(over.unwrap_err().code, ErrorCode::LimitExceeded);
        let made_elsewhere =
            volumes.begin_create(OPERATOR, "x", None, (1 << 30) - (32 << 20), 1 << 30);
        assert_eq!(made_elsewhere.unwrap_err().code, ErrorCode::LimitExceeded);
        assert_eq!(volumes.forget(OPERATOR).len(), 1);
        assert_eq!(volumes.bytes_where(|_| true), 0);
    }

    #[test]
    fn a_volume_is_used_once_made_and_an_unmounted_one_is_named() {
        let mut volumes = Volumes::empty("/state/volumes".into(), 64 << 20);
        volumes
            .begin_create(OPERATOR, "data", None, 0, 1 << 30)
            .unwrap();
        let early = volumes.resolve(OPERATOR, "EXEC", &[mount("data", false)]);
        assert_eq!(early.unwrap_err().code, ErrorCode::NotFound);
        let key = (OPERATOR, "data".to_owned());
        assert!(volumes.made(&key, false).is_none());
        assert!(volumes.list(OPERATOR).is_empty());
        let mut found = Volumes::empty("/state/volumes".into(), 64 << 20);
        let record = VolumeRecord {
            created_at: 0,
            bytes: 64 << 20,
        };
        found.stored.insert(key.clone(), record);
        let uses = found
            .resolve(OPERATOR, "SPAWN", &[mount("data", true)])
            .unwrap();
        assert_eq!(found.unmounted(&uses).len(), 1);
        found.mounted(key);
        assert!(found.unmounted(&uses).is_empty());
    }
}
