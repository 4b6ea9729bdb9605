//! What the disks' thread ([`super::worker`]) is asked, and what it
//! answers.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

pub use super::disk_error::DiskError;
use super::fleet_templates::{Arrived, FleetFiles, ImportError, TemplateArrival};
use super::image::DiskDir;
use super::record::{SessionRecord, TemplateRecord, VolumeRecord};
use super::record_writes::PendingRecord;
use super::store::{Manifest, StoreError};
use super::volumes::VolumeKey;
use crate::address::ReplyTo;
use crate::exec::waiting::SessionKey;
use crate::sandbox::attach::VolumePlace;

/// A session's disk, as a run child is given it.
#[derive(Debug)]
pub struct SessionDisk {
    /// Its directory.
    pub dir: DiskDir,
    /// Its size, if it is made now.
    pub bytes: u64,
    /// Its record: written if it is new; what is to be restored onto it
    /// first, and the globals its interpreter starts with.
    pub record: SessionRecord,
    /// Its owner's store of snapshots.
    pub owner: String,
    /// Its session's name.
    pub session: String,
}

/// The disks a run child is given before its first order.
#[derive(Debug)]
pub struct Plan {
    /// Its session's disk.
    pub session: Option<SessionDisk>,
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
    /// Write a session's record (the latest, see [`record_writes`]).
    Record { dir: DiskDir, record: PendingRecord },
    /// A template's build has succeeded: its disk is let go, shrunk, moved
    /// from `build` to `to`, and recorded.
    Publish {
        name: String,
        build: DiskDir,
        to: DiskDir,
        record: TemplateRecord,
    },
    /// Take a snapshot of a session's disk, with the globals `state`
    /// holds if it was asked for them.
    Snapshot {
        disk: SessionDisk,
        name: String,
        state: Option<OwnedFd>,
        asked: Asked,
        /// The operator's template the session was opened from, which a
        /// hibernation for the fleet carries.
        template: Option<DiskDir>,
    },
    /// Bring a snapshot another node took into `owner`'s store, as
    /// session `key`'s hibernation (see [`Store::import`]).
    Import {
        key: SessionKey,
        owner: String,
        manifest: Vec<u8>,
        staging: PathBuf,
        template: Option<TemplateArrival>,
    },
    /// Restore a snapshot onto a session's disk without an interpreter:
    /// a `new` one (a branch), or one stored.
    Restore {
        disk: SessionDisk,
        new: bool,
        asked: Asked,
    },
    /// Delete an owner's snapshots of a session (`name`, or all), and the
    /// objects no snapshot names any more.
    RemoveSnapshots {
        owner: String,
        session: String,
        name: Option<String>,
    },
    /// Delete an owner's whole store of snapshots.
    RemoveStore(String),
    /// Unmount and delete disks (closed sessions, removed templates, failed
    /// builds).
    Remove(Vec<DiskDir>),
    /// Delete an owner's directory, once its sessions are removed.
    RemoveOwner(PathBuf),
    /// Unmount every disk in `dirs` and stop.
    Finish(Vec<DiskDir>),
}

/// Who asked for a snapshot or a branch, carried to its answer.
#[derive(Debug)]
pub struct Asked {
    /// The session it is of, or made.
    pub key: SessionKey,
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// The globals its interpreter could not save.
    pub not_saved: Vec<String>,
    /// It hibernates the session: only its globals are kept (its files
    /// stay on its disk), unless it is the `fleet`'s.
    pub hibernate: bool,
    /// The fleet's: a hibernation that keeps the session's files too, for
    /// the fleet to keep (so that it wakes on any node), or a session
    /// brought from the fleet, restored here.
    pub fleet: bool,
}

/// What a child given its disks is told.
#[derive(Debug)]
pub struct Attached {
    /// Its session's disk was there before.
    pub existed: bool,
    /// The globals its interpreter is to start with (a descriptor of the
    /// store's object, read-only).
    pub state: Option<OwnedFd>,
}

/// What the thread answers.
#[derive(Debug)]
pub enum Done {
    /// A child was given its disks, or could not be.
    Attached {
        child: usize,
        result: Result<Attached, DiskError>,
    },
    /// A snapshot was taken (with the paths it left out), or was not;
    /// a hibernation the fleet is to keep says where it lies.
    Snapshotted {
        asked: Asked,
        result: Result<(Manifest, Vec<String>), StoreError>,
        files: Option<FleetFiles>,
    },
    /// A snapshot from another node was brought into session `key`'s
    /// store, or was not.
    Imported {
        key: SessionKey,
        result: Result<Manifest, ImportError>,
        /// Its template: its name, and how it arrived.
        template: Option<(String, Arrived)>,
    },
    /// A snapshot was restored onto session `into`'s disk (a `new` one,
    /// or one without an interpreter), or was not.
    Restored {
        asked: Asked,
        into: String,
        new: bool,
        result: Result<SessionRecord, DiskError>,
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
