//! What the sandbox-level tests share: they drive the kernel's own
//! launcher, so this part of the harness needs the kernel crate.

use std::fs;

/// The profile sandbox-level tests build sandboxes with: the agent user,
/// small scratch filesystems, a staging directory under `dir`.
pub fn sandbox_profile(dir: &std::path::Path) -> agentos_kernel::sandbox::plan::Profile {
    use agentos_kernel::sandbox::spec::Rlimits;
    use agentos_kernel::sandbox::User;
    let staging = dir.join("root");
    fs::create_dir_all(&staging).unwrap();
    agentos_kernel::sandbox::plan::Profile {
        staging,
        user: Some(User {
            uid: 65534,
            gid: 65534,
        }),
        user_namespace: false,
        tmp_size: 16 << 20,
        workspace_size: 16 << 20,
        rlimits: Rlimits {
            nofile: 256,
            fsize: 64 << 20,
        },
        log_cap: 1 << 20,
        extra_masks: vec![],
    }
}

/// Kills a sandbox launched by a test (SIGKILL to its init) and reaps it.
pub fn kill_and_reap(launched: &agentos_kernel::sandbox::Launched) {
    use std::os::fd::AsFd;
    let _ = agentos_kernel::process::signal(launched.pidfd.as_fd(), libc::SIGKILL);
    agentos_kernel::process::wait(launched.pidfd.as_fd(), true);
}
