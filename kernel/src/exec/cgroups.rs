//! Each run's own cgroup, made and removed off the reactor.
//!
//! Making a cgroup takes a fraction of a millisecond at the median and
//! tens at the tail, and moving a process into one by pid takes the
//! kernel's global threadgroup lock (about 10 ms here, while every fork on
//! the host waits). So neither happens on the request path: this thread
//! makes cgroups ahead of need, with the default limits of a run, and
//! opens the files a process writes `0` into to move *itself* in (v1's
//! `tasks`: only the writing thread moves, which needs no global lock).
//! The kernel hands those descriptors to an exec host's zygote, and the
//! run child it forks next moves itself in before anything else and
//! closes them. A finished run's cgroup comes back here to be removed
//! once its processes are gone.

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::HostId;
use crate::cgroup::{AgentCgroup, CgroupError, CgroupLimits, Cgroups};
use crate::process;
use crate::sandbox::runtime::retire::{self, Retiring};

enum Job {
    /// Make `count` cgroups for a host's next runs.
    Make { host: HostId, count: usize },
    /// Remove a cgroup once it is empty.
    Remove(AgentCgroup),
    /// Remove everything held, killing what is left, and stop.
    Finish,
}

/// A cgroup made for one of a host's runs (or why none could be).
#[derive(Debug)]
pub struct Made {
    /// The host it is for.
    pub host: HostId,
    /// The cgroup, and the files (opened for writing) a process writes `0`
    /// into to join it, one per hierarchy.
    pub result: Result<(AgentCgroup, Vec<OwnedFd>), CgroupError>,
}

/// The handle to the run-cgroup thread.
#[derive(Debug)]
pub struct RunCgroups {
    jobs: Sender<Job>,
    made: Receiver<Made>,
    thread: Option<JoinHandle<()>>,
}

impl RunCgroups {
    /// Starts the thread. Each cgroup it makes gets `limits` (a run's
    /// defaults) and wakes `waker`.
    pub fn start(
        cgroups: Arc<Cgroups>,
        limits: CgroupLimits,
        waker: Arc<mio::Waker>,
    ) -> std::io::Result<RunCgroups> {
        let (jobs, job_rx) = mpsc::channel();
        let (made_tx, made) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("agentos-run-cgroups".into())
            .spawn(move || serve(&cgroups, &limits, &job_rx, &made_tx, &waker))?;
        Ok(RunCgroups {
            jobs,
            made,
            thread: Some(thread),
        })
    }

    /// Asks for `count` more cgroups for `host`'s runs.
    pub fn make(&self, host: HostId, count: usize) {
        self.send(Job::Make { host, count });
    }

    /// Hands back a cgroup to remove once its processes are gone.
    pub fn remove(&self, cgroup: AgentCgroup) {
        self.send(Job::Remove(cgroup));
    }

    /// cgroups made since the last call.
    pub fn made(&self) -> impl Iterator<Item = Made> + '_ {
        self.made.try_iter()
    }

    /// Removes every cgroup the thread holds, killing what is in them,
    /// and waits for it to stop (shutdown only).
    pub fn finish(&mut self) {
        self.send(Job::Finish);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        for made in self.made.try_iter() {
            if let Ok((cgroup, _)) = made.result {
                retire::remove_now(&cgroup);
            }
        }
    }

    fn send(&self, job: Job) {
        // Fails only if the thread is gone: a panic, or after `finish`.
        if self.jobs.send(job).is_err() {
            log::error!("the run-cgroup thread is gone");
        }
    }
}

fn serve(
    cgroups: &Cgroups,
    limits: &CgroupLimits,
    jobs: &Receiver<Job>,
    made: &Sender<Made>,
    waker: &mio::Waker,
) {
    // Runs' cgroups are made ahead of need: that work yields to requests.
    if let Err(err) = process::idle_priority_for_this_thread() {
        log::debug!("the run-cgroup thread keeps normal priority: {err}");
    }
    let mut retiring = Retiring::default();
    let mut sweeping = false;
    let mut number = 0u64;
    loop {
        let job = if sweeping {
            jobs.recv_timeout(retire::RETRY_EVERY)
        } else {
            jobs.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match job {
            Ok(Job::Make { host, count }) => {
                for _ in 0..count {
                    number += 1;
                    let result = make(cgroups, &format!("exec-run-{number}"), limits);
                    if made.send(Made { host, result }).is_err() {
                        return;
                    }
                }
                let _ = waker.wake();
            }
            Ok(Job::Remove(cgroup)) => sweeping |= retiring.retire(cgroup),
            Err(RecvTimeoutError::Timeout) => sweeping = retiring.sweep(),
            Ok(Job::Finish) | Err(RecvTimeoutError::Disconnected) => {
                // Whatever is still queued goes too.
                for job in jobs.try_iter() {
                    if let Job::Remove(cgroup) = job {
                        retire::remove_now(&cgroup);
                    }
                }
                retiring.remove_all();
                return;
            }
        }
    }
}

fn make(
    cgroups: &Cgroups,
    name: &str,
    limits: &CgroupLimits,
) -> Result<(AgentCgroup, Vec<OwnedFd>), CgroupError> {
    let cgroup = cgroups.create(name, limits)?;
    let mut files = Vec::new();
    for path in cgroup.self_join_files() {
        match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(file) => files.push(OwnedFd::from(file)),
            Err(source) => {
                retire::remove_now(&cgroup);
                return Err(CgroupError::Io {
                    action: "cannot open",
                    path,
                    source,
                });
            }
        }
    }
    Ok((cgroup, files))
}
