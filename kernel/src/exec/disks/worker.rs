//! The disks' thread: everything that touches a disk — making, mounting
//! and giving it to a run child, recording a session, publishing a
//! template once built, removing either, taking a session's snapshot
//! and restoring one — happens here, in the order asked, off the reactor.
//! Giving disks to a child, publishing a template, a snapshot and a
//! branch are answered (each holds up a reply); the rest is logged if it
//! fails.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::fleet_templates::{arrive, image_of, FleetFiles, ImportError, TemplateArrival};
use super::image::{free_bytes, DiskDir, RunUser, SESSION_PARTS, TEMPLATE_PARTS};
pub use super::jobs::{Asked, Attached, DiskError, Done, Job, Plan, SessionDisk, TemplateDisk};
use super::made::{make_volume, publish};
use super::record::{SessionRecord, SnapshotRef};
use super::record_writes;
use super::store::{Manifest, Room, SnapshotFiles, Store, StoreError};
use crate::exec::order::HIBERNATED;
use crate::exec::waiting::SessionKey;
use crate::sandbox::attach::{self, Place, VolumeRoots};
use crate::sandbox::plan::RUN_VOLUME_ROOTS;

/// How long after failing to make a spare disk it is tried again.
const SPARE_RETRY: Duration = Duration::from_secs(60);

/// Where each part of a session's disk goes in its run child.
const SESSION_PLACES: [Place; 3] = [
    Place {
        part: "workspace",
        target: "/workspace",
    },
    Place {
        part: "home",
        target: crate::exec::zygote::SESSION_HOME,
    },
    Place {
        part: "tmp",
        target: "/tmp",
    },
];

/// Where a template's environment goes in a run child.
const TEMPLATE_PLACE: Place = Place {
    part: "env",
    target: crate::exec::zygote::TEMPLATE_ROOT,
};

/// The handle to the disks' thread.
#[derive(Debug)]
pub struct Worker {
    jobs: Sender<Job>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread; disks' parts are owned by `user`, snapshots go
    /// into `store` within `limits`, a session's disk of `session_bytes` is
    /// kept made ahead in `spare`, and each answer wakes `waker`.
    pub fn start(
        user: RunUser,
        store: Store,
        limits: StoreLimits,
        (spare, session_bytes): (DiskDir, u64),
        waker: Arc<mio::Waker>,
    ) -> std::io::Result<Worker> {
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let thread = agentos_primitives::threads::spawn("agentos-disks", move || {
            let spare = Spare {
                dir: spare,
                bytes: session_bytes,
                ready: false,
                retry_at: None,
            };
            let mut snapshots = Snapshots {
                store,
                limits,
                user,
                spare,
            };
            serve(&job_rx, &mut snapshots, &done_tx, &waker);
        })?;
        Ok(Worker {
            jobs,
            done,
            thread: Some(thread),
        })
    }

    /// Asks for `job`.
    pub fn ask(&self, job: Job) {
        if self.jobs.send(job).is_err() {
            log::error!("disks: the disks' thread has ended");
        }
    }

    /// What was answered since the last call.
    pub fn done(&self) -> Vec<Done> {
        self.done.try_iter().collect()
    }

    /// Unmounts `dirs`' disks and waits for the thread to end.
    pub fn finish(&mut self, dirs: Vec<DiskDir>) {
        self.ask(Job::Finish(dirs));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What snapshots may take: bytes of each owner's store, and of all.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    /// `exec.snapshot_bytes`.
    pub per_owner: u64,
    /// `exec.snapshot_bytes_total`.
    pub total: u64,
    /// Bytes of the host's disk snapshots never take.
    pub host_reserve: u64,
}

/// The store, as the thread keeps it, and a session's disk made ahead.
struct Snapshots {
    store: Store,
    limits: StoreLimits,
    user: RunUser,
    /// A session's disk made and mounted ahead of need, where it lies:
    /// a new session (or a branch) takes it rather than wait for one to be
    /// allocated, formatted and mounted (tens of milliseconds).
    spare: Spare,
}

/// A session's disk made ahead of need.
struct Spare {
    dir: DiskDir,
    /// Its size, every session's (`exec.session_disk_bytes`).
    bytes: u64,
    /// It is made and mounted.
    ready: bool,
    /// Making it failed: it is not tried again before then (a host whose
    /// disk is full is not asked after every job).
    retry_at: Option<Instant>,
}

impl Spare {
    /// Makes it, if it is not ready: after each job, so no one waits.
    fn make(&mut self, user: RunUser) {
        let now = Instant::now();
        if self.ready || self.retry_at.is_some_and(|at| now < at) {
            return;
        }
        let _ = self.dir.remove();
        match self.dir.mount(self.bytes, user, &SESSION_PARTS) {
            Ok(_) => (self.ready, self.retry_at) = (true, None),
            Err(err) => {
                log::warn!(
                    "disks: cannot make a session's disk ahead (tried again in {} s): {err}",
                    SPARE_RETRY.as_secs()
                );
                self.retry_at = Some(now + SPARE_RETRY);
            }
        }
    }

