//! Boot agents (`[[agents.boot]]`) and SIGHUP: the kernel re-reads its
//! configuration and applies what is safe to change while it runs — the
//! LLM settings, the MCP servers, the boot agents — and says in the log
//! what changed and what waits for a restart.

use std::sync::Arc;

use agentos_proto::payload::{KillRequest, SpawnRequest};

use super::sandboxes::agent_sandboxes;
use super::sources::Source;
use super::Kernel;
use crate::agents::Viewer;
use crate::config::Config;
use crate::tools::servers::Servers;

impl Kernel {
    /// Starts the configured boot agents. Their entries were checked
    /// before the kernel started (`Agents::check_boot`); one that still
    /// fails to start is logged and the others go on.
    pub fn start_boot_agents(&mut self) {
        for request in self.config.agents.boot.clone() {
            self.start_boot_agent(request);
        }
    }

    fn start_boot_agent(&mut self, request: SpawnRequest) {
        let name = request.name.clone();
        if let Some((id, _)) = self.agents.live_named(&name) {
            log::error!(
                "boot agent {name:?} not started: a live agent (id {id}) has its name; it starts \
                 on the next reload once that agent has ended"
            );
            return;
        }
        match self
            .agents
            .spawn_boot(&mut agent_sandboxes(&mut self.sandboxes), request)
        {
            Ok(id) => log::info!("boot agent {name:?} started as agent {id}"),
            Err(err) => log::error!("boot agent {name:?} cannot start: {}", err.error),
        }
    }

