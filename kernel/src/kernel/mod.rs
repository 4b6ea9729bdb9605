//! The kernel: every subsystem, wired in one place — the sandbox runtime,
//! the agents, THINK, EXEC, the tool servers and the tasks — and the one
//! interface the reactor drives. Requests reach it through the syscall
//! handlers ([`crate::syscall`]); readiness of its own sources, wake-ups,
//! deadlines, closed connections and shutdown come from the reactor
//! directly; replies and adopted connections go back through
//! [`Kernel::take_output`]. Adding a subsystem means adding it here.
//!
//! What goes between subsystems lives in this module's files: a task's work
//! started on EXEC or THINK and its reply handed back (`task_work.rs`), the
//! replies routed to tasks and TOOL callers (`output.rs`), who asks with
//! what it was given (`actor.rs`, `runs.rs`) and what ends with whom
//! (`run_work.rs`), the `tools` package (`tool_catalog.rs`), boot agents and
//! SIGHUP (`reload.rs`), and LOGS follows (`log_follows.rs`).

mod actor;
mod log_follows;
mod metrics;
mod output;
mod reactor_counts;
mod reload;
mod run_work;
mod runs;
mod sandboxes;
mod sources;
mod task_work;
mod tool_calls;
mod tool_catalog;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::SpawnRequest;
use agentos_proto::Opcode;
use mio::{Registry, Token, Waker};

pub use actor::{Actor, Permission};
pub use log_follows::{log_seen_by, logs_reply, FollowOwner, LogFollower, LogFollowers};
pub use runs::{Root, RunGrant, Runs};
pub use sandboxes::{agent_sandboxes, exec_sandboxes, SandboxOwner};
pub use tool_calls::ToolCaller;

use crate::address::{Outbox, ReplyTo};
use crate::agents::{cgroup_limits, default_limits, Agents, BadBootEntry};
use crate::config::Config;
use crate::exec::Exec;
use crate::llm::Llm;
use crate::network::Gateway;
use crate::sandbox::runtime::machine::Machine;
use crate::sandbox::runtime::{Runtime, RuntimeSetup};
use crate::state_dir::StateDir;
use crate::tasks::Tasks;
use crate::tools::servers::Servers;
use sandboxes::sandbox_profile;
use sources::{Source, TokenRanges};
use tool_calls::ToolCalls;
use tool_catalog::ToolCatalog;

/// The kernel's state, which the syscall handlers act on. Owned by the
/// reactor thread.
#[derive(Debug)]
pub struct Kernel {
    config: Config,
    /// Opcodes whose replies go through a worker (a diagnostics setting).
    pub(crate) deferred: Vec<Opcode>,
    state: StateDir,
    /// Sandboxes, for every kind of owner.
    pub(crate) sandboxes: Runtime<SandboxOwner>,
    pub(crate) agents: Agents,
    /// EXEC runs in progress: each a principal of its own.
    pub(crate) runs: Runs,
    pub(crate) llm: Llm,
    pub(crate) exec: Exec,
    /// The MCP tool servers.
    pub(crate) tools: Servers,
    /// Background tasks.
    pub(crate) tasks: Tasks,
    /// LOGS follows waiting for their agents to write.
    pub(crate) log_followers: LogFollowers,
    /// What is ready for the reactor.
    pub(crate) outbox: Outbox,
    /// TOOL calls waiting for their replies.
    tool_calls: ToolCalls,
    /// The `tools` package EXEC runs import.
    catalog: ToolCatalog,
    /// Boot agents a reload changed, waiting for their old selves to end.
    boot_pending: Vec<SpawnRequest>,
    /// What a reload needs to start subsystems anew.
    registry: Registry,
    waker: Arc<Waker>,
    tokens: TokenRanges,
    /// The egress proxy, as agents and EXEC share it.
    pub(crate) gateway: Arc<Gateway>,
    /// What the kernel counts, published for readers of its metrics.
    pub(crate) metrics: crate::telemetry::metrics::Publisher,
    /// What the reactor counts, for the metrics.
    pub(crate) reactor_counts: reactor_counts::ReactorCounts,
    /// SPAWNs' spans, until their replies go out.
    spawn_spans: HashMap<ReplyTo, crate::telemetry::tracer::OpenSpan>,
    /// Where spans go, if `[tracing]` is on.
    pub(crate) tracer: Arc<crate::telemetry::tracer::Tracer>,
}

/// The tracer `[tracing]` asks for: its exporter's thread started, or
/// none.
fn start_tracer(
    tracing: &crate::config::tracing::TracingConfig,
) -> io::Result<crate::telemetry::tracer::Tracer> {
    use crate::telemetry::{exporter::Exporter, tracer::Tracer};
    Ok(match &tracing.otlp_endpoint {
        Some(endpoint) => Tracer::new(
            Exporter::start(endpoint, &tracing.service_name, tracing.queue)?,
            tracing.record_content,
        ),
        None => Tracer::default(),
    })
}

