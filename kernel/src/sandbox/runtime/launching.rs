//! The launch thread: prepares sandboxes off the reactor. A launch creates
//! the sandbox's cgroup, clones into new namespaces (creating a network
//! namespace alone can take milliseconds) and, on cgroup v1, migrates the
//! init into its cgroup (which can take as long again); the reactor hands
//! all that over and hears back through its waker. What the thread
//! returns is a sandbox waiting for its claim.
//!
//! Failures are typed ([`LaunchError`]), each naming the step or path that
//! failed.
//!
//! The thread lives as long as the daemon: it is the parent of every
//! sandbox init, and an init's parent-death signal fires when the thread
//! that cloned it exits.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use crate::cgroup::{AgentCgroup, CgroupJoin, CgroupLimits, Cgroups};
pub use crate::sandbox::error::LaunchError;
use crate::sandbox::{LaunchRequest, Launched, Launcher, SandboxSpec};

/// One sandbox to prepare.
#[derive(Debug)]
pub struct LaunchJob {
    /// Names this launch in the answer.
    pub seq: u64,
    /// The sandbox's shape.
    pub spec: SandboxSpec,
    /// Its cgroup's name and limits, when cgroups are in use.
    pub cgroup: Option<(String, CgroupLimits)>,
    /// User-namespace mapping target, when the daemon is not root.
    pub map_to: Option<(u32, u32)>,
}

/// A launch done (or not).
#[derive(Debug)]
pub struct LaunchDone {
    /// The job's `seq`.
    pub seq: u64,
    /// The sandbox and its cgroup, or why it could not start.
    pub result: Result<(Launched, Option<AgentCgroup>), LaunchError>,
}

/// The handle to the launch thread.
#[derive(Debug)]
pub struct LaunchThread {
    jobs: Sender<LaunchJob>,
    done: Receiver<LaunchDone>,
}

impl LaunchThread {
    /// Starts the thread; each finished launch wakes `waker`.
    pub fn start(
        launcher: Launcher,
        cgroups: Option<Arc<Cgroups>>,
        waker: Arc<mio::Waker>,
    ) -> io::Result<LaunchThread> {
        let (jobs, job_rx) = mpsc::channel::<LaunchJob>();
        let (done_tx, done) = mpsc::channel();
        agentos_primitives::threads::spawn("agentos-launch", move || {
            for job in job_rx {
                let done = LaunchDone {
                    seq: job.seq,
                    result: launch(&launcher, cgroups.as_deref(), job),
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
        // Fails only if the thread died, which only a panic could cause.
        if self.jobs.send(job).is_err() {
            log::error!("the launch thread is gone; sandboxes cannot be started");
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

fn launch(
    launcher: &Launcher,
    cgroups: Option<&Cgroups>,
    job: LaunchJob,
) -> Result<(Launched, Option<AgentCgroup>), LaunchError> {
    let cgroup = match (cgroups, &job.cgroup) {
        (Some(cgroups), Some((name, limits))) => Some(
            cgroups
                .create(name, limits)
                .map_err(LaunchError::CreateCgroup)?,
        ),
        _ => None,
    };
    let join = match cgroup.as_ref().map(AgentCgroup::join) {
        None => None,
        Some(CgroupJoin::Into(dir)) => Some(CgroupJoin::Into(open(
            &dir,
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY),
        )?)),
        Some(CgroupJoin::JoinSelf(tasks)) => Some(CgroupJoin::JoinSelf(
            tasks
                .iter()
                .map(|path| open(path, OpenOptions::new().write(true)))
                .collect::<Result<Vec<File>, LaunchError>>()?,
        )),
    };
    let launched = launcher.launch(LaunchRequest {
        spec: job.spec,
        cgroup: join,
        map_to: job.map_to,
    });
    match launched {
        Ok(launched) => Ok((launched, cgroup)),
        Err(err) => {
            if let Some(cgroup) = cgroup {
                let _ = cgroup.remove();
            }
            Err(LaunchError::Start(err))
        }
    }
}

fn open(path: &Path, options: &mut OpenOptions) -> Result<File, LaunchError> {
    options
        .open(path)
        .map_err(|source| LaunchError::JoinCgroup {
            path: path.to_path_buf(),
            source,
        })
}
