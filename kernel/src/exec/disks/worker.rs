//! The disks' thread: everything that touches a disk — making, mounting
//! and giving it to a run child, recording a session, publishing a
//! template once built, removing either — happens here, in the order
//! asked, off the reactor. Giving disks to a child and publishing a
//! template are answered (each holds up a reply); the rest is logged if
//! it fails.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::image::{DiskDir, RunUser, SESSION_PARTS, TEMPLATE_PARTS};
use super::record::{SessionRecord, TemplateRecord, VolumeRecord};
use super::volumes::{VolumeKey, VOLUME_PARTS};
use crate::sandbox::attach::{self, Place, VolumePlace, VolumeRoots};
use crate::sandbox::plan::RUN_VOLUME_ROOTS;

/// How long a finished build's disk may take to be let go by its run.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// The disks a run child is given before its first order.
#[derive(Debug)]
pub struct Plan {
    /// Its session's disk: made if new (of `bytes`, with `record`).
    pub session: Option<(DiskDir, u64, SessionRecord)>,
    /// Its template's.
    pub template: Option<TemplateDisk>,
    /// Its volumes: each one's disk, and where it goes.
    pub volumes: Vec<(DiskDir, VolumePlace)>,
}

/// A template's disk, as a run child gets it.
#[derive(Debug)]
pub enum TemplateDisk {
    /// Built: read-only.
    Use(DiskDir),
    /// Being built by this run: made now, of `bytes`, writable.
    Build {
        /// Its directory.
        dir: DiskDir,
        /// Its size while it is built.
        bytes: u64,
    },
}

/// What the thread is asked to do.
pub enum Job {
    /// Gives the child `pidfd` refers to the disks of `plan`, mounted over
    /// their places in its mount namespace.
    Attach {
        child: usize,
        pidfd: OwnedFd,
        plan: Plan,
    },
    /// Make volume `key`'s disk of `bytes`, mount it and record it.
    MakeVolume {
        key: VolumeKey,
        dir: DiskDir,
        record: VolumeRecord,
    },
    /// Mount templates' disks (read-only), for agents started from them.
    MountTemplates(Vec<DiskDir>),
    /// Mount the disks of volumes found at start.
    MountVolumes(Vec<(VolumeKey, DiskDir)>),
    /// Write a session's record.
    Record { dir: DiskDir, record: SessionRecord },
    /// A template's build has succeeded: its disk is let go, shrunk, moved
    /// from `build` to `to`, and recorded.
    Publish {
        name: String,
        build: DiskDir,
        to: DiskDir,
        record: TemplateRecord,
    },
    /// Unmount and delete disks (closed sessions, removed templates, failed
    /// builds).
    Remove(Vec<DiskDir>),
    /// Delete an owner's directory, once its sessions are removed.
    RemoveOwner(PathBuf),
    /// Unmount every disk in `dirs` and stop.
    Finish(Vec<DiskDir>),
}

/// What the thread answers.
#[derive(Debug)]
pub enum Done {
    /// A child was given its disks (whether its session's was there
    /// before), or could not be.
    Attached {
        child: usize,
        result: Result<bool, DiskError>,
    },
    /// A volume's disk was made, or could not be.
    VolumeMade {
        key: VolumeKey,
        result: Result<(), DiskError>,
    },
    /// Volumes found at start whose disks are mounted.
    VolumesMounted(Vec<VolumeKey>),
    /// A template was published, or could not be.
    Published {
        name: String,
        result: Result<TemplateRecord, DiskError>,
    },
}

/// Why a disk could not be given or published.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The disk could not be made or mounted.
    #[error("its disk cannot be mounted: {0}")]
    Mount(io::Error),
    /// Its record could not be written beside it.
    #[error("it cannot be recorded: {0}")]
    Record(io::Error),
    /// Its parts could not be mounted in the child.
    #[error("its disk cannot be given to its sandbox: {0}")]
    Attach(io::Error),
    /// A built template's disk could not be let go, shrunk or moved.
    #[error("the built template cannot be kept: {0}")]
    Publish(io::Error),
}

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
    /// Starts the thread; disks' parts are owned by `user`, and each
    /// answer wakes `waker`.
    pub fn start(user: RunUser, waker: Arc<mio::Waker>) -> std::io::Result<Worker> {
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let thread = agentos_primitives::threads::spawn("agentos-disks", move || {
            serve(&job_rx, user, &done_tx, &waker);
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

fn serve(jobs: &Receiver<Job>, user: RunUser, done: &Sender<Done>, waker: &mio::Waker) {
    for job in jobs {
        let answer = match job {
            Job::Attach { child, pidfd, plan } => {
                let result = give_disks(&pidfd, &plan, user);
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
                if let Err(err) = record.write(&dir.0) {
                    log::warn!("disk {}: cannot record it: {err}", dir.0.display());
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
                return;
            }
        };
        if let Some(answer) = answer {
            let _ = done.send(answer);
            let _ = waker.wake();
        }
    }
}

/// Mounts the disks of `plan` (a new session's made first, with its
/// record) and mounts their parts in the child: whether the session's
/// disk was there before.
fn give_disks(pidfd: &OwnedFd, plan: &Plan, user: RunUser) -> Result<bool, DiskError> {
    let mut places = Vec::new();
    let mut existed = false;
    if let Some((dir, bytes, record)) = &plan.session {
        existed = dir
            .mount(*bytes, user, &SESSION_PARTS)
            .map_err(DiskError::Mount)?;
        if !existed {
            record.write(&dir.0).map_err(DiskError::Record)?;
        }
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
    Ok(existed)
}

/// Makes a volume's disk and mounts it, then records it: a volume is
/// served only once recorded.
fn make_volume(dir: &DiskDir, record: &VolumeRecord, user: RunUser) -> Result<(), DiskError> {
    dir.mount(record.bytes, user, &VOLUME_PARTS)
        .map_err(DiskError::Mount)?;
    record.write(&dir.0).map_err(DiskError::Record)
}

/// A built template's disk, let go by its run, shrunk to its files, moved
/// to its name and recorded — in that order, so a template is served only
/// whole.
fn publish(
    build: &DiskDir,
    to: &DiskDir,
    mut record: TemplateRecord,
) -> Result<TemplateRecord, DiskError> {
    build
        .release(RELEASE_PATIENCE)
        .map_err(DiskError::Publish)?;
    build.shrink().map_err(DiskError::Publish)?;
    record.bytes = build.image_bytes();
    std::fs::rename(&build.0, &to.0).map_err(DiskError::Publish)?;
    record.write(&to.0).map_err(DiskError::Record)?;
    // Ready for agents started from it, which are given it at once.
    if let Err(err) = to.mount_read_only() {
        log::warn!("template {}: {err}", to.0.display());
    }
    Ok(record)
}
