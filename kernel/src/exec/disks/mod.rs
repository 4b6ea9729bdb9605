//! Sessions' disks: each session's `/workspace`, home (its packages, their
//! caches) and `/tmp` live on a disk of its own under the state directory
//! (`image`), not in memory, so a session outlives its interpreter, an
//! idle hour and the kernel itself. A session's run child is given its
//! disk before its first order (`attach`); what the kernel remembers of a
//! session lies beside its disk (`record`); all of it is done on a thread
//! of its own (`worker`).
//!
//! Owners' disks lie apart (`<state>/sessions/uid-1000/NAME/`, 0700, the
//! kernel's). An operator's sessions last until they are closed or unused
//! for `exec.session_retention_secs`; an agent's or a run's end with it,
//! and any left from an earlier kernel are removed when the kernel starts.
//! Each session's disk has a fixed size (`exec.session_disk_bytes`), and
//! an owner's disks together may take `exec.owner_disk_bytes`.

mod attach;
pub mod image;
mod record;
mod templates;
mod worker;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agentos_proto::payload::{SessionInfo, SessionState, TemplateInfo};
use agentos_proto::{ErrorCode, ErrorReply};

use self::image::{DiskDir, RunUser};
pub use self::record::SessionRecord;
use self::record::TemplateRecord;
use self::templates::Templates;
pub use self::worker::{DiskError, Done};
use self::worker::{Job, Plan, TemplateDisk, Worker};
use super::waiting::SessionKey;
pub use super::waiting::TemplateUse;
use crate::clock::rfc3339;
use crate::config::Config;
use crate::identity::Principal;

/// Every session's disk.
#[derive(Debug)]
pub struct SessionDisks {
    /// `<state>/sessions`.
    root: PathBuf,
    session_bytes: u64,
    owner_bytes: u64,
    /// Every session with a disk, by owner and name.
    stored: HashMap<SessionKey, SessionRecord>,
    templates: Templates,
    /// A template's disk while it is built.
    template_bytes: u64,
    worker: Option<Worker>,
    /// Why sessions have no disks here, if they have none.
    unavailable: Option<String>,
}

impl SessionDisks {
    /// The disks under `state_dir`, as `[exec]` sizes them, owned inside by
    /// the user agents and runs are: those an earlier kernel left are found
    /// again (an agent's or a run's, and those unused past their retention,
    /// removed).
    pub fn start(config: &Config, state_dir: &Path, waker: Arc<mio::Waker>) -> SessionDisks {
        let exec = &config.exec;
        let user = RunUser {
            uid: config.agents.uid,
            gid: config.agents.gid,
        };
        let mut disks = SessionDisks {
            root: state_dir.join("sessions"),
            session_bytes: exec.session_disk_bytes,
            owner_bytes: exec.owner_disk_bytes,
            stored: HashMap::new(),
            templates: Templates::empty(state_dir.join("templates")),
            template_bytes: exec.template_disk_bytes,
            worker: None,
            unavailable: image::unavailable(),
        };
        for dir in [disks.root.clone(), state_dir.join("templates")] {
            if disks.unavailable.is_some() {
                break;
            }
            if let Err(err) = fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
            {
                disks.unavailable = Some(format!("cannot make {}: {err}", dir.display()));
            }
        }
        if disks.unavailable.is_none() {
            match Worker::start(user, waker) {
                Ok(worker) => disks.worker = Some(worker),
                Err(err) => disks.unavailable = Some(format!("cannot start its thread: {err}")),
            }
        }
        match &disks.unavailable {
            Some(why) => log::warn!("sessions keep their files in memory: {why}"),
            None => {
                disks.find_stored(exec.session_retention_secs);
                let (templates, stale) = Templates::load(state_dir.join("templates"));
                disks.templates = templates;
                if !stale.is_empty() {
                    log::info!("templates: removing {} builds cut short", stale.len());
                    disks.ask(Job::Remove(stale));
                }
            }
        }
        disks
    }

    /// Whether sessions have disks.
    pub fn available(&self) -> bool {
        self.worker.is_some()
    }

