//! Each run's own cgroup, made, recycled and removed off the reactor.
//!
//! Making a cgroup takes a fraction of a millisecond at the median and
//! tens at the tail, and moving a process into one by pid takes the
//! kernel's global threadgroup lock (about 10 ms here, while every fork on
//! the host waits). So neither happens on the request path: this thread
//! makes cgroups ahead of need, with the default limits of a run, and
//! opens the files a process writes `0` into to move *itself* in (v1's
//! `tasks`: only the writing thread moves, which needs no global lock).
//! The kernel hands copies of those descriptors to an exec host's zygote,
//! and the run child it forks next moves itself in before anything else
//! and closes them.
//!
//! A finished run's cgroup comes back here. Once its processes are gone it
//! gets the default limits again and serves another run: making and
//! removing a memory cgroup costs far more CPU than the run it holds (about
//! a millisecond per run here), so cgroups are removed only beyond a few
//! spare, when they do not empty, and at shutdown.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::HostId;
use crate::cgroup::{AgentCgroup, CgroupError, CgroupLimits, Cgroups};
use crate::process;
use crate::sandbox::runtime::retire::{self, RETRY_EVERY};

/// Emptied cgroups kept for the next runs; more are removed.
const SPARE: usize = 32;
/// Tries for a returned cgroup to empty; past half of them, what is left
/// in it is killed, and past all it is removed.
const TRIES: u32 = 100;

/// A run's cgroup and what the kernel needs of it.
#[derive(Debug)]
pub struct RunCgroup {
    /// The cgroup.
    pub cgroup: AgentCgroup,
    /// The files (opened for writing) a process writes `0` into to join
    /// it, one per hierarchy.
    pub join_files: Vec<OwnedFd>,
    /// The limits in force in it.
    pub limits: CgroupLimits,
    /// OOM kills it had seen when it was handed out (it may have served
    /// runs before).
    pub oom_kills: u64,
}

enum Job {
    /// Hand out `count` cgroups for a host's next runs.
    Make { host: HostId, count: usize },
    /// Take back a cgroup whose run is over, to serve another once empty.
    Recycle(RunCgroup),
    /// Remove everything held, killing what is left, and stop.
    Finish,
}

/// A cgroup handed out for one of a host's runs (or why none could be).
#[derive(Debug)]
pub struct Made {
    /// The host it is for.
    pub host: HostId,
    /// The cgroup.
    pub result: Result<RunCgroup, CgroupError>,
}

/// The handle to the run-cgroup thread.
#[derive(Debug)]
pub struct RunCgroups {
    jobs: Sender<Job>,
    made: Receiver<Made>,
    thread: Option<JoinHandle<()>>,
}

impl RunCgroups {
    /// Starts the thread. Each cgroup it hands out has `limits` (a run's
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
            .spawn(move || {
                let mut stock = Stock {
                    cgroups: &cgroups,
                    limits,
                    free: VecDeque::new(),
                    draining: Vec::new(),
                    number: 0,
                };
                stock.serve(&job_rx, &made_tx, &waker);
            })?;
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

    /// Hands back a cgroup whose run is over.
    pub fn recycle(&self, cgroup: RunCgroup) {
        self.send(Job::Recycle(cgroup));
    }

    /// cgroups handed out since the last call.
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
            if let Ok(run) = made.result {
                retire::remove_now(&run.cgroup);
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

/// The thread's cgroups: emptied ones ready to hand out, and returned ones
/// waiting for their processes to go.
struct Stock<'a> {
    cgroups: &'a Cgroups,
    limits: CgroupLimits,
    free: VecDeque<RunCgroup>,
    draining: Vec<(RunCgroup, u32)>,
    number: u64,
}

impl Stock<'_> {
    fn serve(&mut self, jobs: &Receiver<Job>, made: &Sender<Made>, waker: &mio::Waker) {
        // Runs' cgroups are made ahead of need: that work yields to requests.
        if let Err(err) = process::idle_priority_for_this_thread() {
            log::debug!("the run-cgroup thread keeps normal priority: {err}");
        }
        // Returned cgroups are looked at again every RETRY_EVERY, however
        // busy the thread is with other jobs.
        let mut next_look = Instant::now();
        loop {
            let job = if self.draining.is_empty() {
                jobs.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                jobs.recv_timeout(next_look.saturating_duration_since(Instant::now()))
            };
            if Instant::now() >= next_look {
                for (run, tries) in std::mem::take(&mut self.draining) {
                    self.take_back(run, tries + 1);
                }
                next_look = Instant::now() + RETRY_EVERY;
            }
            match job {
                Ok(Job::Make { host, count }) => {
                    for _ in 0..count {
                        let result = self.hand_out();
                        if made.send(Made { host, result }).is_err() {
                            return;
                        }
                    }
                    let _ = waker.wake();
                }
                Ok(Job::Recycle(run)) => self.take_back(run, 0),
                Err(RecvTimeoutError::Timeout) => {}
                Ok(Job::Finish) | Err(RecvTimeoutError::Disconnected) => {
                    for job in jobs.try_iter() {
                        if let Job::Recycle(run) = job {
                            retire::remove_now(&run.cgroup);
                        }
                    }
                    let held = self
                        .free
                        .drain(..)
                        .chain(self.draining.drain(..).map(|(r, _)| r));
                    for run in held {
                        retire::remove_now(&run.cgroup);
                    }
                    return;
                }
            }
        }
    }

    /// An emptied cgroup if one is spare, else a new one.
    fn hand_out(&mut self) -> Result<RunCgroup, CgroupError> {
        if let Some(run) = self.free.pop_front() {
            return Ok(run);
        }
        self.number += 1;
        let cgroup = self
            .cgroups
            .create(&format!("exec-run-{}", self.number), &self.limits)?;
        let mut join_files = Vec::new();
        for path in cgroup.self_join_files() {
            let opened = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(file) => join_files.push(OwnedFd::from(file)),
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
        Ok(RunCgroup {
            cgroup,
            join_files,
            limits: self.limits,
            oom_kills: 0,
        })
    }

    /// A returned cgroup: spare once empty and back to the default limits;
    /// removed if there are spares enough, or if it does not empty.
    fn take_back(&mut self, mut run: RunCgroup, tries: u32) {
        if !run.cgroup.pids().is_empty() {
            if tries > TRIES / 2 {
                run.cgroup.kill_all();
            }
            if tries < TRIES {
                self.draining.push((run, tries));
            } else {
                log::warn!("a run's cgroup did not empty; removing it");
                retire::remove_now(&run.cgroup);
            }
            return;
        }
        if self.free.len() >= SPARE {
            return retire::remove_now(&run.cgroup);
        }
        if run.limits != self.limits {
            if let Err(err) = run.cgroup.apply(&self.limits) {
                log::debug!("a run's cgroup keeps its limits ({err}); removing it");
                return retire::remove_now(&run.cgroup);
            }
            run.limits = self.limits;
        }
        run.oom_kills = run.cgroup.oom_kills();
        self.free.push_back(run);
    }
}
