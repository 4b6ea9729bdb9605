//! An exec host as the kernel keeps it: a sandbox of the runtime whose
//! workload is the zygote (`zygote`), the kernel's end of its channel, the
//! run cgroups sent to it, and how many run children it has been asked
//! for. Starting, claiming and replacing hosts is `hosts`.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::time::Instant;

use mio::Token;

use super::run_cgroup::RunCgroup;
use crate::sandbox::runtime::SandboxKey;

/// Names an exec host: the owner of its sandbox.
pub type HostId = u32;

/// An exec host.
#[derive(Debug)]
pub struct ExecHost {
    /// Its name, as its sandbox's owner.
    pub id: HostId,
    /// Its sandbox, once the runtime has one for it.
    pub sandbox: Option<SandboxKey>,
    /// The kernel's end of its channel and its token, once claimed.
    pub channel: Option<(OwnedFd, Token)>,
    /// Run cgroups sent to it and not yet taken by a run child, by the
    /// number it knows each by.
    pub cgroups: HashMap<u64, RunCgroup>,
    /// The number of the last cgroup sent.
    pub last_cgroup: u64,
    /// Run children asked of it whose first run has not ended (and that
    /// are not lost): it is asked for more while these are fewer than
    /// `exec.ready_runs`. A child a session keeps stops counting once its
    /// first run has ended.
    pub requested: usize,
    /// When each child asked of it and not yet handed over was asked for,
    /// oldest first (it hands them over in order): the refill time.
    pub asked: VecDeque<Instant>,
}

impl ExecHost {
    /// A host about to be asked of the runtime.
    pub fn new(id: HostId) -> ExecHost {
        ExecHost {
            id,
            sandbox: None,
            channel: None,
            cgroups: HashMap::new(),
            last_cgroup: 0,
            requested: 0,
            asked: VecDeque::new(),
        }
    }
}
