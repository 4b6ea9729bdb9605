//! The disks' thread: everything that touches a session's disk — making,
//! mounting and giving it to a run child, recording the session, removing
//! it — happens here, in the order asked, off the reactor. Only giving a
//! disk to a child is answered (it holds up a run); the rest is logged if
//! it fails.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::attach::{self, Place};
use super::image::{RunUser, SessionDir};
use super::record::SessionRecord;

/// What the thread is asked to do.
pub enum Job {
    /// Make (if new) and mount session `dir`'s disk, and mount its parts
    /// over `places` in the mount namespace of the child `pidfd` refers
    /// to.
    Attach {
        child: usize,
        pidfd: OwnedFd,
        dir: SessionDir,
        bytes: u64,
        record: SessionRecord,
    },
    /// Write a session's record.
    Record {
        dir: SessionDir,
        record: SessionRecord,
    },
    /// Unmount and delete session disks (closed, or their owner ended).
    Remove(Vec<SessionDir>),
    /// Delete an owner's directory, once its sessions are removed.
    RemoveOwner(PathBuf),
    /// Unmount every disk in `dirs` and stop.
    Finish(Vec<SessionDir>),
}

/// A child given its disk, or why it could not be.
#[derive(Debug)]
pub struct Attached {
    /// The run child.
    pub child: usize,
    /// Whether the disk was there before (the session was stored), or
    /// why the child could not be given it.
    pub result: Result<bool, DiskError>,
}

/// Why a run child could not be given its session's disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The disk could not be made or mounted.
    #[error("its disk cannot be mounted: {0}")]
    Mount(io::Error),
    /// The session's record could not be written beside it.
    #[error("it cannot be recorded: {0}")]
    Record(io::Error),
    /// Its parts could not be mounted in the child.
    #[error("its disk cannot be given to its sandbox: {0}")]
    Attach(io::Error),
}

/// Where each part of a session's disk goes in its run child.
pub const PLACES: [Place; 3] = [
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

/// The handle to the disks' thread.
#[derive(Debug)]
pub struct Worker {
    jobs: Sender<Job>,
    attached: Receiver<Attached>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread; disks' parts are owned by `user`, and each
    /// child given its disk wakes `waker`.
    pub fn start(user: RunUser, waker: Arc<mio::Waker>) -> std::io::Result<Worker> {
        let (jobs, job_rx) = mpsc::channel();
        let (attached_tx, attached) = mpsc::channel();
        let thread = agentos_primitives::threads::spawn("agentos-session-disks", move || {
            serve(&job_rx, user, &attached_tx, &waker);
        })?;
        Ok(Worker {
            jobs,
            attached,
            thread: Some(thread),
        })
    }

    /// Asks for `job`.
    pub fn ask(&self, job: Job) {
        if self.jobs.send(job).is_err() {
            log::error!("session disks: the disks' thread has ended");
        }
    }

    /// The children given their disks (or not) since the last call.
    pub fn attached(&self) -> Vec<Attached> {
        self.attached.try_iter().collect()
    }

    /// Unmounts `dirs`' disks and waits for the thread to end.
    pub fn finish(&mut self, dirs: Vec<SessionDir>) {
        self.ask(Job::Finish(dirs));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(jobs: &Receiver<Job>, user: RunUser, attached: &Sender<Attached>, waker: &mio::Waker) {
    for job in jobs {
        match job {
            Job::Attach {
                child,
                pidfd,
                dir,
                bytes,
                record,
            } => {
                let result = give_disk(&pidfd, &dir, bytes, user, record);
                if let Err(err) = &result {
                    log::warn!("session disk {}: {err}", dir.0.display());
                }
                let _ = attached.send(Attached { child, result });
                let _ = waker.wake();
            }
            Job::Record { dir, record } => {
                if let Err(err) = record.write(&dir.0) {
                    log::warn!("session disk {}: cannot record it: {err}", dir.0.display());
                }
            }
            Job::Remove(dirs) => {
                for dir in dirs {
                    if let Err(err) = dir.remove() {
                        log::warn!("session disk {}: cannot remove it: {err}", dir.0.display());
                    }
                }
            }
            Job::RemoveOwner(path) => {
                // Still holding a session made since: it stays.
                let _ = std::fs::remove_dir(path);
            }
            Job::Finish(dirs) => {
                for dir in dirs {
                    if let Err(err) = dir.unmount() {
                        log::warn!("session disk {}: cannot unmount it: {err}", dir.0.display());
                    }
                }
                return;
            }
        }
    }
}

/// Mounts session `dir`'s disk (made first if new, with its record) and
/// mounts its parts in the child: whether the disk was there before.
fn give_disk(
    pidfd: &OwnedFd,
    dir: &SessionDir,
    bytes: u64,
    user: RunUser,
    record: SessionRecord,
) -> Result<bool, DiskError> {
    let existed = dir.mount(bytes, user).map_err(DiskError::Mount)?;
    if !existed {
        record.write(&dir.0).map_err(DiskError::Record)?;
    }
    attach::attach(pidfd.as_fd(), &dir.mount_point(), &PLACES).map_err(DiskError::Attach)?;
    Ok(existed)
}
