//! SIGHUP: the kernel re-reads its configuration and applies what is safe
//! to change while it runs — the LLM settings, the MCP servers, the boot
//! agents (`boot.rs`) — and says in the log what changed and what waits
//! for a restart. [`Starter`] keeps what starting THINK's provider and the
//! MCP servers takes, so a reload can start them anew.

use std::io;
use std::path::Path;
use std::sync::Arc;

use mio::{Registry, Waker};

use crate::address::Reply;
use crate::config::llm::LlmConfig;
use crate::config::mcp::McpConfig;
use crate::config::Config;
use crate::llm::Llm;
use crate::sandbox::confine::Confinement;
use crate::telemetry::tracer::Tracer;
use crate::tools::servers::Servers;

/// What starting THINK's provider and the MCP servers takes: the registry
/// the servers' pipes join, the waker their workers wake, the servers'
/// first token, and the tracer their spans go to.
#[derive(Debug)]
pub struct Starter {
    registry: Registry,
    waker: Arc<Waker>,
    tools_token: usize,
    tracer: Arc<Tracer>,
}

impl Starter {
    /// Keeps a handle on `registry` and the rest for later starts.
    pub fn new(
        registry: &Registry,
        waker: Arc<Waker>,
        tools_token: usize,
        tracer: Arc<Tracer>,
    ) -> io::Result<Starter> {
        Ok(Starter {
            registry: registry.try_clone()?,
            waker,
            tools_token,
            tracer,
        })
    }

    /// THINK as `config` sets it, its calls traced.
    pub fn start_llm(&self, config: &Config, confinement: Option<Confinement>) -> Llm {
        let waker = Arc::clone(&self.waker);
        let log_dir = config.agents.log_dir();
        let in_fleet = config.fleet.database.is_some();
        let mut llm = Llm::new(&config.llm, waker, &log_dir, confinement, in_fleet);
        llm.trace_with(Arc::clone(&self.tracer));
        llm
    }

    /// The MCP servers `config` declares, started, their calls traced.
    pub fn start_tools(
        &self,
        config: &McpConfig,
        confinement: Option<Confinement>,
        state_dir: &Path,
    ) -> io::Result<Servers> {
        let mut tools = Servers::start(
            config,
            confinement,
            state_dir,
            &self.registry,
            Arc::clone(&self.waker),
            self.tools_token,
        )?;
        tools.trace_with(Arc::clone(&self.tracer));
        Ok(tools)
    }

    /// `[llm]` changed from `old` to `new`: THINK takes it up from the
    /// next request on.
    pub fn reload_llm(
        &self,
        llm: &mut Llm,
        old: &LlmConfig,
        new: &LlmConfig,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) {
        log::info!("SIGHUP: [llm] changed; THINK takes it up from the next request on");
        llm.reconfigure(old, new, Arc::clone(&self.waker), log_dir, confinement);
    }

    /// `[mcp]` changed from `old` to `new`: the MCP servers start anew as
    /// configured, calls under way fail, and the old servers are given
    /// their grace to stop off the reactor. Returns whether the new ones
    /// took over (if not, the old ones serve on, and the next SIGHUP tries
    /// again).
    pub fn reload_tools(
        &self,
        tools: &mut Servers,
        old: &McpConfig,
        new: &McpConfig,
        confinement: Option<Confinement>,
        replies: &mut Vec<Reply>,
    ) -> bool {
        let names = |c: &McpConfig| c.servers.keys().cloned().collect::<Vec<_>>().join(", ");
        log::info!(
            "SIGHUP: [mcp] changed; restarting the MCP servers (were: {}; now: {})",
            names(old),
            names(new)
        );
        let state_dir = tools.state_dir().to_owned();
        let fresh = match self.start_tools(new, confinement, &state_dir) {
            Ok(fresh) => fresh,
            Err(err) => {
                log::error!("SIGHUP: cannot start the new MCP servers ({err}); the old ones stay");
                return false;
            }
        };
        let mut old = std::mem::replace(tools, fresh);
        old.shutdown(
            "the MCP servers were restarted for a new configuration (SIGHUP)",
            replies,
        );
        let stopping =
            agentos_primitives::threads::spawn("mcp-retire", move || old.finish_shutdown());
        if let Err(err) = stopping {
            log::error!("cannot wait for the old MCP servers to stop: {err}");
        }
        true
    }
}

/// Says in the log what a reload `applied`, and which changed settings
/// wait for a restart.
pub fn log_reloaded(applied: &[&str], needs_restart: &[&str]) {
    match (applied.is_empty(), needs_restart.is_empty()) {
        (true, true) => log::info!("SIGHUP: configuration reloaded; nothing changed"),
        _ => log::info!(
            "SIGHUP: configuration reloaded; applied: {}",
            if applied.is_empty() {
                "nothing".to_owned()
            } else {
                applied.join(", ")
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

/// The settings that differ between `old` and `new` but are applied only
/// at start-up, named by their table.
pub fn sections_needing_restart(old: &Config, new: &Config) -> Vec<&'static str> {
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
        c.state = Default::default();
        c.fleet = Default::default();
        // Read where it is used: a change applies at once.
        c.audit = Default::default();
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
    if old.state != new.state {
        differs.push("[state]");
    }
    if old.fleet != new.fleet {
        differs.push("[fleet]");
    }
    differs
}