    /// Mounts session disk `dir` — if it has none, this one if it is
    /// ready, else one made now: whether it had one.
    fn give(&mut self, dir: &DiskDir, user: RunUser) -> io::Result<bool> {
        let existed = dir.has_disk();
        if self.ready && !existed {
            self.ready = false;
            if dir.take_spare(&self.dir).is_ok() {
                return Ok(false);
            }
        }
        dir.mount(self.bytes, user, &SESSION_PARTS)?;
        Ok(existed)
    }
}

impl Snapshots {
    /// Bytes `owner`'s next snapshot may add.
    fn room(&self, owner: &str) -> Room {
        // One that cannot be measured takes nothing it cannot check.
        let free = free_bytes(self.store.root()).unwrap_or(0);
        let limits = self.limits;
        Room {
            owner: limits.per_owner.saturating_sub(self.store.held_by(owner)),
            kernel: (limits.total.saturating_sub(self.store.held()))
                .min(free.saturating_sub(limits.host_reserve)),
        }
    }

    /// Takes snapshot `name` of `disk`'s session.
    fn take(
        &mut self,
        disk: &SessionDisk,
        name: &str,
        state: Option<&OwnedFd>,
        files: bool,
    ) -> Result<(Manifest, Vec<String>), StoreError> {
        let room = self.room(&disk.owner);
        let now = super::record::seconds(std::time::SystemTime::now());
        let taking = (disk.owner.as_str(), disk.session.as_str(), name);
        let mount_point = disk.dir.mount_point();
        let files = files.then_some(mount_point.as_path());
        self.store.take(taking, files, state, room, now)
    }

    /// Restores onto `disk` what its record asks, and opens the globals
    /// its interpreter is to start with.
    fn restore(&self, disk: &SessionDisk) -> Result<Option<OwnedFd>, StoreError> {
        let record = &disk.record;
        let restored = self.restore_files(disk)?;
        let Some(from) = &record.state_from else {
            return Ok(None);
        };
        let manifest = match restored.filter(|_| record.restore_from.as_ref() == Some(from)) {
            Some(manifest) => manifest,
            None => self.manifest(&disk.owner, from)?,
        };
        let Some(state) = &manifest.state else {
            return Ok(None);
        };
        let file = self.store.open_state(&disk.owner, &from.name, state)?;
        Ok(Some(OwnedFd::from(file)))
    }

    /// Restores onto `disk` the files of the snapshot its record names, if
    /// it names one: that snapshot's manifest.
    fn restore_files(&self, disk: &SessionDisk) -> Result<Option<Manifest>, StoreError> {
        let Some(from) = &disk.record.restore_from else {
            return Ok(None);
        };
        let manifest = self.manifest(&disk.owner, from)?;
        let mount_point = disk.dir.mount_point();
        (self.store).restore(&disk.owner, &manifest, &mount_point, self.user)?;
        Ok(Some(manifest))
    }

