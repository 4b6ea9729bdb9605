//! The thread that makes each run's own cgroup ([`RunCgroup`]), recycles
//! and removes it, off the reactor.
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
//! A finished run's cgroup comes back here. Once its processes are gone and
//! its memory is given back it gets the default limits again and serves
//! another run: making and removing a memory cgroup costs far more CPU than
//! the run it holds (about a millisecond per run here), so cgroups are
//! removed only beyond a few spare, when they do not empty, and at
//! shutdown. Memory can outlive a cgroup's processes — pages of a file the
//! kernel still holds (a session's pickled globals), page cache — and would count
//! against the next run's limit, so a cgroup is reused only once what it
//! is charged for is reclaimed to under [`LEFT_OVER`].
//!
//! An agent's runs get cgroups made inside the agent's own (so their
//! memory and processes add up against the agent's limits), on demand;
//! each comes back after its run to serve the same agent's next one, and
//! goes when the agent's cgroup does.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::exec_host::HostId;
use super::run_cgroup::{ChargedTo, RunCgroup};
use crate::cgroup::{AgentCgroup, CgroupError, CgroupLimits, Cgroups};
use crate::process;
use crate::sandbox::runtime::retire::{self, RETRY_EVERY};

/// Emptied cgroups kept for the next runs; more are removed.
const SPARE: usize = 32;
/// Tries for a returned cgroup to empty; past half of them, what is left
/// in it is killed, and past all it is removed.
const TRIES: u32 = 100;
/// Memory a returned cgroup may still be charged for (kernel objects that
/// reclaim cannot free) and serve another run; with more it is removed.
pub const LEFT_OVER: u64 = 1 << 20;

enum Job {
    /// Hand out `count` cgroups for a host's next runs.
    Make { host: HostId, count: usize },
    /// Hand out a cgroup inside an agent's, for its next run.
    MakeInside(ChargedTo),
    /// Take back a cgroup whose run is over, to serve another once empty
    /// (one inside an agent's goes back to that agent).
    Recycle(RunCgroup),
    /// Remove a cgroup once empty (one inside an agent that has ended).
    Remove(RunCgroup),
    /// Remove everything held, killing what is left, and stop.
    Finish,
}

/// Whom a cgroup is handed out for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MadeFor {
    /// A host's next run child.
    Host(HostId),
    /// An agent's next run, inside its cgroup.
    Agent(ChargedTo),
}

/// A cgroup handed out (or why none could be).
#[derive(Debug)]
pub struct Made {
    /// Whom it is for.
    pub made_for: MadeFor,
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
        let thread = agentos_primitives::threads::spawn("agentos-run-cgroups", move || {
            let mut stock = Stock {
                cgroups: &cgroups,
                limits,
                free: VecDeque::new(),
                draining: Vec::new(),
                number: 0,
                made: &made_tx,
                waker: &waker,
            };
            stock.serve(&job_rx);
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

    /// Asks for a cgroup inside `to`'s, for that agent's next run.
    pub fn make_inside(&self, to: ChargedTo) {
        self.send(Job::MakeInside(to));
    }

    /// Hands back a cgroup whose run is over.
    pub fn recycle(&self, cgroup: RunCgroup) {
        self.send(Job::Recycle(cgroup));
    }

    /// Hands back a cgroup no run will use again, to be removed.
    pub fn remove(&self, cgroup: RunCgroup) {
        self.send(Job::Remove(cgroup));
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
/// waiting for their processes (and their memory) to go.
struct Stock<'a> {
    cgroups: &'a Cgroups,
    limits: CgroupLimits,
    free: VecDeque<RunCgroup>,
    /// Returned cgroups not yet empty, with the tries each has had and
    /// whether it is to be removed rather than used again.
    draining: Vec<(RunCgroup, u32, Fate)>,
    number: u64,
    made: &'a Sender<Made>,
    waker: &'a mio::Waker,
}

/// What becomes of a returned cgroup once empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// It serves another run (its agent's, if it is inside one).
    Reuse,
    /// It is removed.
    Remove,
}

impl Stock<'_> {
    fn serve(&mut self, jobs: &Receiver<Job>) {
        // Runs' cgroups are made ahead of need: that work yields to requests.
        if let Err(err) = process::background_priority_for_this_thread() {
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
                for (run, tries, fate) in std::mem::take(&mut self.draining) {
                    self.take_back(run, tries + 1, fate);
                }
                next_look = Instant::now() + RETRY_EVERY;
            }
            let sent = match job {
                Ok(Job::Make { host, count }) => (0..count).all(|_| {
                    let result = self.hand_out();
                    self.send(MadeFor::Host(host), result)
                }),
                Ok(Job::MakeInside(to)) => {
                    let result = self.make_inside(&to);
                    self.send(MadeFor::Agent(to), result)
                }
                Ok(Job::Recycle(run)) => {
                    self.take_back(run, 0, Fate::Reuse);
                    true
                }
                Ok(Job::Remove(run)) => {
                    self.take_back(run, 0, Fate::Remove);
                    true
                }
                Err(RecvTimeoutError::Timeout) => true,
                Ok(Job::Finish) | Err(RecvTimeoutError::Disconnected) => false,
            };
            if !sent {
                return self.remove_everything(jobs);
            }
        }
    }