    /// Takes in what an earlier kernel left.
    fn find_stored(&mut self, retention_secs: u64) {
        let now = SystemTime::now();
        let retention = Duration::from_secs(retention_secs);
        let mut stale = Vec::new();
        let mut stale_owners = Vec::new();
        for owner_dir in fs::read_dir(&self.root).into_iter().flatten().flatten() {
            let path = owner_dir.path();
            let owner = owner_of(&owner_dir.file_name().to_string_lossy());
            let lasting = matches!(owner, Some(Principal::Operator { .. }));
            for session in fs::read_dir(&path).into_iter().flatten().flatten() {
                let dir = DiskDir(session.path());
                let name = session.file_name().to_string_lossy().into_owned();
                let record = SessionRecord::read(&dir.0).ok().filter(|_| dir.has_disk());
                let kept = match (owner, record) {
                    (Some(owner), Some(record)) if lasting => {
                        let unused = now.duration_since(record.last_used()).unwrap_or_default();
                        (retention_secs == 0 || unused < retention).then_some((owner, record))
                    }
                    _ => None,
                };
                match kept {
                    Some((owner, record)) => {
                        self.stored.insert((owner, name), record);
                    }
                    None => stale.push(dir),
                }
            }
            if !lasting {
                stale_owners.push(path);
            }
        }
        if !stale.is_empty() {
            log::info!(
                "session disks: removing {} left over or past retention",
                stale.len()
            );
            self.ask(Job::Remove(stale));
        }
        for owner in stale_owners {
            self.ask(Job::RemoveOwner(owner));
        }
    }

    fn ask(&self, job: Job) {
        if let Some(worker) = &self.worker {
            worker.ask(job);
        }
    }

    fn owner_dir(&self, owner: Principal) -> PathBuf {
        self.root.join(owner_dir_name(owner))
    }

    fn dir(&self, key: &SessionKey) -> DiskDir {
        DiskDir(self.owner_dir(key.0).join(dir_name(&key.1)))
    }

    /// Session `key`'s record, if it has a disk.
    pub fn record(&self, key: &SessionKey) -> Option<&SessionRecord> {
        self.stored.get(key)
    }

    /// `owner`'s sessions with disks, by name.
    pub fn stored_of(&self, owner: Principal) -> impl Iterator<Item = (&String, &SessionRecord)> {
        self.stored
            .iter()
            .filter(move |((o, _), _)| *o == owner)
            .map(|((_, name), record)| (name, record))
    }

    /// `open`, `owner`'s sessions with an interpreter, with their disks'
    /// sizes, and then its sessions stored on disk alone, oldest first.
    pub fn with_stored(&self, owner: Principal, mut open: Vec<SessionInfo>) -> Vec<SessionInfo> {
        if !self.available() {
            return open;
        }
        for info in &mut open {
            let key = (owner, info.session.clone());
            if self.stored.contains_key(&key) {
                info.disk_bytes = Some(self.session_bytes);
                info.disk_used_bytes = self.dir(&key).used_bytes();
            }
        }
        let mut stored: Vec<SessionInfo> = self
            .stored_of(owner)
            .filter(|(name, _)| !open.iter().any(|info| &info.session == *name))
            .map(|(name, record)| SessionInfo {
                session: name.clone(),
                created_at: rfc3339(record.created()),
                last_used_at: rfc3339(record.last_used()),
                runs: record.runs,
                workspace_bytes: record.workspace_bytes,
                state: SessionState::Stored,
                disk_bytes: Some(self.session_bytes),
                disk_used_bytes: self.dir(&(owner, name.clone())).used_bytes(),
            })
            .collect();
        stored.sort_by(|a, b| (&a.created_at, &a.session).cmp(&(&b.created_at, &b.session)));
        open.extend(stored);
        open
    }

