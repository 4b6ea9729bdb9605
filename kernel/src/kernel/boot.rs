//! Boot agents (`[[agents.boot]]`): started with the kernel, brought back
//! by a reload, and — when a reload changed an entry — restarted with the
//! new entry once the old agent has ended.

use agentos_proto::payload::{KillRequest, SpawnRequest};

use crate::address::Reply;
use crate::agents::{Agents, Incarnation, Viewer};
use crate::sandbox::runtime::Sandboxes;

/// The boot agents waiting for their old selves to end.
#[derive(Debug, Default)]
pub struct BootAgents {
    /// Entries a reload changed, to start once no live agent has the name.
    pending: Vec<SpawnRequest>,
}

impl BootAgents {
    /// Starts the `declared` boot agents. Their entries were checked
    /// before the kernel started (`Agents::check_boot`); one that still
    /// fails to start is logged and the others go on.
    pub fn start(
        declared: &[SpawnRequest],
        agents: &mut Agents,
        sandboxes: &mut impl Sandboxes<Incarnation>,
    ) {
        for request in declared {
            start_one(request.clone(), agents, sandboxes);
        }
    }

    /// Starts the changed boot agents whose old selves have ended.
    pub fn start_replaced(
        &mut self,
        agents: &mut Agents,
        sandboxes: &mut impl Sandboxes<Incarnation>,
    ) {
        if self.pending.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|request| agents.live_named(&request.name).is_none());
        self.pending = waiting;
        for request in ready {
            start_one(request, agents, sandboxes);
        }
    }

    /// SIGHUP changed the entries from `old` to `new`: removed agents stop,
    /// added ones start, changed ones restart with their new entry, and
    /// declared ones that are not running start again even when no entry
    /// changed.
    pub fn reload(
        &mut self,
        old: &[SpawnRequest],
        new: &[SpawnRequest],
        agents: &mut Agents,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
    ) {
        for gone in old.iter().filter(|o| !new.iter().any(|n| n.name == o.name)) {
            log::info!("SIGHUP: boot agent {:?} removed; stopping it", gone.name);
            stop_one(&gone.name, agents, sandboxes, replies);
        }
        for entry in new {
            match old.iter().find(|o| o.name == entry.name) {
                Some(previous) if previous == entry => {
                    // A reload brings the declared agents back: one that was
                    // KILLed, gave up restarting, or never got its name.
                    if agents.live_named(&entry.name).is_none() {
                        log::info!(
                            "SIGHUP: boot agent {:?} is not running; starting it",
                            entry.name
                        );
                        start_one(entry.clone(), agents, sandboxes);
                    }
                }
                Some(_) => {
                    log::info!(
                        "SIGHUP: boot agent {:?} changed; restarting it with its new entry",
                        entry.name
                    );
                    stop_one(&entry.name, agents, sandboxes, replies);
                    self.pending.retain(|p| p.name != entry.name);
                    self.pending.push(entry.clone());
                }
                None => {
                    log::info!("SIGHUP: boot agent {:?} added", entry.name);
                    start_one(entry.clone(), agents, sandboxes);
                }
            }
        }
        self.pending
            .retain(|p| new.iter().any(|n| n.name == p.name));
        self.start_replaced(agents, sandboxes);
    }
}

/// Starts one boot agent, unless a live agent has its name.
fn start_one(
    request: SpawnRequest,
    agents: &mut Agents,
    sandboxes: &mut impl Sandboxes<Incarnation>,
) {
    let name = request.name.clone();
    if let Some((id, _)) = agents.live_named(&name) {
        log::error!(
            "boot agent {name:?} not started: a live agent (id {id}) has its name; it starts \
             on the next reload once that agent has ended"
        );
        return;
    }
    match agents.spawn_boot(sandboxes, request) {
        Ok(id) => log::info!("boot agent {name:?} started as agent {id}"),
        Err(err) => log::error!("boot agent {name:?} cannot start: {}", err.error),
    }
}

/// Stops the live boot agent named `name`, if there is one (an agent an
/// operator spawned under that name is not a boot agent's to stop).
fn stop_one(
    name: &str,
    agents: &mut Agents,
    sandboxes: &mut impl Sandboxes<Incarnation>,
    replies: &mut Vec<Reply>,
) {
    let Some((id, true)) = agents.live_named(name) else {
        return;
    };
    let kill = KillRequest {
        id: Some(id),
        ..KillRequest::default()
    };
    if let Err(err) = agents.kill(sandboxes, replies, Viewer::Operator, &kill) {
        log::warn!(
            "boot agent {name:?} (id {id}): cannot stop it: {}",
            err.error
        );
    }
}
