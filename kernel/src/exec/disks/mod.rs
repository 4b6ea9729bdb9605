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

mod disk_error;
mod fleet_staging;
mod fleet_templates;
mod found;
pub mod image;
mod jobs;
mod made;
mod names;
mod record;
mod record_writes;
mod room;
pub mod snapshots;
mod store;
mod stored;
pub mod templates;
pub mod volumes;
mod worker;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use agentos_proto::payload::SnapshotInfo;
use agentos_proto::{ErrorCode, ErrorReply};

pub use self::fleet_staging::FleetStaging;
pub use self::fleet_templates::{carried, Brought, FleetFiles, ImportError, TemplateMoveError};
use self::image::{DiskDir, RunUser};
pub use self::record::SessionRecord;
use self::record::TemplateRecord;
use self::record_writes::RecordWrites;
use self::room::{DiskRoom, HOST_RESERVE};
use self::snapshots::Snapshots;
pub use self::store::is_hash;
use self::store::Store;
pub use self::store::StoreError;
pub use self::stored::{no_session, Carried, Stored};
use self::templates::Templates;
use self::volumes::{VolumeKey, VolumeUse, Volumes};
pub use self::worker::{Asked, Attached, DiskError, Done};
use self::worker::{Job, Plan, StoreLimits, TemplateDisk, Worker};
use super::order::HIBERNATED;
use super::queues::Share;
use super::session_meta::SessionMeta;
use super::waiting::SessionKey;
pub use super::waiting::TemplateUse;
use crate::address::ReplyTo;
use crate::config::Config;
use crate::identity::Principal;
use crate::sandbox::attach::VolumePlace;
use names::owner_dir_name;

