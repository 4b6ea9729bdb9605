//! Templates: named, read-only Python environments, each on a disk of its
//! own under `<state>/templates/NAME/`. An operator builds one (pip, in a
//! run whose network is the package index alone, into a disk made for the
//! build at `<state>/templates/.build-NAME/`); once the build has
//! succeeded its disk is shrunk to what it holds, moved to its name and
//! recorded — a template without its record is never served, so a build
//! cut short (a kernel killed) leaves nothing usable and is removed at the
//! next start. Served, the disk is mounted read-only once and the same
//! mount is given to every run and session started from it: never copied.
//!
//! Every principal may use a template an operator built; only that
//! operator (or root) may remove it, and not while a session or an agent
//! uses it. A template an agent or a run builds is its own: named apart
//! (`agent-7@NAME`, a name no template of an operator's can have), used
//! and listed by it alone, and removed with it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use agentos_proto::payload::TemplateInfo;
use agentos_proto::{ErrorCode, ErrorReply};

use super::fleet_templates::{self, Arrived, TemplateArrival};
use super::image::DiskDir;
use super::names::owner_dir_name;
use super::record::TemplateRecord;
use crate::clock::rfc3339;
use crate::identity::Principal;

/// Where a build's disk is made, beside the templates.
const BUILDING: &str = ".build-";
/// Between an owner's directory name and a template's name, in the key
/// of a template of an agent's or a run's own.
const OWN: char = '@';

/// The key of template `name` as `owner` builds it: its name, for an
/// operator's; else named apart as `owner`'s own.
pub fn key(owner: Principal, name: &str) -> String {
    match owner {
        Principal::Operator { .. } => name.to_owned(),
        owner => format!("{}{OWN}{name}", owner_dir_name(owner)),
    }
}

/// The templates there are, and those being built.
#[derive(Debug)]
pub struct Templates {
    /// `<state>/templates`.
    root: PathBuf,
    built: HashMap<String, TemplateRecord>,
    building: HashSet<String>,
    /// Templates built here that sessions brought from the fleet are
    /// arriving with, each with how many.
    arriving: HashMap<String, usize>,
}

impl Templates {
    /// None yet, under `root`.
    pub fn empty(root: PathBuf) -> Templates {
        Templates {
            root,
            built: HashMap::new(),
            building: HashSet::new(),
            arriving: HashMap::new(),
        }
    }

