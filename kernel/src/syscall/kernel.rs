//! The kernel's state and the one place its subsystems are wired: the
//! sandbox runtime, the agents table, THINK, EXEC and the tool servers. The reactor knows only
//! this interface — requests in ([`Kernel::dispatch`]), readiness of the
//! kernel's own sources, wake-ups, deadlines, closed connections and
//! shutdown in, replies and adopted connections out
//! ([`Kernel::take_output`]). Adding a subsystem means adding it here.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{ExecRequest, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply, Opcode};
use mio::{Registry, Token, Waker};

use super::logs::LogFollowers;
use super::runs::{Actor, Power, Runs};
use crate::address::{Answer, Outbox, Reply, ReplyTo};
use crate::agents::{cgroup_limits, default_limits, Agents, Run};
use crate::config::Config;
use crate::exec::{ChargedTo, Exec, HostId, RunCaller};
use crate::identity::{Principal, KERNEL_OPERATOR};
use crate::llm::Llm;
use crate::sandbox::plan::Profile;
use crate::sandbox::runtime::host::Host;
use crate::sandbox::runtime::{self, OwnersOf, Runtime, RuntimeSetup};
use crate::sandbox::spec::Rlimits;
use crate::sandbox::User;
use crate::state_dir::{kernel_files, StateDir};
use crate::tasks::{self, Start, Stop, Tasks, Work, PROGRESS_BYTES};
use crate::tools::builtin;
use crate::tools::package::{CatalogServer, Package};
use crate::tools::servers::Servers;

/// Who owns a sandbox of the kernel's runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A run of an agent.
    Agent(Run),
    /// An exec host.
    ExecHost(HostId),
}

/// How long the tools on offer must stay unchanged before exec hosts
/// renew their pools for them.
const POOL_RENEWAL_SETTLE: Duration = Duration::from_millis(100);

/// Who is waiting for a built-in tool call's reply.
#[derive(Clone, Copy, Debug)]
pub struct ToolCaller {
    /// Where the TOOL reply goes.
    pub reply_to: ReplyTo,
    /// The EXEC run that made the call, whose reply counts it.
    pub run: Option<u64>,
}

/// The kernel state syscalls act on. Owned by the reactor thread.
#[derive(Debug)]
pub struct Kernel {
    pub(super) config: Config,
    pub(super) deferred: Vec<Opcode>,
    state: StateDir,
    /// Sandboxes, for every kind of owner.
    pub(super) sandboxes: Runtime<Owner>,
    pub(super) agents: Agents,
    /// EXEC runs in progress: each a principal of its own.
    pub(super) runs: Runs,
    pub(super) llm: Llm,
    pub(super) exec: Exec,
    /// The MCP tool servers.
    pub(super) tools: Servers,
    /// The `tools` package EXEC runs import.
    package: Option<Package>,
    /// The servers' generation the package was last written for.
    pub(super) catalog_generation: Option<u64>,
    /// When exec hosts take up the package last written: changes come in
    /// bursts (a server lists its tools again right after starting), and
    /// each renews the pool.
    pool_renewal: Option<Instant>,
    /// Built-in tool calls answered through another subsystem (`llm.think`
    /// through THINK), by the kernel's number for them.
    tool_calls_through: HashMap<u64, ToolCaller>,
    next_tool_call: u64,
    /// What is ready for the reactor.
    pub(super) outbox: Outbox,
    /// Background tasks.
    pub(super) tasks: Tasks,
    /// LOGS follows waiting for their agents to write.
    pub(super) log_followers: LogFollowers,
    /// Boot agents a reload changed, waiting for their old selves to end.
    pub(super) boot_pending: Vec<SpawnRequest>,
    /// What a reload needs to start subsystems anew.
    pub(super) registry: Registry,
    pub(super) waker: Arc<Waker>,
    pub(super) tools_token: usize,
}

