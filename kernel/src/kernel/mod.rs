//! The kernel: every subsystem, wired in one place — the sandbox runtime,
//! the agents, THINK, EXEC, the tool servers and the tasks — and the one
//! interface the reactor drives. Requests reach it through the syscall
//! handlers ([`crate::syscall`]); readiness of its own sources, wake-ups,
//! deadlines, closed connections and shutdown come from the reactor
//! directly; replies and adopted connections go back through
//! [`Kernel::take_output`]. Adding a subsystem means adding it here.
//!
//! The kernel holds each subsystem and each part below, and its methods
//! are all here. A part owns its state and is told the rest: a component
//! with narrow methods, or — where it needs several subsystems at once —
//! functions given them, called from here. Replies on their way out, TOOL
//! calls waiting for theirs and SPAWNs' spans (`output.rs`,
//! `tool_calls.rs`); who asks, with what it was given (`actor.rs`,
//! `runs.rs`); what EXEC and THINK know of a caller, and what ends with
//! whom (`run_work.rs`); a task's work (`task_work.rs`); the `tools`
//! package (`tool_catalog.rs`); what starting takes (`start.rs`), boot
//! agents (`boot.rs`) and SIGHUP (`reload.rs`); the sandbox runtime's
//! owners (`sandboxes.rs`) and the kernel's event sources (`sources.rs`);
//! LOGS follows (`log_follows.rs`); the metrics, gathered from what
//! they read (`metrics.rs`, `reactor_counts.rs`); and what the Clove
//! SDK's calls reach beyond the core (`services.rs`, `lowered.rs`).

mod actor;
mod boot;
pub(crate) mod fleet_sessions;
mod fleet_work;
mod log_follows;
mod lowered;
mod metrics;
mod output;
mod reactor_counts;
mod reload;
mod run_work;
mod runs;
mod sandboxes;
mod services;
mod sources;
mod start;
mod task_work;
mod tool_calls;
mod tool_catalog;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_egress::Gateway;
use agentos_proto::payload::ExecRequest;
use agentos_proto::{ErrorReply, Opcode};
use mio::{Registry, Token, Waker};

pub use actor::{Actor, Permission};
pub use log_follows::{log_seen_by, logs_reply, FollowOwner, LogFollower, LogFollowers};
pub use runs::{Root, Runs};
pub use sandboxes::{agent_calling, agent_sandboxes, exec_sandboxes, SandboxOwner};
pub use start::StartError;
pub use tool_calls::ToolCaller;