    /// Whether session `key` may be given a disk: one it has, or a new one
    /// within its owner's share of the disk (those waiting runs will make,
    /// `to_make`, counted) and the host's free space.
    pub fn may_make<'a>(
        &self,
        key: &SessionKey,
        to_make: impl Iterator<Item = &'a SessionKey>,
    ) -> Result<(), ErrorReply> {
        if !self.available() || self.stored.contains_key(key) {
            return Ok(());
        }
        let owner = key.0;
        let mut new: HashSet<&SessionKey> = to_make
            .filter(|k| k.0 == owner && !self.stored.contains_key(*k))
            .collect();
        new.insert(key);
        let disks = self.stored_of(owner).count() + new.len();
        let wanted = self.session_bytes.saturating_mul(disks as u64);
        if wanted > self.owner_bytes {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "your sessions' disks would take {wanted} bytes, more than \
                     exec.owner_disk_bytes ({}) allows; close a session ({{\"op\":\"close\"}}) \
                     first",
                    self.owner_bytes
                ),
            ));
        }
        let free = nix::sys::statvfs::statvfs(&self.root)
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(u64::MAX);
        if free < self.session_bytes {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the host's disk has {free} bytes free, less than a session's disk \
                     (exec.session_disk_bytes, {})",
                    self.session_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Gives run child `child` (whose pidfd is `pidfd`) its disks: session
    /// `key`'s (made now if the session is new, from `template`), and its
    /// template's, to use or to build; answered through
    /// [`SessionDisks::done`].
    pub fn attach(
        &mut self,
        child: usize,
        pidfd: OwnedFd,
        key: Option<&SessionKey>,
        template: Option<&TemplateUse>,
    ) {
        let session = key.map(|key| {
            let record = self
                .stored
                .entry(key.clone())
                .or_insert_with(|| SessionRecord {
                    template: template.map(|t| t.name().to_owned()),
                    ..SessionRecord::new(SystemTime::now())
                })
                .clone();
            // Its directory is made with its disk, on the disks' thread.
            (self.dir(key), self.session_bytes, record)
        });
        let template = template.map(|template| match template {
            TemplateUse::Use(name) => TemplateDisk::Use(self.templates.dir(name)),
            TemplateUse::Build(name) => TemplateDisk::Build {
                dir: self.templates.build_dir(name),
                bytes: self.template_bytes,
            },
        });
        let plan = Plan { session, template };
        self.ask(Job::Attach { child, pidfd, plan });
    }

    /// What the disks' thread has answered since the last call.
    pub fn done(&self) -> Vec<Done> {
        self.worker.as_ref().map(Worker::done).unwrap_or_default()
    }

    /// What session `key` was opened from, if it has been opened (on a
    /// disk): a template, or none.
    pub fn opened(&self, key: &SessionKey) -> Option<Option<String>> {
        self.stored.get(key).map(|record| record.template.clone())
    }

    /// Template `name`, if it has been built; else `not_found` (or
    /// `unavailable` without disks).
    pub fn find_template(&self, name: &str) -> Result<(), ErrorReply> {
        self.require()?;
        self.templates.find(name).map(|_| ())
    }

    /// Reserves `name` for a build.
    pub fn begin_build(&mut self, name: &str) -> Result<(), ErrorReply> {
        self.require()?;
        self.templates.begin_build(name).map(|_| ())
    }

    /// Template `name`'s build has run: if it `succeeded`, its disk is
    /// published as built by `uid` from `packages` (answered through
    /// [`SessionDisks::done`]); else it goes.
    pub fn build_ran(&mut self, name: &str, succeeded: bool, uid: u32, packages: Vec<String>) {
        let build = self.templates.build_dir(name);
        if !succeeded {
            self.templates.build_ended(name, None);
            self.ask(Job::Remove(vec![build]));
            return;
        }
        let record = TemplateRecord {
            created_at: record::seconds(SystemTime::now()),
            built_by: uid,
            packages,
            bytes: 0,
        };
        let to = self.templates.dir(name);
        let name = name.to_owned();
        self.ask(Job::Publish {
            name,
            build,
            to,
            record,
        });
    }

    /// Template `name`'s build is over: published with `record`, or not.
    pub fn build_ended(&mut self, name: &str, record: Option<TemplateRecord>) {
        self.templates.build_ended(name, record);
    }

    /// When template `name` was built, if it has been.
    pub fn template_built_at(&self, name: &str) -> Option<u64> {
        self.templates.built_at(name)
    }

    /// Every template.
    pub fn templates(&self) -> Vec<TemplateInfo> {
        self.templates.list()
    }

    /// Removes template `name` for operator `uid`, unless a session uses
    /// it: whether there was one.
    pub fn remove_template(&mut self, name: &str, uid: u32) -> Result<bool, ErrorReply> {
        self.require()?;
        let mut used_by: Vec<String> = self
            .stored
            .iter()
            .filter(|(_, record)| record.template.as_deref() == Some(name))
            .map(|((_, session), _)| session.clone())
            .collect();
        used_by.sort();
        let removed = self.templates.remove(name, uid, &used_by)?;
        let had = removed.is_some();
        if let Some(dir) = removed {
            self.ask(Job::Remove(vec![dir]));
        }
        Ok(had)
    }

    /// `unavailable`, saying why, without disks.
    fn require(&self) -> Result<(), ErrorReply> {
        match &self.unavailable {
            None => Ok(()),
            Some(why) => Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("templates need disks, which this kernel cannot make: {why}"),
            )),
        }
    }

    /// An order of session `key` has ended: its record is brought up to
    /// date.
    pub fn note(&mut self, key: &SessionKey, runs: u64, last_used: SystemTime, bytes: Option<u64>) {
        let Some(record) = self.stored.get_mut(key) else {
            return;
        };
        record.runs = runs;
        record.last_used_at = record::seconds(last_used);
        if let Some(bytes) = bytes {
            record.workspace_bytes = bytes;
        }
        let record = record.clone();
        let dir = self.dir(key);
        self.ask(Job::Record { dir, record });
    }

    /// Removes session `key`'s disk: whether it had one.
    pub fn remove(&mut self, key: &SessionKey) -> bool {
        if self.stored.remove(key).is_none() {
            return false;
        }
        self.ask(Job::Remove(vec![self.dir(key)]));
        true
    }

    /// `owner` (an agent, a run) has ended: its disks go. An operator's
    /// sessions last until closed.
    pub fn remove_owner(&mut self, owner: Principal) {
        if matches!(owner, Principal::Operator { .. }) {
            return;
        }
        let keys: Vec<SessionKey> = self
            .stored
            .keys()
            .filter(|(o, _)| *o == owner)
            .cloned()
            .collect();
        for key in keys {
            self.remove(&key);
        }
        self.ask(Job::RemoveOwner(self.owner_dir(owner)));
    }

    /// Unmounts every disk (shutdown): they stay on the host for the next
    /// kernel.
    pub fn finish(&mut self) {
        let mut dirs: Vec<DiskDir> = self.stored.keys().map(|key| self.dir(key)).collect();
        dirs.extend(self.templates.dirs());
        if let Some(worker) = &mut self.worker {
            worker.finish(dirs);
        }
    }
}