    /// Hands a cgroup (or why there is none) to the kernel; false once the
    /// kernel is gone.
    fn send(&self, made_for: MadeFor, result: Result<RunCgroup, CgroupError>) -> bool {
        let sent = self.made.send(Made { made_for, result }).is_ok();
        let _ = self.waker.wake();
        sent
    }

    /// Shutdown: what is held and what is still being returned goes.
    fn remove_everything(&mut self, jobs: &Receiver<Job>) {
        for job in jobs.try_iter() {
            if let Job::Recycle(run) | Job::Remove(run) = job {
                retire::remove_now(&run.cgroup);
            }
        }
        let held = self
            .free
            .drain(..)
            .chain(self.draining.drain(..).map(|(run, _, _)| run));
        for run in held {
            retire::remove_now(&run.cgroup);
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
        ready_to_join(cgroup, self.limits, true, None)
    }

    /// A new cgroup inside an agent's, for its runs: with the default
    /// limits of a run where it can carry limits of its own.
    fn make_inside(&mut self, to: &ChargedTo) -> Result<RunCgroup, CgroupError> {
        self.number += 1;
        let name = format!("exec-run-{}", self.number);
        let (cgroup, own_limits) = self
            .cgroups
            .create_inside(&to.cgroup, &name, &self.limits)?;
        ready_to_join(cgroup, self.limits, own_limits, Some(to.clone()))
    }

    /// A returned cgroup. Once its processes are gone and its memory is
    /// given back (within [`LEFT_OVER`]), it is spare, with the default
    /// limits again — or goes back to the agent it is inside — unless it is
    /// to be removed, there are spares enough, or it does not empty.
    fn take_back(&mut self, mut run: RunCgroup, tries: u32, fate: Fate) {
        if !run.cgroup.pids().is_empty() {
            if tries > TRIES / 2 {
                run.cgroup.kill_all();
            }
            if tries < TRIES {
                self.draining.push((run, tries, fate));
            } else {
                log::warn!("a run's cgroup did not empty; removing it");
                retire::remove_now(&run.cgroup);
            }
            return;
        }
        if fate == Fate::Remove {
            return retire::remove_now(&run.cgroup);
        }
        let charged = run.cgroup.memory_in_use();
        if charged > LEFT_OVER {
            run.cgroup.reclaim();
            let left = run.cgroup.memory_in_use();
            if left > LEFT_OVER {
                // A process that moved out may still be going (its pages
                // stay charged here until it has); past that, memory the
                // kernel holds for longer, such as a session's globals.
                if tries < TRIES {
                    self.draining.push((run, tries, fate));
                } else {
                    log::debug!(
                        "a run's cgroup is still charged for {left} bytes with its processes \
                         gone; removing it rather than giving it to another run"
                    );
                    retire::remove_now(&run.cgroup);
                }
                return;
            }
        }
        run.oom_kills = run.cgroup.oom_kills();
        if let Some(to) = run.inside.clone() {
            self.send(MadeFor::Agent(to), Ok(run));
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
        self.free.push_back(run);
    }
}

/// A new cgroup with the files a process writes `0` into to move itself
/// in, opened now (by the kernel, which may).
fn ready_to_join(
    cgroup: AgentCgroup,
    limits: CgroupLimits,
    own_limits: bool,
    inside: Option<ChargedTo>,
) -> Result<RunCgroup, CgroupError> {
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
    let oom_kills = cgroup.oom_kills();
    Ok(RunCgroup {
        cgroup,
        join_files,
        limits,
        oom_kills,
        own_limits,
        inside,
    })
}