/// Every session's disk.
#[derive(Debug)]
pub struct SessionDisks {
    /// The host's disk, as sessions' and volumes' disks share it.
    room: DiskRoom,
    /// Sessions' records waiting to be written.
    record_writes: RecordWrites,
    /// Every session with a disk, by owner and name.
    pub stored: Stored,
    pub templates: Templates,
    /// Volumes, and who was given which.
    pub volumes: Volumes,
    /// Sessions' snapshots, as listed (they lie in the store, which the
    /// disks' thread keeps).
    pub snapshots: Snapshots,
    /// Agents started from a template, each with its template.
    agent_templates: HashMap<Principal, String>,
    /// A template's disk while it is built.
    template_bytes: u64,
    worker: Option<Worker>,
    /// Why sessions have no disks here, if they have none.
    unavailable: Option<String>,
    /// Where sessions fetched from the fleet wait to be brought in.
    pub fleet_staging: FleetStaging,
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
            record_writes: RecordWrites::default(),
            room: DiskRoom::new(
                state_dir.to_owned(),
                exec.session_disk_bytes,
                exec.owner_disk_bytes,
            ),
            stored: Stored::new(state_dir.join("sessions"), exec.session_disk_bytes),
            templates: Templates::empty(state_dir.join("templates")),
            volumes: Volumes::empty(state_dir.join("volumes"), exec.volume_bytes),
            snapshots: Snapshots::default(),
            agent_templates: HashMap::new(),
            template_bytes: exec.template_disk_bytes,
            worker: None,
            unavailable: image::unavailable(),
            fleet_staging: FleetStaging::new(state_dir),
        };
        let dirs = ["sessions", "templates", "volumes", "snapshots"].map(|dir| state_dir.join(dir));
        for dir in dirs {
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
        let mut stale = None;
        if disks.unavailable.is_none() {
            let found = disks.stored.find(exec.session_retention_secs);
            let mut store = Store::open(state_dir.join("snapshots"));
            for (key, info) in found::snapshots(&mut store, disks.stored.records()) {
                disks.snapshots.insert(&key, info);
            }
            let limits = StoreLimits {
                per_owner: exec.snapshot_bytes,
                total: exec.snapshot_bytes_total,
                host_reserve: HOST_RESERVE,
            };
            let spare = (
                DiskDir(state_dir.join("spare-disk")),
                exec.session_disk_bytes,
            );
            match Worker::start(user, store, limits, spare, waker) {
                Ok(worker) => disks.worker = Some(worker),
                Err(err) => disks.unavailable = Some(format!("cannot start its thread: {err}")),
            }
            stale = Some(found);
        }
        match &disks.unavailable {
            Some(why) => log::warn!("sessions keep their files in memory: {why}"),
            None => {
                if let Some(found) = stale {
                    disks.remove_found("session disks", found.stale, found.stale_owners);
                }
                let (templates, stale) = Templates::load(state_dir.join("templates"));
                disks.templates = templates;
                if !stale.is_empty() {
                    log::info!("templates: removing {} builds cut short", stale.len());
                    disks.ask(Job::Remove(stale));
                }
                disks.ask(Job::MountTemplates(disks.templates.dirs()));
                disks.find_volumes();
            }
        }
        disks
    }

    /// Whether sessions have disks.
    pub fn available(&self) -> bool {
        self.worker.is_some()
    }

    /// Takes in the volumes an earlier kernel left, and mounts them.
    fn find_volumes(&mut self) {
        let found = self.volumes.find_stored();
        self.remove_found("volumes", found.stale, found.stale_owners);
        let kept: Vec<_> = found
            .kept
            .into_iter()
            .map(|(key, dir, _)| (key, dir))
            .collect();
        if !kept.is_empty() {
            self.ask(Job::MountVolumes(kept));
        }
    }

    /// Removes `what` an earlier kernel left that is not kept.
    fn remove_found(&self, what: &str, stale: Vec<DiskDir>, stale_owners: Vec<PathBuf>) {
        if !stale.is_empty() {
            log::info!(
                "{what}: removing {} left over or past retention",
                stale.len()
            );
            self.ask(Job::Remove(stale));
        }
        for owner in stale_owners {
            self.ask(Job::RemoveOwner(owner));
        }
    }

    /// Writes session `key`'s `record` in `dir`, on the disks' thread
    /// (once, if it changes again before that thread comes to it).
    fn write_record(&mut self, key: &SessionKey, dir: DiskDir, record: SessionRecord) {
        if let Some(record) = self.record_writes.write(key, record) {
            self.ask(Job::Record { dir, record });
        }
    }

    fn ask(&self, job: Job) {
        if let Some(worker) = &self.worker {
            worker.ask(job);
        }
    }

    /// Whether session `key` may be given a disk: one it has, or a new one
    /// within its owner's share of the disk (those waiting runs will make,
    /// `to_make`, counted) and the host's free space.
    pub fn may_make<'a>(
        &self,
        key: &SessionKey,
        share: Share,
        to_make: impl Iterator<Item = &'a SessionKey>,
    ) -> Result<(), ErrorReply> {
        if !self.available() || self.stored.record(key).is_some() {
            return Ok(());
        }
        (self.room).may_make((key, share), to_make, &self.stored, &self.volumes)
    }

    /// Begins making volume `name` for `owner` (answered through
    /// [`SessionDisks::done`]), within its share of the disk and the
    /// host's free space.
    pub fn create_volume(
        &mut self,
        (owner, share): (Principal, Share),
        name: &str,
        bytes: Option<u64>,
    ) -> Result<VolumeKey, ErrorReply> {
        self.require("volumes")?;
        self.room.counts_for(owner, share);
        let used = self.room.share_bytes(share, &self.stored, &self.volumes);
        let most = self.room.owner_bytes;
        let (dir, record) = self.volumes.begin_create(owner, name, bytes, used, most)?;
        let key = (owner, name.to_owned());
        if let Err(err) = self.room.host_has_room("the volume", record.bytes) {
            self.volumes.made(&key, false);
            return Err(err);
        }
        self.ask(Job::MakeVolume {
            key: key.clone(),
            dir,
            record,
        });
        Ok(key)
    }

    /// `unavailable` unless the kernel has `uses`' disks mounted (an
    /// agent's sandbox is given them at once, on the reactor); those it
    /// has not are mounted again meanwhile.
    pub fn volumes_mounted(&self, uses: &[VolumeUse]) -> Result<(), ErrorReply> {
        let unmounted = self.volumes.unmounted(uses);
        let Some((key, _)) = unmounted.first() else {
            return Ok(());
        };
        let why = format!(
            "SPAWN field `volumes`: volume {:?} is being mounted; retry in a moment",
            key.1
        );
        self.ask(Job::MountVolumes(unmounted));
        Err(ErrorReply::new(ErrorCode::Unavailable, why))
    }

    /// Removes `owner`'s volume `name`; sandboxes that have it mounted
    /// keep it until they end.
    pub fn remove_volume(&mut self, owner: Principal, name: &str) -> Result<(), ErrorReply> {
        self.require("volumes")?;
        let dir = self.volumes.remove_named(owner, name)?;
        self.ask(Job::Remove(vec![dir]));
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
        session: Option<(&SessionKey, Share, SessionMeta)>,
        template: Option<&TemplateUse>,
        volumes: &[VolumeUse],
    ) {
        let session = session.map(|(key, share, meta)| {
            self.room.counts_for(key.0, share);
            let template = template.map(|t| t.name().to_owned());
            let record = self.stored.opening(key, template, meta);
            // Its directory is made with its disk, on the disks' thread.
            self.stored.disk(key, record)
        });
        let template = template.map(|template| match template {
            TemplateUse::Use(name) => TemplateDisk::Use(self.templates.dir(name)),
            TemplateUse::Build(name) => TemplateDisk::Build {
                dir: self.templates.build_dir(name),
                bytes: self.template_bytes,
            },
        });
        let volumes = volumes
            .iter()
            .map(|volume| (self.volumes.dir(&volume.key), volume.place.clone()))
            .collect();
        let plan = Plan {
            session,
            template,
            volumes,
        };
        self.ask(Job::Attach { child, pidfd, plan });
    }

    /// What the disks' thread has answered since the last call.
    pub fn done(&self) -> Vec<Done> {
        self.worker.as_ref().map(Worker::done).unwrap_or_default()
    }

    /// The key of template `name` as `caller` may use it (its own of that
    /// name, else an operator's), if it has been built; else `not_found`
    /// (or `unavailable` without disks).
    pub fn find_template(&self, caller: Principal, name: &str) -> Result<String, ErrorReply> {
        self.require("templates")?;
        self.templates.find(caller, name)
    }

    /// Reserves `name` for a build.
    pub fn begin_build(&mut self, name: &str) -> Result<(), ErrorReply> {
        self.require("templates")?;
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
            image_hash: None,
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

    /// Removes template `name` for `caller` (see [`Templates::remove`]),
    /// unless a session or an agent uses it: whether there was one.
    pub fn remove_template(&mut self, caller: Principal, name: &str) -> Result<bool, ErrorReply> {
        self.require("templates")?;
        let key = templates::key(caller, name);
        let operators = !matches!(caller, Principal::Operator { .. })
            && self
                .templates
                .find(caller, name)
                .is_ok_and(|found| found != key);
        if operators {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "template {name:?} is an operator's: agents and runs remove only their own"
                ),
            ));
        }
        let mut used_by: Vec<String> = self
            .stored
            .records()
            .iter()
            .filter(|(_, record)| record.template.as_deref() == Some(key.as_str()))
            .map(|((_, session), _)| format!("session {session:?}"))
            .collect();
        used_by.sort();
        used_by.extend(
            self.agent_templates
                .iter()
                .filter(|(_, template)| **template == key)
                .map(|(agent, _)| match agent {
                    Principal::Agent { id } => format!("agent {id}"),
                    other => format!("{other:?}"),
                }),
        );
        let removed = self.templates.remove(caller, name, &used_by)?;
        let had = removed.is_some();
        if let Some(dir) = removed {
            self.ask(Job::Remove(vec![dir]));
        }
        Ok(had)
    }

    /// Where template `name` (`caller`'s own, or an operator's) goes in
    /// an agent's sandbox, with its key: `unavailable` until the kernel has
    /// its disk mounted (it is then mounted).
    pub fn template_place(
        &self,
        caller: Principal,
        name: &str,
    ) -> Result<(String, VolumePlace), ErrorReply> {
        self.require("templates")?;
        let key = self.templates.find(caller, name)?;
        let dir = self.templates.dir(&key);
        if !dir.is_mounted() {
            self.ask(Job::MountTemplates(vec![dir]));
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("SPAWN field `template`: template {name:?} is being mounted; retry"),
            ));
        }
        let place = VolumePlace {
            source: dir.mount_point().join(image::TEMPLATE_PARTS[0]),
            target: crate::exec::zygote::TEMPLATE_ROOT.into(),
            read_only: true,
        };
        Ok((key, place))
    }

    /// Keeps what agents were given (volumes, a template in use) only for
    /// the agents `live` picks (those not ended for good).
    pub fn retain_agents(&mut self, live: impl Fn(u32) -> bool) {
        let kept = |principal: Principal| match principal {
            Principal::Agent { id } => live(id),
            _ => true,
        };
        self.volumes.retain_given(kept);
        self.agent_templates.retain(|principal, _| kept(*principal));
    }

    /// `agent` was started from template `key`, which stays while it
    /// lives.
    pub fn template_used_by(&mut self, agent: u32, key: String) {
        self.agent_templates
            .insert(Principal::Agent { id: agent }, key);
    }

    /// `unavailable`, saying why, without disks (which `what` need).
    pub fn require(&self, what: &str) -> Result<(), ErrorReply> {
        match &self.unavailable {
            None => Ok(()),
            Some(why) => Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("{what} need disks, which this kernel cannot make: {why}"),
            )),
        }
    }

    /// An order of session `key` has ended: its record is brought up to
    /// date.
    pub fn note(&mut self, key: &SessionKey, runs: u64, last_used: SystemTime, bytes: Option<u64>) {
        if let Some((dir, record)) = self.stored.note(key, runs, last_used, bytes) {
            self.write_record(key, dir, record);
        }
    }

    /// Removes session `key`'s disk, and its snapshots: whether it had
    /// one.
    pub fn remove(&mut self, key: &SessionKey) -> bool {
        let Some(dir) = self.stored.remove(key) else {
            return false;
        };
        self.record_writes.forget(key);
        self.ask(Job::Remove(vec![dir]));
        self.snapshots.remove_session(key);
        self.ask(Job::RemoveSnapshots {
            owner: owner_dir_name(key.0),
            session: key.1.clone(),
            name: None,
        });
        true
    }

    /// Takes snapshot `name` of session `asked.key`'s disk (its
    /// interpreter's globals from `state`, if it saved them): answered
    /// through [`SessionDisks::done`]; `not_found` at once if the session
    /// has no disk (closed meanwhile).
    pub fn take_snapshot(
        &self,
        name: String,
        state: Option<OwnedFd>,
        asked: Asked,
    ) -> Result<(), ErrorReply> {
        let disk = self
            .stored
            .disk_of(&asked.key)
            .ok_or_else(|| no_session(&asked.key))?;
        let shared = disk.record.template.as_deref().filter(|t| !t.contains('@'));
        let template = shared.map(|t| self.templates.dir(t));
        self.ask(Job::Snapshot {
            disk,
            name,
            state,
            asked,
            template,
        });
        Ok(())
    }

    /// Changes session `key`'s record — its environment, labels or
    /// lifetime, its publication in the fleet — and writes it; `None`: it
    /// has no record.
    pub fn change_record<R>(
        &mut self,
        key: &SessionKey,
        change: impl FnOnce(&mut SessionRecord) -> R,
    ) -> Option<R> {
        let (changed, dir, record) = self.stored.change_record(key, change)?;
        self.write_record(key, dir, record);
        Some(changed)
    }

    /// Session `key` has hibernated into its snapshot `name`: recorded, so
    /// its next interpreter starts with its globals, even after a restart.
    pub fn hibernated(&mut self, key: &SessionKey, name: &str) {
        if let Some((dir, record)) = self.stored.hibernated(key, name) {
            self.write_record(key, dir, record);
        }
    }

    /// Session `key`'s next interpreter starts on its snapshot `name` (see
    /// [`Stored::restore_next`]).
    pub fn restore_next(&mut self, key: &SessionKey, name: &str) {
        let state = self.snapshots.find(key, name).is_ok_and(|s| s.state);
        self.stored.restore_next(key, name, state);
    }

    /// Brings session `key`'s hibernation, fetched from the fleet into
    /// `staging`, into its owner's store, with the `template` it carries
    /// (JSON, as published: found here, or kept): answered through
    /// [`SessionDisks::done`]; refused at once if that does not parse, or
    /// while a template of its name is being built.
    pub fn import(
        &mut self,
        key: &SessionKey,
        (manifest, staging): (Vec<u8>, PathBuf),
        template: Option<Vec<u8>>,
    ) -> Result<(), ErrorReply> {
        let (bytes, owner) = (self.template_bytes, key.0);
        let arrival = template.map(|json| self.templates.arrival(&json, bytes, owner));
        let template = arrival.transpose().inspect_err(|_| {
            self.ask(Job::Remove(vec![DiskDir(staging.clone())]));
        })?;
        let (key, owner) = (key.clone(), owner_dir_name(key.0));
        self.ask(Job::Import {
            key,
            owner,
            manifest,
            staging,
            template,
        });
        Ok(())
    }

    /// Session `key`, brought from the fleet, is made here on a new disk
    /// with its files, its `meta` (as published) and its template, its
    /// next interpreter with its globals (`state`); its record says to
    /// claim publication `generation` before it wakes.
    pub fn wake_imported(
        &mut self,
        key: &SessionKey,
        state: bool,
        carried: Carried<'_>,
        generation: i64,
    ) {
        let (mut disk, new) = self.stored.restoring(key, key, HIBERNATED, state);
        (disk.record.meta, disk.record.template) = self.stored.carry(key, carried, generation);
        disk.record.published = Some(generation);
        let asked = Asked {
            key: key.clone(),
            reply_to: ReplyTo::Nobody,
            not_saved: Vec::new(),
            hibernate: false,
            fleet: true,
        };
        self.ask(Job::Restore { disk, new, asked });
    }

    /// Session `key`'s hibernation, brought from the fleet, is not to be
    /// woken here (another node claimed it first).
    pub fn forget_import(&self, key: &SessionKey) {
        self.ask(Job::RemoveSnapshots {
            owner: owner_dir_name(key.0),
            session: key.1.clone(),
            name: Some(HIBERNATED.to_owned()),
        });
    }

    /// Restores session `asked.key`'s snapshot `name` onto the disk of
    /// `into` — the session's own, stored without an interpreter, or a new
    /// session's (a branch, made within its owner's share as any): answered
    /// through [`SessionDisks::done`]. A run asked of `into` meanwhile is
    /// given its disk after this.
    pub fn restore_onto(&mut self, into: &SessionKey, name: &str, asked: Asked) {
        let state = self.snapshots.find(&asked.key, name).is_ok_and(|s| s.state);
        let (disk, new) = self.stored.restoring(into, &asked.key, name, state);
        self.ask(Job::Restore { disk, new, asked });
    }

    /// Session `key`'s snapshots (`op: snapshots`), oldest first.
    pub fn snapshots_of(&self, key: &SessionKey) -> Result<Vec<SnapshotInfo>, ErrorReply> {
        self.require("snapshots")?;
        self.stored.record(key).ok_or_else(|| no_session(key))?;
        Ok(self.snapshots.list(key))
    }

    /// Removes session `key`'s snapshot `name` (`op: remove_snapshot`).
    pub fn remove_snapshot(&mut self, key: &SessionKey, name: &str) -> Result<(), ErrorReply> {
        self.require("snapshots")?;
        self.stored.record(key).ok_or_else(|| no_session(key))?;
        self.snapshots.find(key, name)?;
        self.snapshots.remove(key, name);
        self.ask(Job::RemoveSnapshots {
            owner: owner_dir_name(key.0),
            session: key.1.clone(),
            name: Some(name.to_owned()),
        });
        Ok(())
    }

    /// `owner` (an agent, a run) has ended: its disks go, and what it was
    /// given is forgotten. An operator's (or a delegate's) sessions and
    /// volumes last until closed or removed.
    pub fn remove_owner(&mut self, owner: Principal) {
        if owner.outlives_kernels() {
            return;
        }
        // An agent's next incarnation (a restart) starts from the same
        // template: it stays in use until the agent has ended for good.
        if !matches!(owner, Principal::Agent { .. }) {
            self.agent_templates.remove(&owner);
        }
        self.room.forget(owner);
        self.record_writes.forget_owner(owner);
        let own: Vec<DiskDir> = (self.templates.own_of(owner).iter())
            .filter_map(|key| self.templates.forget(key))
            .collect();
        if !own.is_empty() {
            self.ask(Job::Remove(own));
        }
        let volumes = self.volumes.forget(owner);
        if !volumes.is_empty() {
            self.ask(Job::Remove(volumes));
        }
        self.ask(Job::RemoveOwner(self.volumes.owner_dir(owner)));
        // Its whole store goes at once, not session by session.
        let keys = self.stored.keys_of(owner);
        let sessions: Vec<DiskDir> = keys.iter().filter_map(|k| self.stored.remove(k)).collect();
        for key in &keys {
            self.snapshots.remove_session(key);
        }
        if !sessions.is_empty() {
            self.ask(Job::Remove(sessions));
        }
        self.ask(Job::RemoveOwner(self.stored.owner_dir(owner)));
        self.ask(Job::RemoveStore(owner_dir_name(owner)));
    }

    /// Unmounts every disk (shutdown): they stay on the host for the next
    /// kernel.
    pub fn finish(&mut self) {
        let keys = self.stored.records().keys();
        let mut dirs: Vec<DiskDir> = keys.map(|key| self.stored.dir(key)).collect();
        dirs.extend(self.templates.dirs());
        dirs.extend(self.volumes.dirs());
        if let Some(worker) = &mut self.worker {
            worker.finish(dirs);
        }
    }
}