    fn manifest(&self, owner: &str, from: &SnapshotRef) -> Result<Manifest, StoreError> {
        self.store.manifest(owner, &from.session, &from.name)
    }
}

fn serve(jobs: &Receiver<Job>, snapshots: &mut Snapshots, done: &Sender<Done>, waker: &mio::Waker) {
    let user = snapshots.user;
    for job in jobs {
        let answer = match job {
            Job::Attach { child, pidfd, plan } => {
                let result = give_disks(&pidfd, &plan, snapshots);
                if let Err(err) = &result {
                    log::warn!("disks: run child {child}: {err}");
                }
                Some(Done::Attached { child, result })
            }
            Job::Publish {
                name,
                build,
                to,
                record,
            } => {
                let result = publish(&build, &to, record);
                if let Err(err) = &result {
                    log::warn!("template {name}: {err}");
                    let _ = build.remove();
                }
                Some(Done::Published { name, result })
            }
            Job::MakeVolume { key, dir, record } => {
                let result = make_volume(&dir, &record, user);
                if let Err(err) = &result {
                    log::warn!("volume {:?}: {err}", key.1);
                    let _ = dir.remove();
                }
                Some(Done::VolumeMade { key, result })
            }
            Job::MountTemplates(dirs) => {
                for dir in dirs {
                    if let Err(err) = dir.mount_read_only() {
                        log::warn!("template {}: {err}", dir.0.display());
                    }
                }
                None
            }
            Job::MountVolumes(volumes) => {
                let mut mounted = Vec::new();
                for (key, dir) in volumes {
                    match dir.mount_made() {
                        Ok(()) => mounted.push(key),
                        Err(err) => log::warn!("volume {}: {err}", dir.0.display()),
                    }
                }
                Some(Done::VolumesMounted(mounted))
            }
            Job::Record { dir, record } => {
                let written = record_writes::take(&record).map(|record| record.write(&dir.0));
                if let Some(Err(err)) = written {
                    log::warn!("disk {}: cannot record it: {err}", dir.0.display());
                }
                None
            }
            Job::Snapshot {
                disk,
                name,
                state,
                asked,
                template,
            } => {
                let keeps_files = !asked.hibernate || asked.fleet;
                let result = snapshots.take(&disk, &name, state.as_ref(), keeps_files);
                if let Err(err) = &result {
                    log::info!("snapshot {name:?} of session {:?}: {err}", asked.key.1);
                }
                let files = match &result {
                    Ok((manifest, _)) if asked.hibernate && asked.fleet => {
                        let files = snapshots.store.files_of(&disk.owner, manifest);
                        with_template(files, &disk, template.as_ref())
                    }
                    _ => None,
                };
                Some(Done::Snapshotted {
                    asked,
                    result,
                    files,
                })
            }
            Job::Import {
                key,
                owner,
                manifest,
                staging,
                template,
            } => Some(import(
                snapshots,
                (key, &owner),
                &manifest,
                &staging,
                template,
            )),
            Job::Restore {
                mut disk,
                new,
                asked,
            } => {
                let result = restore_onto(&mut disk, new, snapshots);
                if let Err(err) = &result {
                    log::info!("restore into {:?}: {err}", disk.session);
                    if new {
                        let _ = disk.dir.remove();
                    }
                }
                if let (true, Ok(record)) = (asked.fleet, &result) {
                    let keeps_state = record.state_from.is_some();
                    let made = (disk.owner.as_str(), disk.session.as_str(), HIBERNATED);
                    snapshots.store.made_from_import(made, keeps_state);
                }
                let into = disk.session;
                Some(Done::Restored {
                    asked,
                    into,
                    new,
                    result,
                })
            }
            Job::RemoveSnapshots {
                owner,
                session,
                name,
            } => {
                let removed = snapshots.store.remove(&owner, &session, name.as_deref());
                if let Err(err) = removed {
                    log::warn!("snapshots of session {session:?}: cannot remove them: {err}");
                }
                None
            }
            Job::RemoveStore(owner) => {
                if let Err(err) = snapshots.store.remove_owner(&owner) {
                    log::warn!("snapshots of {owner}: cannot remove them: {err}");
                }
                None
            }
            Job::Remove(dirs) => {
                for dir in dirs {
                    if let Err(err) = dir.remove() {
                        log::warn!("disk {}: cannot remove it: {err}", dir.0.display());
                    }
                }
                None
            }
            Job::RemoveOwner(path) => {
                // Still holding a session made since: it stays.
                let _ = std::fs::remove_dir(path);
                None
            }
            Job::Finish(dirs) => {
                for dir in dirs {
                    if let Err(err) = dir.unmount() {
                        log::warn!("disk {}: cannot unmount it: {err}", dir.0.display());
                    }
                }
                // Owned by no one, it is made again by the next kernel.
                let _ = snapshots.spare.dir.remove();
                return;
            }
        };
        if let Some(answer) = answer {
            let _ = done.send(answer);
            let _ = waker.wake();
        }
        snapshots.spare.make(user);
    }
}

/// Mounts the disks of `plan` (a new session's made first, with its
/// record; a snapshot restored onto it if its record asks) and mounts
/// their parts in the child: whether the session's disk was there before,
/// and the globals its interpreter is to start with.
fn give_disks(
    pidfd: &OwnedFd,
    plan: &Plan,
    snapshots: &mut Snapshots,
) -> Result<Attached, DiskError> {
    let user = snapshots.user;
    let mut places = Vec::new();
    let mut attached = Attached {
        existed: false,
        state: None,
    };
    if let Some(disk) = &plan.session {
        let dir = &disk.dir;
        attached.existed = (snapshots.spare.give(dir, user)).map_err(DiskError::Mount)?;
        let pending = disk.record.restore_from.is_some() || disk.record.state_from.is_some();
        if !attached.existed || pending {
            // What was to be restored is done with, whether it could be or
            // not: a damaged snapshot is refused once, not at every start.
            let record = SessionRecord {
                restore_from: None,
                state_from: None,
                ..disk.record.clone()
            };
            record.write(&dir.0).map_err(DiskError::Record)?;
        }
        attached.state = snapshots.restore(disk).map_err(DiskError::Restore)?;
        places.extend(SESSION_PLACES.map(|place| (dir.mount_point(), place)));
    }
    match &plan.template {
        Some(TemplateDisk::Use(dir)) => {
            dir.mount_read_only().map_err(DiskError::Mount)?;
            places.push((dir.mount_point(), TEMPLATE_PLACE));
        }
        Some(TemplateDisk::Build { dir, bytes }) => {
            // A build's disk is always a new one: what an earlier build
            // left is not built upon.
            let _ = dir.remove();
            dir.mount(*bytes, user, &TEMPLATE_PARTS)
                .map_err(DiskError::Mount)?;
            places.push((dir.mount_point(), TEMPLATE_PLACE));
        }
        None => {}
    }
    let mut volumes = Vec::with_capacity(plan.volumes.len());
    for (dir, place) in &plan.volumes {
        dir.mount_made().map_err(DiskError::Mount)?;
        volumes.push(place.clone());
    }
    let roots = VolumeRoots {
        base: "/".into(),
        covered: RUN_VOLUME_ROOTS.to_vec(),
        owner: (user.uid, user.gid),
    };
    attach::attach(pidfd.as_fd(), &places, &volumes, &roots).map_err(DiskError::Attach)?;
    Ok(attached)
}

/// Restores a snapshot onto a disk without an interpreter (made now if
/// it is `new`), then records it: its next interpreter starts with the
/// snapshot's globals.
fn restore_onto(
    disk: &mut SessionDisk,
    new: bool,
    snapshots: &mut Snapshots,
) -> Result<SessionRecord, DiskError> {
    if new {
        let _ = disk.dir.remove();
    }
    (snapshots.spare.give(&disk.dir, snapshots.user)).map_err(DiskError::Mount)?;
    let restored = snapshots.restore_files(disk).map_err(DiskError::Restore)?;
    if let Some(manifest) = restored {
        // Its globals become the session's own, as a hibernated session's
        // are: its first interpreter loads them even if the snapshot (or
        // the session it was taken of) is gone by then.
        disk.record.state_from = match manifest.state {
            Some(state) => {
                let own = (disk.owner.as_str(), disk.session.as_str(), HIBERNATED);
                (snapshots.store.keep_state(own, state, manifest.created_at))
                    .map_err(|err| DiskError::Restore(err.into()))?;
                Some(SnapshotRef {
                    session: disk.session.clone(),
                    name: HIBERNATED.to_owned(),
                })
            }
            None => None,
        };
    }
    disk.record.restore_from = None;
    disk.record.write(&disk.dir.0).map_err(DiskError::Record)?;
    Ok(disk.record.clone())
}

/// Brings session `key`'s hibernation, fetched from the fleet into
/// `staging`, into `owner`'s store, once its template has arrived (found
/// here, or kept); `staging` goes either way.
fn import(
    snapshots: &mut Snapshots,
    (key, owner): (SessionKey, &str),
    manifest: &[u8],
    staging: &std::path::Path,
    template: Option<TemplateArrival>,
) -> Done {
    let (arrived, settled) = match &template {
        Some(template) => {
            let (arrived, settled) = arrive(template, staging);
            (Some((template.name().to_owned(), arrived)), settled)
        }
        None => (None, Ok(())),
    };
    let result = settled.map_err(ImportError::from).and_then(|()| {
        let room = snapshots.room(owner);
        let session = (owner, key.1.as_str(), HIBERNATED);
        let imported = snapshots.store.import(session, manifest, staging, room);
        imported.map_err(ImportError::from)
    });
    if let Err(err) = &result {
        let _ = std::fs::remove_dir_all(staging);
        log::warn!("session {:?} from the fleet: {err}", key.1);
    }
    Done::Imported {
        key,
        result,
        template: arrived,
    }
}

/// A hibernation's files for the fleet, with its template's image if the
/// session was opened from an operator's (`template`); `None` if that
/// cannot be read, as a session woken elsewhere without it would not run
/// as it did: it stays on this node.
fn with_template(
    snapshot: SnapshotFiles,
    disk: &SessionDisk,
    template: Option<&DiskDir>,
) -> Option<FleetFiles> {
    let (Some(dir), Some(name)) = (template, &disk.record.template) else {
        return Some(FleetFiles {
            snapshot,
            template: None,
        });
    };
    match image_of(dir, name) {
        Ok(image) => Some(FleetFiles {
            snapshot,
            template: Some(image),
        }),
        Err(err) => {
            log::warn!("session {:?} stays on this node: {err}", disk.session);
            None
        }
    }
}
