//! The launch thread: runs [`Launcher::launch`] off the reactor. A launch
//! opens files and clones into new namespaces (creating a network
//! namespace alone can take milliseconds), so the reactor hands it over
//! and hears back through the kernel's waker.
//!
//! The thread lives as long as the daemon: it is the parent of every
//! sandbox init, and an init's parent-death signal fires when the thread
//! that cloned it exits.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use crate::sandbox::{LaunchRequest, Launched, Launcher, SandboxSpec};

/// One launch to do.
#[derive(Debug)]
pub struct LaunchJob {
    /// The agent.
    pub agent: u32,
    /// Which run of the agent this is.
    pub run: u32,
    /// The sandbox.
    pub spec: SandboxSpec,
    /// The agent's log file.
    pub log: PathBuf,
    /// cgroup.procs files the workload joins.
    pub cgroup_procs: Vec<PathBuf>,
    /// User-namespace mapping target, when the daemon is not root.
    pub map_to: Option<(u32, u32)>,
}

/// A launch done (or not).
#[derive(Debug)]
pub struct LaunchDone {
    /// The agent.
    pub agent: u32,
    /// The run.
    pub run: u32,
    /// The sandbox, or why it could not start.
    pub result: Result<Launched, String>,
}

/// The handle to the launch thread.
#[derive(Debug)]
pub struct LaunchThread {
    jobs: Sender<LaunchJob>,
    done: Receiver<LaunchDone>,
}

impl LaunchThread {
    /// Starts the thread; each finished launch wakes `waker`.
    pub fn start(launcher: Launcher, waker: Arc<mio::Waker>) -> io::Result<LaunchThread> {
        let (jobs, job_rx) = mpsc::channel::<LaunchJob>();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("agentos-launch".into())
            .spawn(move || {
                for job in job_rx {
                    let done = LaunchDone {
                        agent: job.agent,
                        run: job.run,
                        result: launch(&launcher, job),
                    };
                    if done_tx.send(done).is_err() {
                        return;
                    }
                    let _ = waker.wake();
                }
            })?;
        Ok(LaunchThread { jobs, done })
    }

    /// Queues a launch.
    pub fn submit(&self, job: LaunchJob) {
        // Fails only if the thread died, which only a panic could cause;
        // the agent then stays `starting` and the log says why.
        if self.jobs.send(job).is_err() {
            log::error!("the launch thread is gone; agents cannot be started");
        }
    }

    /// Launches that have finished.
    pub fn completed(&self) -> impl Iterator<Item = LaunchDone> + '_ {
        self.done.try_iter()
    }

    /// Waits up to `timeout` for one more finished launch (shutdown only).
    pub fn wait_completed(&self, timeout: std::time::Duration) -> Option<LaunchDone> {
        self.done.recv_timeout(timeout).ok()
    }
}

fn launch(launcher: &Launcher, job: LaunchJob) -> Result<Launched, String> {
    let log = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .open(&job.log)
        .map_err(|err| format!("cannot open the agent log {}: {err}", job.log.display()))?;
    let cgroup_procs = job
        .cgroup_procs
        .iter()
        .map(|path| {
            OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|err| format!("cannot open {}: {err}", path.display()))
        })
        .collect::<Result<Vec<File>, String>>()?;
    launcher
        .launch(LaunchRequest {
            spec: job.spec,
            log,
            cgroup_procs,
            map_to: job.map_to,
        })
        .map_err(|err| format!("cannot start the sandbox: {err}"))
}
