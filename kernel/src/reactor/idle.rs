//! Giving memory back once the crowd has gone. A connection's buffers
//! follow its traffic, and memory freed by connections that closed stays
//! in the allocator's heap; neither matters while clients are busy, but
//! after a burst of a thousand connections the kernel should not sit at
//! several times its idle size. So, at most once a second while there is
//! anything to give back, connections that were quiet since the last sweep
//! release their buffers (being active costs a flag, not a clock read),
//! and the allocator is asked to return free pages to the system.

use std::time::Duration;

/// How often the sweep runs while there is work for it: a connection
/// quiet for a whole period loses its buffers.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Returns the heap's free pages to the system.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