impl Kernel {
    /// Kernel state for `config`: probes the host, makes the state
    /// directory beside the kernel's `socket`, and starts the subsystems.
    /// The kernel's own event sources are registered with `registry` under
    /// tokens from `token_base` on; finished background work wakes `waker`.
    pub fn new(
        config: Config,
        registry: &Registry,
        waker: Arc<Waker>,
        socket: &Path,
        token_base: usize,
    ) -> io::Result<Kernel> {
        // A bad boot agent entry stops the kernel before anything starts.
        Agents::check_boot(&config).map_err(io::Error::other)?;
        let deferred = config.deferred_opcodes();
        let host = Host::probe();
        let namespaces = host.has_namespaces();
        let state = StateDir::fresh(socket)?;
        let agents = Agents::new(&config)?;
        let log_dir = config.agents.log_dir();
        let profile = sandbox_profile(&config, &host, &state, socket);
        let setup = RuntimeSetup {
            profile,
            warm_pool: config.agents.warm_pool,
            default_limits: cgroup_limits(&default_limits(&config)),
            doors: state.doors.clone(),
            token_base,
        };
        let mut sandboxes = Runtime::new(setup, host, registry, Arc::clone(&waker))?;
        let llm = Llm::new(
            &config.llm,
            Arc::clone(&waker),
            &log_dir,
            sandboxes.confinement(),
        );
        let tools_token = token_base + runtime::TOKEN_SPAN + crate::exec::TOKEN_SPAN;
        let tools = Servers::start(
            &config.mcp,
            sandboxes.confinement(),
            registry,
            Arc::clone(&waker),
            tools_token,
        )?;
        let exec_tokens = token_base + runtime::TOKEN_SPAN;
        let package = Package::create(&state.tools)
            .map_err(|err| log::error!("EXEC runs get no `tools` package: {err}"))
            .ok();
        let mut exec = Exec::new(
            &config,
            registry,
            exec_tokens,
            namespaces,
            sandboxes.cgroups(),
            Arc::clone(&waker),
            package.as_ref().map(|p| p.dir().to_path_buf()),
        )?;
        exec.start_hosts(&mut exec_sandboxes(&mut sandboxes), Instant::now());
        let tasks = Tasks::open(&config.tasks, socket, Arc::clone(&waker), Instant::now())
            .map_err(|err| io::Error::other(err.to_string()))?;
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
            package,
            catalog_generation: None,
            pool_renewal: None,
            tool_calls_through: HashMap::new(),
            next_tool_call: 1,
            outbox: Outbox::default(),
            tasks,
            log_followers: LogFollowers::default(),
            boot_pending: Vec::new(),
            registry: registry.try_clone()?,
            waker,
            tools_token,
        };
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
        self.sandboxes.owns(token) || self.exec.owns(token) || self.tools.owns(token)
    }

    /// Whether a process in these PID namespaces (its own first, then its
    /// ancestors) lives inside one of the kernel's sandboxes.
    pub fn is_inside_a_sandbox(&self, pid_namespaces: &[u64]) -> bool {
        self.sandboxes.is_inside_a_sandbox(pid_namespaces)
    }

    /// Readiness of one of the kernel's own sources.
    pub fn on_event(&mut self, token: Token) {
        if self.exec.owns(token) {
            self.exec.on_event(token, &mut self.outbox.replies);
        } else if self.tools.owns(token) {
            self.tools
                .on_event(token, &mut self.outbox.replies, Instant::now());
        } else {
            self.sandboxes.on_event(token, &mut self.outbox);
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
            self.pool_renewal
                .map(|due| due.saturating_duration_since(now)),
            self.next_log_look(now),
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
        self.serve_log_followers(now, false);
        if self.tasks.progress_due(now) {
            self.refresh_task_progress(true);
        }
        if self.pool_renewal.is_some_and(|due| due <= now) {
            self.pool_renewal = None;
            self.exec.tools_changed();
        }
        self.exec.on_deadlines(
            &mut exec_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            now,
        );
        self.settle(now);
    }

    /// A connection closed: work queued only for it is dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.exec
            .connection_closed(serial, &mut self.outbox.replies);
        self.llm.connection_closed(serial);
        self.tools.connection_closed(serial);
        self.tasks.connection_closed(serial);
        self.drop_log_followers_of(serial);
        self.tool_calls_through
            .retain(|_, caller| caller.reply_to.connection() != Some(serial));
    }

    /// Stops everything that runs: sandboxes, agents (within `grace`).
    pub fn begin_shutdown(&mut self, grace: Duration) {
        // Tasks still running end `interrupted` now, with what they had
        // printed, before their work is stopped; queued ones stay queued
        // for the next kernel.
        self.refresh_task_progress(false);
        self.tasks.stop(&mut self.outbox.replies);
        self.serve_log_followers(Instant::now(), true);
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

    /// What is ready for the reactor, if anything: replies to connections'
    /// requests, and connections accepted on agents' sockets. Replies
    /// addressed to tasks stay with the kernel. (Called after every event:
    /// the common answer, nothing, costs two length checks.)
    pub fn take_output(&mut self) -> Option<Outbox> {
        if self.outbox.is_empty() && !self.exec.has_adopted() && !self.agents.has_ended() {
            return None;
        }
        for delivered in self.tools.take_delivered() {
            self.exec.tool_delivered(delivered.tag, delivered.bytes);
        }
        loop {
            // The work of agents that have ended or are stopping ends too.
            for id in self.agents.take_ended() {
                self.end_agent_work(id);
            }
            // A run whose reply is here is over, and so is what it started
            // (which may add replies of its own).
            let runs = &mut self.runs;
            let ended: Vec<u64> = if runs.is_empty() {
                Vec::new()
            } else {
                self.outbox
                    .replies
                    .iter()
                    .filter_map(|(to, _)| runs.answered(to).map(|(number, _)| number))
                    .collect()
            };
            for number in &ended {
                self.end_run(*number);
            }
            self.outbox.runs_over.extend(&ended);
            let for_tasks = self
                .outbox
                .replies
                .iter()
                .any(|(to, _)| !matches!(to, ReplyTo::Request { .. }));
            if !for_tasks {
                if ended.is_empty() && !self.agents.has_ended() {
                    break;
                }
                continue;
            }
            // Replies to tasks finish them, which answers their waiters and
            // starts the next ones, which may be answered at once.
            let mut replies = std::mem::take(&mut self.outbox.replies);
            self.answer_tool_calls_through(&mut replies);
            let finished = keep_task_replies(&mut replies);
            self.outbox.replies.extend(replies);
            // Only a task that finished makes room for a queued one.
            let made_room = !finished.is_empty();
            for (number, payload) in finished {
                let next = self
                    .tasks
                    .on_reply(number, payload, &mut self.outbox.replies);
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
        outbox.adopted.extend(self.exec.take_adopted());
        Some(outbox)
    }

    /// Starts the queued tasks whose owners have room.
    pub(super) fn start_tasks(&mut self) {
        // Work that cannot start fails its task at once, which frees its
        // owner's place: look again until nothing more starts.
        loop {
            let tools = if self.tasks.prompt_queued() {
                self.tools_summary()
            } else {
                String::new()
            };
            let starts = self.tasks.startable(&tools);
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
        let principal = start.owner;
        let started = start.work.and_then(|work| match work {
            Work::Exec(run) => self.start_run(run, principal, reply_to),
            Work::Think(think) => {
                let actor = self.task_actor(principal)?;
                let asker = super::think::asker(self, &actor, KERNEL_OPERATOR.id())?;
                self.llm
                    .think(&asker, reply_to, think, &mut self.outbox.replies)
            }
        });
        if let Err(err) = started {
            self.tasks
                .failed_to_start(start.number, err, &mut self.outbox.replies);
        }
    }

    /// The tools a prompt loop's THINK is told of: one line each, as code
    /// calls them.
    fn tools_summary(&self) -> String {
        builtin::tools()
            .iter()
            .map(|(server, tool)| (*server, tool))
            .chain(self.tools.known_tools())
            .map(|(server, tool)| {
                let summary = tool.description.lines().next().unwrap_or("");
                format!(
                    "- tools.{server}.{}(...): {summary}",
                    crate::python_names::python_name(&tool.name)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The EXEC sessions of prompt loops that have ended go.
    pub(super) fn close_ended_task_sessions(&mut self) {
        for (owner, session) in self.tasks.take_ended_sessions() {
            self.exec.close(owner, &session, &mut self.outbox.replies);
        }
    }

    /// Running tasks' progress: what their runs have printed so far
    /// (`save`: and into the store).
    pub(super) fn refresh_task_progress(&mut self, save: bool) {
        for number in self.tasks.running() {
            self.refresh_progress_of(number, save);
        }
    }

    /// The same, for the task whose work runs under `number`.
    pub(super) fn refresh_progress_of(&mut self, number: u64, save: bool) {
        if let Some(output) = self
            .exec
            .output_so_far(ReplyTo::Task(number), PROGRESS_BYTES)
        {
            self.tasks.progress(number, output, save);
        }
    }

    /// Stops a cancelled task's work: its EXEC run is killed, its THINK
    /// withdrawn from the queue (one already at the provider answers no
    /// one).
    pub(super) fn stop_task(&mut self, stop: Stop) {
        // Its work is an EXEC run or a THINK (a prompt task's, either):
        // each subsystem stops what it has under this address, if anything.
        let reply_to = ReplyTo::Task(stop.number);
        self.exec.cancel(reply_to, &mut self.outbox.replies);
        self.llm.withdraw_reply(reply_to);
    }

    /// Who a task's work is done for, with what it was given: its agent,
    /// which must still be alive.
    fn task_actor(&self, principal: Principal) -> Result<Actor<'_>, ErrorReply> {
        Actor::of(principal, &self.agents, &self.runs)
            .map_err(|_| ErrorReply::new(ErrorCode::Unavailable, "the task's owner has ended"))
    }

    /// Starts an EXEC run for `principal`, answered at `reply_to`. The run
    /// is a principal of its own: what `request` asks for it, within what
    /// `principal` has, recorded under its number, which its own kernel
    /// connection speaks for.
    pub(super) fn start_run(
        &mut self,
        request: ExecRequest,
        principal: Principal,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        let actor = self.task_actor(principal)?;
        actor.may(Power::Exec)?;
        let caller = self.run_caller(&actor);
        let limits = self.exec.run_limits(&caller, request.limits.as_ref())?;
        let tokens_left = self.llm.tokens_left(actor.budgets());
        let grant = actor.grant_run(
            &request,
            &limits,
            tokens_left,
            reply_to,
            self.runs.next_number(),
        )?;
        let number = self.runs.admit(grant);
        self.exec
            .run(request, caller, number, reply_to, &mut self.outbox.replies)
            .inspect_err(|_| self.runs.refused(number))
    }

    /// What EXEC needs to know of whoever asks for a run: whose work it is
    /// and whose share it counts against, its limits, and the agent cgroup
    /// its memory and processes are charged under.
    pub(super) fn run_caller(&self, actor: &Actor<'_>) -> RunCaller {
        let charged_to = actor.root().agent().and_then(|agent| {
            let sandbox = self.agents.sandbox_of(agent)?;
            let cgroup = self.sandboxes.cgroup_of(sandbox)?;
            Some(ChargedTo {
                agent,
                cgroup: cgroup.to_path_buf(),
            })
        });
        RunCaller {
            principal: actor.principal(),
            share: actor.share(&self.agents),
            limits: actor.limits(),
            charged_to,
        }
    }

    /// Run `number` is over (its reply has gone): the agents it spawned are
    /// stopped, and its own runs and sessions end.
    fn end_run(&mut self, number: u64) {
        self.llm.forget_budget(Runs::budget_key(number));
        self.agents.stop_started_by(
            &mut agent_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            number,
        );
        self.end_work_of(
            Principal::Run { number },
            "the EXEC run that asked for it has ended",
        );
    }

    /// Agent `id`'s run has ended, or it is being stopped: its EXEC runs,
    /// sessions and tasks end.
    fn end_agent_work(&mut self, id: u32) {
        self.end_work_of(
            Principal::Agent { id },
            "the agent that asked for it has ended",
        );
    }

    /// What `principal` asked for ends with it, because `why`: its EXEC
    /// runs and sessions, and its tasks (an operator's are never ended so).
    fn end_work_of(&mut self, principal: Principal, why: &str) {
        self.exec
            .end_work_of(principal, why, &mut self.outbox.replies);
        if matches!(principal, Principal::Operator { .. }) {
            return;
        }
        let owner = self.task_owner(principal);
        for stop in self.tasks.end_owner(owner, why, &mut self.outbox.replies) {
            self.stop_task(stop);
        }
        self.close_ended_task_sessions();
        if let Principal::Run { .. } = principal {
            self.tasks.forget_owner(owner);
        }
    }

    /// Whose tasks `principal`'s are, as the task store names owners.
    pub(super) fn task_owner(&self, principal: Principal) -> tasks::Owner {
        let boot = self.tasks.boot();
        match principal {
            Principal::Operator { uid } => tasks::Owner::User(uid),
            Principal::Agent { id } => tasks::Owner::Agent { boot, id },
            Principal::Run { number } => tasks::Owner::Run { boot, number },
        }
    }

    /// The address a built-in tool call answered through another
    /// subsystem gives it: that subsystem's reply comes back here
    /// ([`ReplyTo::Tool`]) to be made a TOOL reply for `caller`.
    pub(super) fn tool_call_through(&mut self, caller: ToolCaller) -> ReplyTo {
        let call = self.next_tool_call;
        self.next_tool_call += 1;
        self.tool_calls_through.insert(call, caller);
        ReplyTo::Tool {
            call,
            connection: caller.reply_to.connection(),
        }
    }

    /// A built-in tool call that was refused before it went anywhere.
    pub(super) fn tool_call_refused(&mut self, via: ReplyTo) {
        if let ReplyTo::Tool { call, .. } = via {
            self.tool_calls_through.remove(&call);
        }
    }

    /// A built-in tool call was answered with a reply of `bytes`: an EXEC
    /// run that made it counts it.
    pub(super) fn tools_delivered(&mut self, run: Option<u64>, bytes: usize) {
        if let Some(run) = run {
            self.exec.tool_delivered(run, bytes);
        }
    }

    /// Replies to built-in tool calls made through another subsystem,
    /// readdressed to their callers as TOOL replies.
    /// One whose caller has gone is dropped.
    fn answer_tool_calls_through(&mut self, replies: &mut Vec<Reply>) {
        replies.retain_mut(|(to, payload)| {
            let ReplyTo::Tool { call, .. } = *to else {
                return true;
            };
            let Some(caller) = self.tool_calls_through.remove(&call) else {
                return false;
            };
            let think = std::mem::replace(payload, Answer::Json(Vec::new()));
            *payload = crate::tools::builtin::from_think(think);
            *to = caller.reply_to;
            if let Some(run) = caller.run {
                self.exec.tool_delivered(run, payload.json_len());
            }
            true
        });
    }

    /// Writes the `tools` package's catalog for the tools on offer now
    /// (runs that find a tool missing read it again); if it changed, exec
    /// hosts take it up once changes settle.
    fn write_catalog(&mut self, now: Instant) {
        self.catalog_generation = Some(self.tools.generation());
        let Some(package) = self.package.as_mut() else {
            return;
        };
        let mut servers: Vec<CatalogServer<'_>> = Vec::new();
        for (server, tool) in builtin::tools()
            .iter()
            .map(|(server, tool)| (*server, tool))
            .chain(self.tools.known_tools())
        {
            match servers.iter_mut().find(|s| s.name == server) {
                Some(entry) => entry.tools.push(tool),
                None => servers.push(CatalogServer {
                    name: server,
                    description: builtin::describe_server(server),
                    tools: vec![tool],
                }),
            }
        }
        match package.update(&servers) {
            Ok(true) => self.pool_renewal = Some(now + POOL_RENEWAL_SETTLE),
            Ok(false) => {}
            Err(err) => log::error!("cannot write the `tools` package: {err}"),
        }
    }

    /// Hands the sandbox runtime's events to their owners, until none is
    /// left (handling one may cause another).
    fn settle(&mut self, now: Instant) {
        if self.catalog_generation != Some(self.tools.generation()) {
            self.write_catalog(now);
        }
        self.start_replaced_boot_agents();
        loop {
            let events = self.sandboxes.take_events();
            if events.is_empty() {
                return;
            }
            for event in events {
                match *event.owner() {
                    Owner::Agent(run) => {
                        let event = event.map(|_| run);
                        self.agents.on_sandbox(
                            &mut agent_sandboxes(&mut self.sandboxes),
                            &mut self.outbox.replies,
                            event,
                            now,
                        );
                    }
                    Owner::ExecHost(id) => {
                        let event = event.map(|_| id);
                        self.exec
                            .on_sandbox(&mut exec_sandboxes(&mut self.sandboxes), event, now);
                    }
                }
            }
        }
    }
}

/// The runtime as agents see it: their runs wrapped as owners.
pub(super) fn agent_sandboxes(runtime: &mut Runtime<Owner>) -> OwnersOf<'_, Owner, Run> {
    OwnersOf::new(runtime, Owner::Agent)
}

/// The runtime as EXEC sees it: its hosts wrapped as owners.
pub(super) fn exec_sandboxes(runtime: &mut Runtime<Owner>) -> OwnersOf<'_, Owner, HostId> {
    OwnersOf::new(runtime, Owner::ExecHost)
}

/// Takes the replies addressed to tasks out of `replies`, in order.
fn keep_task_replies(replies: &mut Vec<Reply>) -> Vec<(u64, Answer)> {
    let mut tasks = Vec::new();
    let mut rest = Vec::with_capacity(replies.len());
    for (to, answer) in replies.drain(..) {
        match to {
            ReplyTo::Task(task) => tasks.push((task, answer)),
            ReplyTo::Request { .. } | ReplyTo::Tool { .. } => rest.push((to, answer)),
        }
    }
    *replies = rest;
    tasks
}

/// How agents' sandboxes are built on this host.
fn sandbox_profile(config: &Config, host: &Host, state: &StateDir, socket: &Path) -> Profile {
    let agents = &config.agents;
    let root = nix::unistd::geteuid().is_root();
    let log_dir = agents.log_dir();
    Profile {
        staging: state.staging.clone(),
        user: root.then_some(User {
            uid: agents.uid,
            gid: agents.gid,
        }),
        user_namespace: host.map_to.is_some(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    #[test]
    fn replies_to_tasks_stay_with_the_kernel_and_the_rest_keep_their_order() {
        let request = |seq| ReplyTo::Request {
            conn: ConnKey {
                index: 0,
                serial: 7,
            },
            seq,
        };
        let json = |text: &[u8]| Answer::Json(text.to_vec());
        let mut replies = vec![
            (request(1), json(b"a")),
            (ReplyTo::Task(3), json(b"b")),
            (request(2), json(b"c")),
            (ReplyTo::Task(3), json(b"d")),
        ];
        let tasks = keep_task_replies(&mut replies);
        assert_eq!(
            replies,
            vec![(request(1), json(b"a")), (request(2), json(b"c"))]
        );
        assert_eq!(tasks, vec![(3, json(b"b")), (3, json(b"d"))]);
    }
}