/// Why the kernel could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A `[[agents.boot]]` entry is wrong.
    #[error(transparent)]
    BootAgent(#[from] BadBootEntry),
    /// The task store cannot be opened.
    #[error("the task store: {0}")]
    TaskStore(#[from] crate::tasks::store::StoreError),
    /// A subsystem or the state directory cannot be set up.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Kernel {
    /// Kernel state for `config`: probes the machine, makes the state
    /// directory beside the kernel's `socket`, and starts the subsystems.
    /// The kernel's own event sources are registered with `registry` under
    /// tokens from `token_base` on; finished background work wakes `waker`.
    pub fn new(
        config: Config,
        registry: &Registry,
        waker: Arc<Waker>,
        socket: &Path,
        token_base: usize,
    ) -> Result<Kernel, StartError> {
        // A bad boot agent entry stops the kernel before anything starts.
        Agents::check_boot(&config)?;
        let tokens = TokenRanges::from(token_base);
        let deferred = config.deferred_opcodes();
        let machine = Machine::probe();
        let namespaces = machine.has_namespaces();
        let state = StateDir::fresh(socket)?;
        let gateway = Arc::new(sandboxes::start_gateway(&config, namespaces, &state)?);
        let tracer = Arc::new(start_tracer(&config.tracing)?);
        let agents = Agents::new(&config, Arc::clone(&gateway))?;
        let log_dir = config.agents.log_dir();
        let setup = RuntimeSetup {
            profile: sandbox_profile(&config, &machine, &state, socket),
            warm_pool: config.agents.warm_pool,
            default_limits: cgroup_limits(&default_limits(&config)),
            doors: state.doors.clone(),
            token_base: tokens.first(Source::Sandboxes),
        };
        let mut sandboxes = Runtime::new(setup, machine, registry, Arc::clone(&waker))?;
        let mut llm = Llm::new(
            &config.llm,
            Arc::clone(&waker),
            &log_dir,
            sandboxes.confinement(),
        );
        llm.trace_with(Arc::clone(&tracer));
        let mut tools = Servers::start(
            &config.mcp,
            sandboxes.confinement(),
            &config.tasks.state_dir(socket),
            registry,
            Arc::clone(&waker),
            tokens.first(Source::Tools),
        )?;
        tools.trace_with(Arc::clone(&tracer));
        let catalog = ToolCatalog::create(&state.tools);
        let mut exec = Exec::new(
            &config,
            registry,
            tokens.first(Source::Exec),
            namespaces,
            sandboxes.cgroups(),
            Arc::clone(&waker),
            catalog.dir(),
        )?;
        exec.serve_policies_with(Arc::clone(&gateway));
        exec.trace_with(Arc::clone(&tracer));
        exec.start_hosts(&mut exec_sandboxes(&mut sandboxes), Instant::now());
        let mut tasks = Tasks::open(&config.tasks, socket, Arc::clone(&waker), Instant::now())?;
        tasks.trace_with(Arc::clone(&tracer));
        let mut kernel = Kernel {
            config,
            deferred,
            state,
            sandboxes,
            agents,
            runs: Runs::default(),
            llm,
            exec,
            tools,
            tasks,
            log_followers: LogFollowers::default(),
            outbox: Outbox::default(),
            tool_calls: ToolCalls::default(),
            catalog,
            boot_pending: Vec::new(),
            registry: registry.try_clone()?,
            waker,
            tokens,
            gateway,
            metrics: crate::telemetry::metrics::Publisher::new(Instant::now()),
            reactor_counts: reactor_counts::ReactorCounts::default(),
            spawn_spans: HashMap::new(),
            tracer,
        };
        if let Some(listen) = &kernel.config.metrics.listen {
            let listen = crate::telemetry::listener::Listen::parse(listen);
            crate::telemetry::listener::serve(&listen, kernel.metrics.published.clone()).map_err(
                |err| io::Error::new(err.kind(), format!("[metrics] listen {listen:?}: {err}")),
            )?;
        }
        // Tasks queued before a restart run now.
        kernel.start_tasks();
        kernel.start_boot_agents();
        Ok(kernel)
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether a token is one of the kernel's own sources.
    pub fn owns(&self, token: Token) -> bool {
        self.tokens.source_of(token).is_some()
    }

    /// Whether a process in these PID namespaces (its own first, then its
    /// ancestors) lives inside one of the kernel's sandboxes.
    pub fn is_inside_a_sandbox(&self, pid_namespaces: &[u64]) -> bool {
        self.sandboxes.is_inside_a_sandbox(pid_namespaces)
    }

    /// Readiness of one of the kernel's own sources.
    pub fn on_event(&mut self, token: Token) {
        match self.tokens.source_of(token) {
            Some(Source::Exec) => self.exec.on_event(token, &mut self.outbox.replies),
            Some(Source::Tools) => {
                self.tools
                    .on_event(token, &mut self.outbox.replies, Instant::now());
            }
            Some(Source::Sandboxes) => self.sandboxes.on_event(token, &mut self.outbox),
            None => return,
        }
        self.settle(Instant::now());
    }

    /// Background work finished: launches, run cgroups, LLM calls.
    pub fn on_wake(&mut self) {
        self.sandboxes.on_wake();
        self.exec.on_wake(&mut self.outbox.replies);
        self.llm.poll(&mut self.outbox.replies);
        self.tools.on_wake(&mut self.outbox.replies, Instant::now());
        // Tasks join the queue once their records are saved.
        if self.tasks.on_saved(&mut self.outbox.replies) {
            self.start_tasks();
        }
        self.settle(Instant::now());
    }

    /// How long until the kernel's earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        [
            self.sandboxes.next_deadline(now),
            self.agents.next_deadline(now),
            self.llm.next_deadline(now),
            self.exec.next_deadline(now),
            self.tools.next_deadline(now),
            self.tasks.next_deadline(now),
            self.catalog.next_deadline(now),
            self.log_followers.next_deadline(now),
            self.metrics.next_deadline(now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handles the deadlines that are due (cheap when none is: it runs on
    /// every turn of the reactor).
    pub fn on_deadlines(&mut self, now: Instant) {
        self.sandboxes.on_deadlines(now);
        self.agents
            .on_deadlines(&mut agent_sandboxes(&mut self.sandboxes), now);
        self.llm.on_deadlines(now, &mut self.outbox.replies);
        self.tools.on_deadlines(now, &mut self.outbox.replies);
        self.tasks.on_deadlines(now, &mut self.outbox.replies);
        self.log_followers
            .serve(&self.agents, now, false, &mut self.outbox.replies);
        if self.tasks.progress_due(now) {
            self.refresh_task_progress(true);
        }
        if self.catalog.renewal_due(now) {
            self.exec.tools_changed();
        }
        self.exec.on_deadlines(
            &mut exec_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            now,
        );
        self.settle(now);
        self.publish_metrics_if_due(now);
    }

    /// A connection closed: work queued only for it is dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.exec
            .connection_closed(serial, &mut self.outbox.replies);
        self.llm.connection_closed(serial);
        self.tools.connection_closed(serial);
        self.tasks.connection_closed(serial);
        self.log_followers.connection_closed(serial);
        self.tool_calls.connection_closed(serial);
    }

    /// Stops everything that runs: sandboxes, agents (within `grace`).
    pub fn begin_shutdown(&mut self, grace: Duration) {
        // Tasks still running end `interrupted` now, with what they had
        // printed, before their work is stopped; queued ones stay queued
        // for the next kernel.
        self.refresh_task_progress(false);
        self.tasks.stop(&mut self.outbox.replies);
        self.log_followers
            .serve(&self.agents, Instant::now(), true, &mut self.outbox.replies);
        self.sandboxes.begin_shutdown();
        self.agents.begin_shutdown(
            &mut agent_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            grace,
        );
        self.exec.begin_shutdown(
            &mut exec_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
        );
        self.tools
            .shutdown("the kernel is stopping", &mut self.outbox.replies);
        self.settle(Instant::now());
    }

    /// Nothing the kernel started is still running.
    pub fn is_idle(&self) -> bool {
        self.sandboxes.is_idle()
    }

    /// Last step of shutdown (may block briefly): kills what remains,
    /// removes cgroups and the state directory, stops THINK.
    pub fn finish_shutdown(&mut self) {
        self.exec.finish_shutdown();
        self.tools.finish_shutdown();
        self.tasks.finish_shutdown();
        self.sandboxes.finish_shutdown();
        self.llm.shutdown();
        self.state.remove();
    }

    /// Hands the sandbox runtime's events to their owners, until none is
    /// left (handling one may cause another).
    fn settle(&mut self, now: Instant) {
        if self.catalog.is_stale(&self.tools) {
            self.catalog.write(&self.tools, now);
        }
        self.start_replaced_boot_agents();
        loop {
            let events = self.sandboxes.take_events();
            if events.is_empty() {
                return;
            }
            for event in events {
                match *event.owner() {
                    SandboxOwner::Agent(incarnation) => {
                        let event = event.map(|_| incarnation);
                        self.agents.on_sandbox(
                            &mut agent_sandboxes(&mut self.sandboxes),
                            &mut self.outbox.replies,
                            event,
                            now,
                        );
                    }
                    SandboxOwner::ExecHost(id) => {
                        let event = event.map(|_| id);
                        self.exec
                            .on_sandbox(&mut exec_sandboxes(&mut self.sandboxes), event, now);
                    }
                }
            }
        }
    }
}