use crate::address::{Outbox, ReplyTo};
use crate::agents::{cgroup_limits, default_limits, Agents};
use crate::config::Config;
use crate::exec::{Exec, ExecDirs, RunCaller, SessionOp};
use crate::fleet::kept::{Held, HeldWork};
use crate::identity::{Principal, KERNEL_OPERATOR};
use crate::llm::{Asker, Llm};
use crate::sandbox::runtime::machine::Machine;
use crate::sandbox::runtime::{Runtime, RuntimeSetup};
use crate::state_dir::StateDir;
use crate::state_store::StateStore;
use crate::tasks::{CancelledWork, Start, Tasks, WorkRequest};
use crate::telemetry::metrics::Publisher;
use crate::telemetry::tracer::{SpanAgent, Tracer};
use crate::tools::servers::Servers;
use boot::BootAgents;
use output::Router;
use reactor_counts::ReactorCounts;
use reload::Starter;
use sandboxes::sandbox_profile;
use services::Services;
use sources::{Source, TokenRanges};
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
    /// Keys and their JSON values (STORE, FETCH, DELETE, KEYS).
    pub(crate) state_store: StateStore,
    pub(crate) messages: crate::messages::Messages,
    pub(crate) audit: crate::audit::Audit,
    pub(crate) events: crate::events::Events,
    /// LOGS follows waiting for their agents to write.
    pub(crate) log_followers: LogFollowers,
    /// What is ready for the reactor.
    pub(crate) outbox: Outbox,
    /// TOOL calls waiting for their replies, and SPAWNs' spans.
    pub(crate) router: Router,
    /// The `tools` package EXEC runs import.
    catalog: ToolCatalog,
    /// Boot agents a reload changed, waiting for their old selves to end.
    boot: BootAgents,
    /// What a reload needs to start subsystems anew.
    starter: Starter,
    tokens: TokenRanges,
    /// The egress proxy, as agents and EXEC share it.
    pub(crate) gateway: Arc<Gateway>,
    /// What the kernel counts, published for readers of its metrics.
    pub(crate) metrics: Publisher,
    /// What the reactor counts, for the metrics.
    pub(crate) reactor_counts: ReactorCounts,
    /// Where spans go, if `[tracing]` is on.
    pub(crate) tracer: Arc<Tracer>,
    /// What the Clove SDK's calls reach beyond the core subsystems.
    pub(crate) services: Services,
    /// The fleet this node has joined, if any.
    pub(crate) fleet: crate::fleet::Fleet,
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
        let fleet = crate::fleet::Fleet::join(&config.fleet, Arc::clone(&waker))?;
        let tokens = TokenRanges::from(token_base);
        let deferred = config.deferred_opcodes();
        let machine = Machine::probe();
        let namespaces = machine.has_namespaces();
        let state = StateDir::fresh(socket)?;
        let gateway = Arc::new(sandboxes::start_gateway(&config, namespaces, &state)?);
        let tracer = Arc::new(start::tracer(&config.tracing)?);
        let agents = Agents::new(&config, Arc::clone(&gateway))?;
        let setup = RuntimeSetup {
            profile: sandbox_profile(&config, &machine, &state, socket),
            warm_pool: config.agents.warm_pool,
            default_limits: cgroup_limits(&default_limits(&config)),
            doors: state.doors.clone(),
            token_base: tokens.first(Source::Sandboxes),
        };
        let mut sandboxes = Runtime::new(setup, machine, registry, Arc::clone(&waker))?;
        let starter = Starter::new(
            registry,
            Arc::clone(&waker),
            tokens.first(Source::Tools),
            Arc::clone(&tracer),
        )?;
        let llm = starter.start_llm(&config, sandboxes.confinement());
        let tools = starter.start_tools(
            &config.mcp,
            sandboxes.confinement(),
            &config.tasks.state_dir(socket),
        )?;
        let catalog = ToolCatalog::create(&state.tools);
        let mut exec = Exec::new(
            &config,
            registry,
            tokens.first(Source::Exec),
            namespaces,
            sandboxes.cgroups(),
            Arc::clone(&waker),
            ExecDirs {
                tools: catalog.dir(),
                state: config.tasks.state_dir(socket),
            },
        )?;
        exec.connect(Arc::clone(&gateway), Arc::clone(&tracer));
        exec.start_hosts(&mut exec_sandboxes(&mut sandboxes), Instant::now());
        let services = services::start(start::http_upstream(&config)?, Arc::clone(&waker));
        let (mut tasks, database) = Tasks::open(&config.tasks, socket, waker, Instant::now())?;
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
            audit: crate::audit::Audit::new(database.clone()),
            state_store: StateStore::new(database),
            events: crate::events::Events::default(),
            tasks,
            messages: Default::default(),
            log_followers: LogFollowers::default(),
            outbox: Outbox::default(),
            router: Router::new(Arc::clone(&tracer)),
            catalog,
            boot: BootAgents::default(),
            starter,
            tokens,
            gateway,
            metrics: Publisher::new(Instant::now()),
            reactor_counts: ReactorCounts::default(),
            tracer,
            services,
            fleet,
        };
        start::serve_metrics(&kernel.config.metrics, &kernel.metrics.published)?;
        fleet_sessions::recall(&mut kernel.fleet, &mut kernel.exec);
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
        self.services.http_calls.on_wake(&mut self.outbox.replies);
        let replies = &mut self.outbox.replies;
        let woken = fleet_work::on_wake(&self.fleet, &mut self.tasks, &mut self.llm, replies);
        let moved = (&mut self.fleet, &mut self.exec, &mut self.tasks);
        for work in fleet_sessions::on_wake(moved, woken.sessions, replies) {
            if let Err(err) = self.start_held(&work) {
                fleet_sessions::refuse(&work, err, &mut self.tasks, &mut self.outbox.replies);
            }
        }
        for stop in woken.stops {
            self.stop_task(stop);
        }
        // Tasks join the queue once their records are saved.
        if self.tasks.on_saved(&mut self.outbox.replies) || woken.adopted {
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
            task_work::refresh_all_progress(true, &mut self.tasks, &self.exec);
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
        if self.metrics.due(now) {
            self.agents
                .sample_usage(&agent_sandboxes(&mut self.sandboxes));
            let mut snapshot = metrics::snapshot(
                &self.agents,
                &self.llm,
                &self.exec,
                &self.tasks,
                &self.tools,
                &self.reactor_counts,
                &self.tracer,
            );
            self.fleet.add_metrics(&mut snapshot);
            self.metrics.published.publish(snapshot);
            self.fleet.set_figures(
                self.agents.states().filter(|s| s.is_live()).count(),
                self.runs.len(),
            );
        }
    }

    /// A connection closed: work queued only for it is dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.exec
            .connection_closed(serial, &mut self.outbox.replies);
        self.llm.connection_closed(serial);
        self.tools.connection_closed(serial);
        self.tasks.connection_closed(serial);
        self.log_followers.connection_closed(serial);
        self.router.connection_closed(serial);
        self.services.lowered.connection_closed(serial);
        self.messages.connection_closed(serial);
        self.events.connection_closed(serial);
        self.fleet.kept.connection_closed(serial);
    }

    /// Stops everything that runs: sandboxes, agents (within `grace`).
    pub fn begin_shutdown(&mut self, grace: Duration) {
        // Tasks still running end `interrupted` now, with what they had
        // printed, before their work is stopped; queued ones stay queued
        // for the next kernel.
        task_work::refresh_all_progress(false, &mut self.tasks, &self.exec);
        self.fleet.leave();
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

    /// Brings the `tools` package up to date, starts the boot agents whose
    /// old selves have ended, and hands the sandbox runtime's events to
    /// their owners.
    fn settle(&mut self, now: Instant) {
        if self.catalog.is_stale(&self.tools) {
            self.catalog.write(&self.tools, now);
        }
        self.boot
            .start_replaced(&mut self.agents, &mut agent_sandboxes(&mut self.sandboxes));
        sandboxes::hand_out_events(
            &mut self.sandboxes,
            &mut self.agents,
            &mut self.exec,
            &mut self.outbox.replies,
            now,
        );
    }

    /// What is ready for the reactor, if anything: replies to connections'
    /// requests, connections to adopt, and runs whose connections close.
    /// Replies addressed to tasks and TOOL calls stay with the kernel.
    /// (Called after every event: nothing, the usual answer, is cheap.)
    pub fn take_output(&mut self) -> Option<Outbox> {
        fleet_work::report(&self.fleet, &mut self.tasks);
        if self.outbox.is_empty() && !self.exec.pool().has_adopted() && !self.agents.has_ended() {
            return None;
        }
        loop {
            // The work of agents that have ended or are stopping ends too.
            for id in self.agents.take_ended() {
                run_work::end_agent_work(
                    id,
                    &mut self.exec,
                    &mut self.tasks,
                    &mut self.llm,
                    &mut self.outbox.replies,
                );
                self.state_store.agent_ended(id, &self.agents);
                self.services.recordings.forget(Principal::Agent { id });
                self.audit.agent_ended(id, &self.agents, &self.config.audit);
            }
            // A run whose reply is here is over, and so is what it started
            // (which may add replies of its own).
            let ended = self.runs.answered_by(&self.outbox.replies);
            for number in &ended {
                self.end_run(*number);
            }
            self.outbox.runs_over.extend(&ended);
            if !output::any_for_the_kernel(&self.outbox.replies) {
                if ended.is_empty() && !self.agents.has_ended() {
                    break;
                }
                continue;
            }
            // Replies to tasks finish them, which answers their waiters and
            // starts the next ones, which may be answered at once.
            let routed = self.router.route(&mut self.outbox.replies);
            for (run, bytes) in routed.delivered_to_runs {
                self.exec
                    .pool_mut()
                    .children_mut()
                    .tool_delivered(run, bytes);
            }
            // Only a task that finished makes room for a queued one.
            let made_room = !routed.tasks.is_empty();
            for (number, answer) in routed.tasks {
                let next = self
                    .tasks
                    .on_reply(number, answer, &mut self.outbox.replies);
                if let Some(next) = next {
                    self.start_task_work(next);
                }
            }
            self.close_ended_task_sessions();
            if made_room {
                self.start_tasks();
            }
        }
        let mut outbox = std::mem::take(&mut self.outbox);
        outbox.adopted.extend(self.exec.pool_mut().take_adopted());
        self.router.sent(&outbox.replies);
        Some(outbox)
    }

    /// Starts an EXEC run for `principal`, answered at `reply_to`. The run
    /// is a principal of its own: what `request` asks for it, within what
    /// `principal` has, recorded under its number, which its own kernel
    /// connection speaks for.
    pub fn start_run(
        &mut self,
        request: ExecRequest,
        principal: Principal,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        let lowered = self.services.lowered.of(reply_to);
        let actor = task_work::owner(principal, &self.agents, &self.runs)?.lowered_to(lowered);
        actor.require(Permission::Exec)?;
        let mut caller = self.run_caller(&actor);
        let limits = self.exec.run_limits(&caller, request.limits.as_ref())?;
        let tokens_left = self.llm.tokens_left(actor.budgets());
        let grant = actor.grant_run(
            &request,
            &limits,
            tokens_left,
            self.gateway.default_policy(),
            reply_to,
            self.runs.next_number(),
        )?;
        caller.policy = grant.network.policy().cloned();
        run_work::check_policy_served(&caller, &self.gateway)?;
        let asker = (principal, caller.share);
        let held =
            fleet_sessions::hold_run(&mut self.fleet, &mut self.exec, request, asker, reply_to);
        let Some(request) = held? else {
            return Ok(());
        };
        let number = self.runs.admit(grant);
        self.exec
            .run(request, caller, number, reply_to, &mut self.outbox.replies)
            .inspect_err(|_| self.runs.refused(number))
    }

    /// Work that waited for the fleet to settle its session goes on (or
    /// waits again: the session may have gone on to another node).
    fn start_held(&mut self, work: &HeldWork) -> Result<(), ErrorReply> {
        let (principal, reply_to) = (work.principal, work.reply_to);
        match &work.what {
            Held::Run(request) => self.start_run((**request).clone(), principal, reply_to),
            Held::Resume(name) => {
                let lowered = self.services.lowered.of(reply_to);
                let actor = task_work::owner(principal, &self.agents, &self.runs)?;
                let actor = actor.lowered_to(lowered);
                actor.require(Permission::Exec)?;
                let caller = self.run_caller(&actor);
                let (fleet, asker) = (&mut self.fleet, (principal, caller.share));
                if fleet_sessions::holds_resume(fleet, &mut self.exec, asker, name, reply_to)? {
                    return Ok(());
                }
                let replies = &mut self.outbox.replies;
                (self.exec).session_order(caller, name, SessionOp::Wake, reply_to, replies)
            }
        }
    }

    /// What EXEC needs to know of whoever asks for a run (see
    /// [`run_work::run_caller`]).
    pub fn run_caller(&self, actor: &Actor<'_>) -> RunCaller {
        let agent = self.span_agent(actor);
        run_work::run_caller(actor, &self.agents, &self.sandboxes, agent)
    }

    /// The agent whose work `actor`'s request is (its own, or its run's),
    /// as spans name it; `None` with tracing off.
    pub fn span_agent(&self, actor: &Actor<'_>) -> Option<SpanAgent> {
        if !self.tracer.is_on() {
            return None;
        }
        run_work::span_agent(actor, &self.agents)
    }

    /// Who is asking THINK, as the fair queue and the token budgets know
    /// it (see [`run_work::asker`]); `flow` is the asking connection.
    pub fn asker(&self, actor: &Actor<'_>, flow: u32) -> Result<Asker, ErrorReply> {
        let agent = self.span_agent(actor);
        run_work::asker(actor, flow, &self.agents, &self.llm, agent)
    }

    /// Run `number` is over (its reply has gone): the agents it spawned are
    /// stopped, and its own runs and sessions end.
    fn end_run(&mut self, number: u64) {
        run_work::end_run(
            number,
            &mut self.agents,
            &mut self.sandboxes,
            &mut self.exec,
            &mut self.tasks,
            &mut self.llm,
            &mut self.outbox.replies,
        );
    }

    /// Starts the queued tasks whose owners have room.
    pub fn start_tasks(&mut self) {
        // Work that cannot start fails its task at once, which frees its
        // owner's place: look again until nothing more starts.
        loop {
            let starts = task_work::startable(
                &mut self.tasks,
                &self.tools,
                &self.agents,
                &self.runs,
                self.llm.context_tokens(),
            );
            if starts.is_empty() {
                return;
            }
            for start in starts {
                self.start_task_work(start);
            }
        }
    }

    /// Starts a piece of a task's work — an EXEC run or a THINK, as its
    /// owner — whose reply comes back to the task. Work that cannot start
    /// fails the task with the reason.
    fn start_task_work(&mut self, start: Start) {
        let reply_to = ReplyTo::Task(start.number);
        let (principal, trace) = (start.owner, start.trace);
        let started = start.work.and_then(|work| match work {
            WorkRequest::Exec(mut run) => {
                run.trace = run.trace.or(trace);
                self.start_run(*run, principal, reply_to)
            }
            WorkRequest::Think(mut think) => {
                think.trace = think.trace.or(trace);
                let actor = task_work::owner(principal, &self.agents, &self.runs)?;
                let asker = self.asker(&actor, KERNEL_OPERATOR.id())?;
                self.llm
                    .think(&asker, reply_to, think, &mut self.outbox.replies)
            }
        });
        if let Err(err) = started {
            self.tasks
                .failed_to_start(start.number, err, &mut self.outbox.replies);
        }
    }

    /// The EXEC sessions of prompt loops that have ended go.
    pub fn close_ended_task_sessions(&mut self) {
        task_work::close_ended_sessions(&mut self.tasks, &mut self.exec, &mut self.outbox.replies);
    }

    /// The same, for the task whose work runs under `number`.
    pub fn refresh_progress_of(&mut self, number: u64, save: bool) {
        task_work::refresh_progress(number, save, &mut self.tasks, &self.exec);
    }

    /// Stops a cancelled task's work: its EXEC run is killed, its THINK
    /// withdrawn from the queue.
    pub fn stop_task(&mut self, stop: CancelledWork) {
        let replies = &mut self.outbox.replies;
        self.fleet.kept.cancel(ReplyTo::Task(stop.number));
        task_work::stop(stop, &mut self.exec, &mut self.llm, replies);
    }

    /// Starts the configured boot agents; one that fails to start is
    /// logged and the others go on.
    pub fn start_boot_agents(&mut self) {
        BootAgents::start(
            &self.config.agents.boot,
            &mut self.agents,
            &mut agent_sandboxes(&mut self.sandboxes),
        );
    }

    /// SIGHUP: applies `new` where that is safe and logs every difference.
    pub fn reload(&mut self, new: Config) {
        let old = self.config.clone();
        let log_dir = old.agents.log_dir();
        let mut applied = Vec::new();
        if old.llm != new.llm {
            let confinement = self.sandboxes.confinement();
            self.starter
                .reload_llm(&mut self.llm, &old.llm, &new.llm, &log_dir, confinement);
            applied.push("llm");
        }
        let mut mcp = old.mcp.clone();
        if old.mcp != new.mcp
            && self.starter.reload_tools(
                &mut self.tools,
                &old.mcp,
                &new.mcp,
                self.sandboxes.confinement(),
                &mut self.outbox.replies,
            )
        {
            // The `tools` package is written again for the new servers.
            self.catalog.forget();
            mcp = new.mcp.clone();
            applied.push("mcp");
        }
        // Always: declared boot agents that are not running start again
        // even when no entry changed.
        self.boot.reload(
            &old.agents.boot,
            &new.agents.boot,
            &mut self.agents,
            &mut agent_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
        );
        if old.agents.boot != new.agents.boot {
            applied.push("agents.boot");
        }
        reload::log_reloaded(&applied, &reload::sections_needing_restart(&old, &new));
        // Only what was applied changes the configuration in force, so a
        // later reload compares against what actually runs.
        self.config.llm = new.llm;
        self.config.mcp = mcp;
        self.config.agents.boot = new.agents.boot;
    }
}
