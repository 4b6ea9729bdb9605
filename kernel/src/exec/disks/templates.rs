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
//! operator (or root) may remove it, and not while a session uses it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use agentos_proto::payload::TemplateInfo;
use agentos_proto::{ErrorCode, ErrorReply};

use super::image::DiskDir;
use super::record::TemplateRecord;
use crate::clock::rfc3339;

/// Where a build's disk is made, beside the templates.
const BUILDING: &str = ".build-";

/// The templates there are, and those being built.
#[derive(Debug)]
pub struct Templates {
    /// `<state>/templates`.
    root: PathBuf,
    built: HashMap<String, TemplateRecord>,
    building: HashSet<String>,
}

impl Templates {
    /// None yet, under `root`.
    pub fn empty(root: PathBuf) -> Templates {
        Templates {
            root,
            built: HashMap::new(),
            building: HashSet::new(),
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
            match TemplateRecord::read(&dir.0) {
                Ok(record) if !name.starts_with(BUILDING) && dir.has_disk() => {
                    built.insert(name, record);
                }
                _ => stale.push(dir),
            }
        }
        let templates = Templates {
            root,
            built,
            building: HashSet::new(),
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

    /// Template `name`, if it has been built; else `not_found`.
    pub fn find(&self, name: &str) -> Result<DiskDir, ErrorReply> {
        if self.built.contains_key(name) {
            return Ok(self.dir(name));
        }
        Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!(
                "no template {name:?} ({{\"op\":\"templates\"}} lists them; an operator \
                 builds one with agentos template build)"
            ),
        ))
    }

    /// Reserves `name` for a build: refused if a template of that name is
    /// built or being built.
    pub fn begin_build(&mut self, name: &str) -> Result<DiskDir, ErrorReply> {
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

    /// Every template, by name.
    pub fn list(&self) -> Vec<TemplateInfo> {
        let mut list: Vec<TemplateInfo> = self
            .built
            .iter()
            .map(|(name, record)| TemplateInfo {
                template: name.clone(),
                created_at: rfc3339(record.created()),
                bytes: record.bytes,
                shared: true,
                packages: record.packages.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.template.cmp(&b.template));
        list
    }

    /// Removes template `name` for operator `uid`, unless sessions use it
    /// (`used_by`): its directory, to be deleted, if there was one.
    pub fn remove(
        &mut self,
        name: &str,
        uid: u32,
        used_by: &[String],
    ) -> Result<Option<DiskDir>, ErrorReply> {
        let Some(record) = self.built.get(name) else {
            return Ok(None);
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
        if !used_by.is_empty() {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "template {name:?} is not removed: sessions {} use it (close them first)",
                    used_by.join(", ")
                ),
            ));
        }
        self.built.remove(name);
        Ok(Some(self.dir(name)))
    }

    /// Every template's directory (to unmount at shutdown).
    pub fn dirs(&self) -> Vec<DiskDir> {
        self.built.keys().map(|name| self.dir(name)).collect()
    }
}
