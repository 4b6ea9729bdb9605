//! The one sandbox runtime, shared by the agents and EXEC: who owns each of
//! its sandboxes, each owner's view of it, its events handed to their
//! owners, and how sandboxes are built on this host.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use agentos_egress::gateway::Unavailable;
use agentos_egress::proxy::Proxy;
use agentos_egress::Gateway;

use crate::address::Reply;
use crate::agents::{Agents, Incarnation};
use crate::config::Config;
use crate::exec::{Exec, HostId};
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

/// Hands the runtime's events to the sandboxes' owners, the agents and
/// EXEC, until none is left (handling one may cause another).
pub fn hand_out_events(
    runtime: &mut Runtime<SandboxOwner>,
    agents: &mut Agents,
    exec: &mut Exec,
    replies: &mut Vec<Reply>,
    now: Instant,
) {
    loop {
        let events = runtime.take_events();
        if events.is_empty() {
            return;
        }
        for event in events {
            match *event.owner() {
                SandboxOwner::Agent(incarnation) => {
                    let event = event.map(|_| incarnation);
                    agents.on_sandbox(&mut agent_sandboxes(runtime), replies, event, now);
                }
                SandboxOwner::ExecHost(id) => {
                    let event = event.map(|_| id);
                    exec.on_sandbox(&mut exec_sandboxes(runtime), event, now);
                }
            }
        }
    }
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
        ca_bundle: state.ca_bundle.is_file().then(|| state.ca_bundle.clone()),
    }
}

/// Starts the egress proxy, if this host can serve sandboxes' policies,
/// and writes the certificates sandboxes trust (the system's and the
/// proxy's per-boot CA) where [`sandbox_profile`] binds them in.
pub fn start_gateway(config: &Config, namespaces: bool, state: &StateDir) -> io::Result<Gateway> {
    let network = &config.network;
    let default = network
        .default_policy()
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err.to_string()))?;
    let proxy = if !namespaces {
        Err(Unavailable::NoNamespaces)
    } else if !nix::unistd::geteuid().is_root() {
        Err(Unavailable::NotRoot)
    } else {
        let settings = network
            .proxy_settings()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err.to_string()))?;
        Proxy::start(settings).map_err(|err| Unavailable::CannotStart(err.into()))
    };
    match &proxy {
        Ok(proxy) if proxy.intercepts() => write_ca_bundle(&state.ca_bundle, proxy)?,
        Ok(_) => {}
        Err(why) => log::warn!("network policies unavailable: {why}"),
    }
    Ok(Gateway::new(proxy, default))
}

/// The system's trusted certificates and the proxy's CA, in one file
/// sandboxes can read.
fn write_ca_bundle(path: &Path, proxy: &Proxy) -> io::Result<()> {
    let mut bundle = std::fs::read(SYSTEM_CA_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(proxy.ca_certificate_pem().as_bytes());
    std::fs::write(path, bundle)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

/// Where Debian and its kin keep the system's trusted certificates.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The live unsandboxed agent whose cgroup holds the peer that
/// `peer_cgroups` reads the cgroups of (one per hierarchy): such an agent,
/// or a child of its, calling on the kernel's socket. Only an unsandboxed
/// agent's processes can reach that socket, so with none live the peer's
/// cgroups are not read at all.
pub fn agent_calling(
    agents: &Agents,
    sandboxes: &Runtime<SandboxOwner>,
    peer_cgroups: impl FnOnce() -> Option<Vec<PathBuf>>,
) -> Option<u32> {
    let unsandboxed: Vec<(u32, PathBuf)> = agents
        .live_sandboxes()
        .filter_map(|(id, sandbox)| {
            let own = sandboxes.unsandboxed_cgroup_of(sandbox)?;
            Some((id, Path::new("/").join(own)))
        })
        .collect();
    if unsandboxed.is_empty() {
        return None;
    }
    let cgroups = peer_cgroups()?;
    unsandboxed
        .into_iter()
        .find(|(_, own)| cgroups.iter().any(|cgroup| cgroup.starts_with(own)))
        .map(|(id, _)| id)
}