    /// Boot agents whose entries changed wait for their old selves to end;
    /// this starts those whose old selves have.
    pub(super) fn start_replaced_boot_agents(&mut self) {
        if self.boot_pending.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.boot_pending)
            .into_iter()
            .partition(|request| self.agents.live_named(&request.name).is_none());
        self.boot_pending = waiting;
        for request in ready {
            self.start_boot_agent(request);
        }
    }

    /// SIGHUP: applies `new` where that is safe and logs every difference.
    pub fn reload(&mut self, new: Config) {
        let old = self.config.clone();
        let mut changed = Vec::new();
        if old.llm != new.llm {
            self.reload_llm(&new);
            changed.push("llm");
        }
        let mut mcp = old.mcp.clone();
        if old.mcp != new.mcp && self.reload_tools(&new) {
            mcp = new.mcp.clone();
            changed.push("mcp");
        }
        // Always: declared boot agents that are not running start again
        // even when no entry changed.
        self.reload_boot_agents(&old.agents.boot, &new.agents.boot);
        if old.agents.boot != new.agents.boot {
            changed.push("agents.boot");
        }
        let needs_restart = sections_needing_restart(&old, &new);
        // Only what was applied changes the configuration in force, so a
        // later reload compares against what actually runs.
        self.config.llm = new.llm;
        self.config.mcp = mcp;
        self.config.agents.boot = new.agents.boot;
        match (changed.is_empty(), needs_restart.is_empty()) {
            (true, true) => log::info!("SIGHUP: configuration reloaded; nothing changed"),
            _ => log::info!(
                "SIGHUP: configuration reloaded; applied: {}",
                if changed.is_empty() {
                    "nothing".to_owned()
                } else {
                    changed.join(", ")
                }
            ),
        }
        if !needs_restart.is_empty() {
            log::warn!(
                "SIGHUP: changed settings that take effect only after a restart: {}",
                needs_restart.join(", ")
            );
        }
    }

    fn reload_llm(&mut self, new: &Config) {
        log::info!("SIGHUP: [llm] changed; THINK takes it up from the next request on");
        let log_dir = self.config.agents.log_dir();
        let confinement = self.sandboxes.confinement();
        self.llm.reconfigure(
            &self.config.llm,
            &new.llm,
            Arc::clone(&self.waker),
            &log_dir,
            confinement,
        );
    }

    /// The MCP servers start anew as configured: calls under way fail,
    /// and the old servers are given their grace to stop off the reactor.
    /// Returns whether the new ones took over (if not, the old ones serve
    /// on, and the next SIGHUP tries again).
    fn reload_tools(&mut self, new: &Config) -> bool {
        let names = |c: &Config| c.mcp.servers.keys().cloned().collect::<Vec<_>>().join(", ");
        log::info!(
            "SIGHUP: [mcp] changed; restarting the MCP servers (were: {}; now: {})",
            names(&self.config),
            names(new)
        );
        let state_dir = self.tools.state_dir().to_owned();
        let started = Servers::start(
            &new.mcp,
            self.sandboxes.confinement(),
            &state_dir,
            &self.registry,
            Arc::clone(&self.waker),
            self.tokens.first(Source::Tools),
        );
        let mut fresh = match started {
            Ok(fresh) => fresh,
            Err(err) => {
                log::error!("SIGHUP: cannot start the new MCP servers ({err}); the old ones stay");
                return false;
            }
        };
        fresh.trace_with(Arc::clone(&self.tracer));
        let mut old = std::mem::replace(&mut self.tools, fresh);
        old.shutdown(
            "the MCP servers were restarted for a new configuration (SIGHUP)",
            &mut self.outbox.replies,
        );
        let stopping = std::thread::Builder::new()
            .name("mcp-retire".into())
            .spawn(move || old.finish_shutdown());
        if let Err(err) = stopping {
            log::error!("cannot wait for the old MCP servers to stop: {err}");
        }
        // The `tools` package is written again for the new servers.
        self.catalog.forget();
        true
    }

    fn reload_boot_agents(&mut self, old: &[SpawnRequest], new: &[SpawnRequest]) {
        for gone in old.iter().filter(|o| !new.iter().any(|n| n.name == o.name)) {
            log::info!("SIGHUP: boot agent {:?} removed; stopping it", gone.name);
            self.stop_boot_agent(&gone.name);
        }
        for entry in new {
            match old.iter().find(|o| o.name == entry.name) {
                Some(previous) if previous == entry => {
                    // A reload brings the declared agents back: one that was
                    // KILLed, gave up restarting, or never got its name.
                    if self.agents.live_named(&entry.name).is_none() {
                        log::info!(
                            "SIGHUP: boot agent {:?} is not running; starting it",
                            entry.name
                        );
                        self.start_boot_agent(entry.clone());
                    }
                }
                Some(_) => {
                    log::info!(
                        "SIGHUP: boot agent {:?} changed; restarting it with its new entry",
                        entry.name
                    );
                    self.stop_boot_agent(&entry.name);
                    self.boot_pending.retain(|p| p.name != entry.name);
                    self.boot_pending.push(entry.clone());
                }
                None => {
                    log::info!("SIGHUP: boot agent {:?} added", entry.name);
                    self.start_boot_agent(entry.clone());
                }
            }
        }
        self.boot_pending
            .retain(|p| new.iter().any(|n| n.name == p.name));
        self.start_replaced_boot_agents();
    }

    /// Stops the live boot agent named `name`, if there is one (an agent
    /// an operator spawned under that name is not a boot agent's to stop).
    fn stop_boot_agent(&mut self, name: &str) {
        let Some((id, true)) = self.agents.live_named(name) else {
            return;
        };
        let kill = KillRequest {
            id: Some(id),
            ..KillRequest::default()
        };
        if let Err(err) = self.agents.kill(
            &mut agent_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            Viewer::Operator,
            &kill,
        ) {
            log::warn!(
                "boot agent {name:?} (id {id}): cannot stop it: {}",
                err.error
            );
        }
    }
}

/// The settings that differ between `old` and `new` but are applied only
/// at start-up, named by their table.
fn sections_needing_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut differs = Vec::new();
    let top_level = |c: &Config| {
        let mut c = c.clone();
        c.llm = Default::default();
        c.mcp = Default::default();
        c.agents = Default::default();
        c.exec = Default::default();
        c.tasks = Default::default();
        c.network = Default::default();
        c.metrics = Default::default();
        c.tracing = Default::default();
        c
    };
    if top_level(old) != top_level(new) {
        differs.push("the top-level settings (socket, limits, workers, ...)");
    }
    let agents = |c: &Config| {
        let mut agents = c.agents.clone();
        agents.boot = Vec::new();
        agents
    };
    if agents(old) != agents(new) {
        differs.push("[agents]");
    }
    if old.exec != new.exec {
        differs.push("[exec]");
    }
    if old.tasks != new.tasks {
        differs.push("[tasks]");
    }
    if old.network != new.network {
        differs.push("[network]");
    }
    if old.metrics != new.metrics {
        differs.push("[metrics]");
    }
    if old.tracing != new.tracing {
        differs.push("[tracing]");
    }
    differs
}