/// The directory of session `name`: the name itself, which the protocol
/// keeps to letters, digits, `_`, `.` and `-`; anything else (never sent
/// by a client the protocol's checks passed) spelled in hex, so that no
/// name ever leaves its owner's directory.
fn dir_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name != "."
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if plain {
        return name.to_owned();
    }
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("x-{hex}")
}

/// The directory name of `owner`'s sessions.
fn owner_dir_name(owner: Principal) -> String {
    match owner {
        Principal::Operator { uid } => format!("uid-{uid}"),
        Principal::Agent { id } => format!("agent-{id}"),
        Principal::Run { number } => format!("run-{number}"),
    }
}

/// The owner a directory of sessions belongs to.
fn owner_of(name: &str) -> Option<Principal> {
    if let Some(uid) = name.strip_prefix("uid-") {
        return uid.parse().ok().map(|uid| Principal::Operator { uid });
    }
    if let Some(id) = name.strip_prefix("agent-") {
        return id.parse().ok().map(|id| Principal::Agent { id });
    }
    let number = name.strip_prefix("run-")?.parse().ok()?;
    Some(Principal::Run { number })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_session_name_leaves_its_owners_directory() {
        assert_eq!(dir_name("s1.v2-x_y"), "s1.v2-x_y");
        for hostile in ["..", "../etc", "/abs", "a/b", ".", ""] {
            let name = dir_name(hostile);
            assert!(name.starts_with("x-"), "{hostile:?} -> {name}");
            assert!(!name.contains('/') && !name.contains(".."), "{name}");
        }
    }

    #[test]
    fn owners_name_their_directories_both_ways() {
        for owner in [
            Principal::Operator { uid: 1000 },
            Principal::Agent { id: 7 },
            Principal::Run { number: 42 },
        ] {
            assert_eq!(owner_of(&owner_dir_name(owner)), Some(owner));
        }
        assert_eq!(owner_of("uid-x"), None);
        assert_eq!(owner_of("lost+found"), None);
    }
}