    /// The templates under `root`; and what an earlier kernel left of
    /// builds cut short, to be removed.
    pub fn load(root: PathBuf) -> (Templates, Vec<DiskDir>) {
        let mut built = HashMap::new();
        let mut stale = Vec::new();
        for entry in fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = DiskDir(entry.path());
            // An agent's or a run's own ended with the kernel that ran it.
            let shared = !name.starts_with(BUILDING) && !name.contains(OWN);
            match TemplateRecord::read(&dir.0) {
                Ok(record) if shared && dir.has_disk() => {
                    built.insert(name, record);
                }
                _ => stale.push(dir),
            }
        }
        let templates = Templates {
            root,
            built,
            building: HashSet::new(),
            arriving: HashMap::new(),
        };
        (templates, stale)
    }

    /// Template `name`'s directory.
    pub fn dir(&self, name: &str) -> DiskDir {
        DiskDir(self.root.join(name))
    }

    /// Where template `name` is built.
    pub fn build_dir(&self, name: &str) -> DiskDir {
        DiskDir(self.root.join(format!("{BUILDING}{name}")))
    }

    /// The key of template `name` as `caller` may use it — its own of
    /// that name, else an operator's — if it has been built; else
    /// `not_found`.
    pub fn find(&self, caller: Principal, name: &str) -> Result<String, ErrorReply> {
        let own = key(caller, name);
        if let Some(found) = [own.as_str(), name]
            .into_iter()
            .find(|key| self.built.contains_key(*key))
        {
            return Ok(found.to_owned());
        }
        Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!(
                "no template {name:?} ({{\"op\":\"templates\"}} lists them; build one \
                 with agentos template build)"
            ),
        ))
    }

    /// Reserves `name` for a build: refused if a template of that name is
    /// built or being built, or if it starts with `.` (the names of the
    /// templates' own directories, a build's among them).
    pub fn begin_build(&mut self, name: &str) -> Result<DiskDir, ErrorReply> {
        if name.starts_with('.') {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!("template {name:?}: a template's name does not start with '.'"),
            ));
        }
        if self.built.contains_key(name) {
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!("template {name:?} exists (remove it first to build it again)"),
            ));
        }
        if !self.building.insert(name.to_owned()) {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("template {name:?} is being built"),
            ));
        }
        Ok(self.build_dir(name))
    }

    /// What `owner`'s session brought from the fleet with the template
    /// `carried` says (JSON, as published) finds here: a template of its
    /// name (not removed until the session has arrived), or none, its name
    /// then reserved while its image is kept (within `max_bytes`);
    /// `unavailable` if `carried` does not parse, `busy` while a template
    /// of its name is being built.
    pub fn arrival(
        &mut self,
        carried: &[u8],
        max_bytes: u64,
        owner: Principal,
    ) -> Result<TemplateArrival, ErrorReply> {
        let carried = fleet_templates::carried(carried)
            .map_err(|err| ErrorReply::new(ErrorCode::Unavailable, err.to_string()))?;
        if self.built.contains_key(&carried.name) {
            *self.arriving.entry(carried.name.clone()).or_default() += 1;
            let dir = self.dir(&carried.name);
            return Ok(TemplateArrival::Here { carried, dir });
        }
        let build = self.begin_build(&carried.name)?;
        let to = self.dir(&carried.name);
        let built_by = match owner {
            Principal::Operator { uid } => uid,
            _ => 0,
        };
        Ok(TemplateArrival::Keep {
            carried,
            build,
            to,
            max_bytes,
            built_by,
        })
    }

    /// Template `name` of a session brought from the fleet has arrived:
    /// kept here now, or not (its name is free again), or found. Its name.
    pub fn arrived(&mut self, name: String, arrived: Arrived) -> String {
        match arrived {
            Arrived::Kept(record) => self.build_ended(&name, Some(record)),
            Arrived::NotKept => self.build_ended(&name, None),
            Arrived::Found => {
                if let Some(count) = self.arriving.get_mut(&name) {
                    *count -= 1;
                    if *count == 0 {
                        self.arriving.remove(&name);
                    }
                }
            }
        }
        name
    }

    /// The build of `name` has ended: built (with `record`), or not.
    pub fn build_ended(&mut self, name: &str, record: Option<TemplateRecord>) {
        self.building.remove(name);
        if let Some(record) = record {
            self.built.insert(name.to_owned(), record);
        }
    }

    /// When template `name` was built, if it has been.
    pub fn built_at(&self, name: &str) -> Option<u64> {
        self.built.get(name).map(|record| record.created_at)
    }

    /// The templates `caller` may use, by name: its own, and operators'.
    pub fn list(&self, caller: Principal) -> Vec<TemplateInfo> {
        let own = key(caller, "");
        let mut list: Vec<TemplateInfo> = self
            .built
            .keys()
            .filter(|key| !key.contains(OWN) || (own.contains(OWN) && key.starts_with(&own)))
            .filter_map(|key| self.info(key))
            .collect();
        list.sort_by(|a, b| (!a.shared, &a.template).cmp(&(!b.shared, &b.template)));
        list
    }

    /// Template `key` as listed, once built.
    pub fn info(&self, key: &str) -> Option<TemplateInfo> {
        let record = self.built.get(key)?;
        let (shared, name) = match key.split_once(OWN) {
            Some((_, name)) => (false, name),
            None => (true, key),
        };
        Some(TemplateInfo {
            template: name.to_owned(),
            created_at: rfc3339(record.created()),
            bytes: record.bytes,
            shared,
            packages: record.packages.clone(),
        })
    }

    /// The keys of `owner`'s own templates.
    pub fn own_of(&self, owner: Principal) -> Vec<String> {
        let own = key(owner, "");
        let keys = self.built.keys().chain(&self.building);
        keys.filter(|key| own.contains(OWN) && key.starts_with(&own))
            .cloned()
            .collect()
    }

    /// Removes template `name` for `caller` — its own, or, for an
    /// operator, one it (or, for root, anyone) built — unless sessions or
    /// agents use it (`used_by`): its directory, to be deleted, if there
    /// was one.
    pub fn remove(
        &mut self,
        caller: Principal,
        name: &str,
        used_by: &[String],
    ) -> Result<Option<DiskDir>, ErrorReply> {
        let key = key(caller, name);
        let Some(record) = self.built.get(&key) else {
            return Ok(None);
        };
        let uid = match caller {
            Principal::Operator { uid } => uid,
            _ => record.built_by,
        };
        if uid != 0 && uid != record.built_by {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "template {name:?} was built by uid {}: only it (or root) removes it",
                    record.built_by
                ),
            ));
        }
        if self.arriving.contains_key(&key) {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "template {name:?} is not removed: a session brought from the fleet is \
                     arriving with it"
                ),
            ));
        }
        if !used_by.is_empty() {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "template {name:?} is not removed: {} use it (close or kill them first)",
                    used_by.join(", ")
                ),
            ));
        }
        self.built.remove(&key);
        Ok(Some(self.dir(&key)))
    }

    /// Forgets template `key` (its owner has ended): its directory, to be
    /// deleted, if it was built.
    pub fn forget(&mut self, key: &str) -> Option<DiskDir> {
        self.building.remove(key);
        self.built.remove(key).map(|_| self.dir(key))
    }

    /// The names of the operators' templates built here.
    pub fn names(&self) -> Vec<String> {
        let shared = self.built.keys().filter(|key| !key.contains(OWN));
        shared.cloned().collect()
    }

    /// Every template's directory (to unmount at shutdown).
    pub fn dirs(&self) -> Vec<DiskDir> {
        self.built.keys().map(|name| self.dir(name)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Templates under `root` with one built, `t`, of the given packages.
    fn with_t(root: &std::path::Path) -> Templates {
        let dir = root.join("t");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("disk.img"), b"").unwrap();
        let record = TemplateRecord {
            created_at: 1,
            built_by: 1000,
            packages: vec!["pandas".into()],
            bytes: 0,
            image_hash: None,
        };
        record.write(&dir).unwrap();
        let (templates, stale) = Templates::load(root.to_owned());
        assert!(stale.is_empty());
        templates
    }

    fn carried(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "name": name, "hash": "a".repeat(64), "arch": std::env::consts::ARCH,
            "record": {"created_at": 1, "built_by": 7, "packages": ["pandas"]},
        }))
        .unwrap()
    }

    #[test]
    fn a_template_a_session_arrives_with_is_not_removed_until_it_has_arrived() {
        let root = tempfile::tempdir().unwrap();
        let mut templates = with_t(root.path());
        let operator = Principal::Operator { uid: 1000 };
        let arrival = templates.arrival(&carried("t"), 1 << 20, operator).unwrap();
        assert!(matches!(arrival, TemplateArrival::Here { .. }));
        let refused = templates.remove(operator, "t", &[]).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Busy, "{}", refused.error);
        templates.arrived("t".into(), Arrived::Found);
        assert!(templates.remove(operator, "t", &[]).unwrap().is_some());
    }

    #[test]
    fn a_template_none_here_has_its_name_reserved_and_is_removable_by_the_sessions_operator() {
        let root = tempfile::tempdir().unwrap();
        let mut templates = with_t(root.path());
        let operator = Principal::Operator { uid: 1000 };
        let arrival = templates.arrival(&carried("u"), 1 << 20, operator).unwrap();
        let TemplateArrival::Keep { built_by, .. } = arrival else {
            panic!("{arrival:?}");
        };
        assert_eq!(built_by, 1000);
        // Reserved meanwhile: neither built here nor brought again.
        assert_eq!(
            templates.begin_build("u").unwrap_err().code,
            ErrorCode::Busy
        );
        let again = templates.arrival(&carried("u"), 1 << 20, operator);
        assert_eq!(again.unwrap_err().code, ErrorCode::Busy);
        templates.arrived("u".into(), Arrived::NotKept);
        assert!(templates.begin_build("u").is_ok());
        // No name of the templates' own directories.
        let dotted = templates.begin_build(".build-t").unwrap_err();
        assert_eq!(dotted.code, ErrorCode::BadRequest);
    }
}
