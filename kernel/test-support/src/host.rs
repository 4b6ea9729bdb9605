//! What a test sees of the host: whether it runs as root, its limits,
//! processes in `/proc`, and waiting for a condition with a deadline.

use std::fs;
use std::time::{Duration, Instant};

/// Ends a test that needs root, saying so loudly, when not run as root.
#[macro_export]
macro_rules! require_root {
    ($what:expr) => {
        if !$crate::is_root() {
            eprintln!(
                "!!! NOT TESTED: {} needs root; run the suite as root (CI does)",
                $what
            );
            return;
        }
    };
}

/// Whether the tests run as root (some behaviours can only be shown then).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Raises this process's open-files limit to its hard limit.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to a rlimit struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}

/// A numeric field of `/proc/<pid>/status` (`VmRSS:`, say), in its unit.
pub fn proc_status_field(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Processes whose command line holds `marker` (and, if given, that live
/// in the cgroups of the kernel with pid `kernel`).
pub fn processes_with(marker: &str, kernel: Option<i32>) -> usize {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            kernel.is_none_or(|pid| {
                fs::read_to_string(e.path().join("cgroup"))
                    .is_ok_and(|cgroups| cgroups.contains(&format!("agentosd-{pid}/")))
            })
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| {
            String::from_utf8_lossy(cmdline)
                .replace('\0', " ")
                .contains(marker)
        })
        .count()
}

/// Waits up to `within` for no process to hold `marker`.
pub fn none_left(marker: &str, kernel: Option<i32>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while processes_with(marker, kernel) > 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Polls `done` until it holds; fails the test naming `what` after `within`.
pub fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
