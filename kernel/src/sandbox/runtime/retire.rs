//! cgroups whose processes are gone, or going: a cgroup can be removed only
//! once empty, which may take a moment after its last process exits. The
//! reactor never waits for that; it retries on a deadline.

use std::time::Duration;

use crate::cgroup::AgentCgroup;

/// Between tries.
pub const RETRY_EVERY: Duration = Duration::from_millis(50);
/// Tries before giving up; past half of them, what is left is killed.
const TRIES: u32 = 100;

/// cgroups waiting to be removed, with the tries each has had.
#[derive(Debug, Default)]
pub struct Retiring(Vec<(AgentCgroup, u32)>);

impl Retiring {
    /// Removes `cgroup` now if it is empty, else keeps it for [`sweep`].
    /// Returns whether a sweep must now be scheduled (the list was empty).
    ///
    /// [`sweep`]: Retiring::sweep
    pub fn retire(&mut self, cgroup: AgentCgroup) -> bool {
        if cgroup.remove().is_ok() {
            return false;
        }
        self.0.push((cgroup, 0));
        self.0.len() == 1
    }

    /// One more try for each; past half the tries, whatever is still in a
    /// cgroup (it cannot be, in a PID namespace) is killed. Returns whether
    /// any remain, so another sweep is due.
    pub fn sweep(&mut self) -> bool {
        self.0.retain_mut(|(cgroup, attempts)| {
            *attempts += 1;
            if *attempts > TRIES / 2 {
                cgroup.kill_all();
            }
            match cgroup.remove() {
                Ok(()) => false,
                Err(err) if *attempts >= TRIES => {
                    log::warn!("giving up on removing a cgroup: {err}");
                    false
                }
                Err(_) => true,
            }
        });
        !self.0.is_empty()
    }

    /// Removes them all now, killing what remains (shutdown only: may
    /// wait a little).
    pub fn remove_all(&mut self) {
        for (cgroup, _) in self.0.drain(..) {
            remove_now(&cgroup);
        }
    }
}

/// Removes a cgroup, killing what is in it and waiting up to two seconds
/// (shutdown only).
pub fn remove_now(cgroup: &AgentCgroup) {
    if let Err(err) = cgroup.remove_within(Duration::from_secs(2)) {
        log::warn!("cannot remove cgroup {}: {err}", cgroup.rel().display());
    }
}
