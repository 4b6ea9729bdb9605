//! The one sandbox runtime, shared by the agents and EXEC: who owns each of
//! its sandboxes, each owner's view of it, and how sandboxes are built on
//! this host.

use std::path::Path;

use crate::agents::Incarnation;
use crate::config::Config;
use crate::exec::HostId;
use crate::sandbox::plan::Profile;
use crate::sandbox::runtime::machine::Machine;
use crate::sandbox::runtime::owners::OwnersOf;
use crate::sandbox::runtime::Runtime;
use crate::sandbox::spec::Rlimits;
use crate::sandbox::User;
use crate::state_dir::{kernel_files, StateDir};

/// Who owns a sandbox of the kernel's runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxOwner {
    /// One incarnation of an agent.
    Agent(Incarnation),
    /// An exec host.
    ExecHost(HostId),
}

/// The runtime as agents see it: their incarnations wrapped as owners.
pub fn agent_sandboxes(
    runtime: &mut Runtime<SandboxOwner>,
) -> OwnersOf<'_, SandboxOwner, Incarnation> {
    OwnersOf::new(runtime, SandboxOwner::Agent)
}

/// The runtime as EXEC sees it: its hosts wrapped as owners.
pub fn exec_sandboxes(runtime: &mut Runtime<SandboxOwner>) -> OwnersOf<'_, SandboxOwner, HostId> {
    OwnersOf::new(runtime, SandboxOwner::ExecHost)
}

/// How sandboxes are built on this machine.
pub fn sandbox_profile(
    config: &Config,
    machine: &Machine,
    state: &StateDir,
    socket: &Path,
) -> Profile {
    let agents = &config.agents;
    let root = nix::unistd::geteuid().is_root();
    let log_dir = agents.log_dir();
    Profile {
        staging: state.staging.clone(),
        user: root.then_some(User {
            uid: agents.uid,
            gid: agents.gid,
        }),
        user_namespace: machine.map_to.is_some(),
        tmp_size: agents.tmp_bytes,
        workspace_size: agents.workspace_bytes,
        rlimits: Rlimits {
            nofile: agents.nofile,
            fsize: agents.max_file_bytes,
        },
        log_cap: agents.log_bytes,
        extra_masks: kernel_files(config, socket, &state.root, &log_dir),
    }
}
