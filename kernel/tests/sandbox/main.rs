//! The sandbox: the mechanism on its own (the kernel's launcher and init,
//! driven from here), the exec host inside it, and what the sandbox and
//! cgroups do to agents, measured from outside.
//!
//! These need root (CI runs as root); without it each says so loudly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod exec_host;
mod launch;
mod limits;
mod views;

use std::fs;

use agentos_proto::Opcode;
use agentos_test_support::request;

fn spawn(client: &mut agentos_proto::Client, body: serde_json::Value) -> u64 {
    let reply = request(client, Opcode::SPAWN, &body);
    assert_eq!(reply["success"], true, "{body} -> {reply}");
    reply["id"].as_u64().unwrap()
}

// The two helpers below drive the kernel's own launcher, so they live
// here, beside the tests that import the kernel crate, and not in
// agentos-test-support, which drives the daemon only as its clients do.

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
        ca_bundle: None,
    }
}

/// Kills a sandbox launched by a test (SIGKILL to its init) and reaps it.
pub fn kill_and_reap(launched: &agentos_kernel::sandbox::Launched) {
    use std::os::fd::AsFd;
    let _ = agentos_kernel::process::signal(launched.pidfd.as_fd(), libc::SIGKILL);
    agentos_kernel::process::wait(launched.pidfd.as_fd(), true);
}
