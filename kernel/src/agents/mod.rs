//! Agents: isolated processes the kernel starts, watches, restarts and
//! stops.
//!
//! This module is the agent table and its policy — who may spawn, kill and
//! list what, what a child may be given (`inheritance`), what runs
//! ([`program`]), and each agent's life (`lifecycle`). The sandboxes
//! agents run in belong to the sandbox runtime ([`crate::sandbox::runtime`]),
//! reached only through its [`Sandboxes`] seam: each incarnation of an agent
//! acquires a sandbox, claims it, and hears back through
//! [`SandboxEvent`](crate::sandbox::runtime::SandboxEvent)s.
//!
//! Life of an agent: `starting` → `running` (workload exec'd; the SPAWN
//! reply goes out) → it ends: `exited`, `killed` or `oom_killed` — or
//! `restarting` while a restart waits out its backoff — and `failed` when
//! it could not start or used up its restarts. Ended agents stay listed for
//! `agents.retention_secs`, then are forgotten.
//!
//! Everything here runs on the reactor thread and never blocks.

mod admission;
mod control;
mod counts;
mod inheritance;
mod interpreter;
mod lifecycle;
pub mod log_reader;
pub mod network;
pub mod program;
mod record;
pub mod restart;
#[cfg(test)]
mod tests;
mod usage;
mod views;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{
    AgentRef, AgentState, Isolation, KillRequest, Limits, Permissions, SpawnRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::{Reply, ReplyTo};
use crate::cgroup::CgroupLimits;
use crate::config::Config;
use crate::network::{Egress, Gateway};
use crate::permissions::Budget;
use crate::sandbox::plan::{Shape, SOCKET_INSIDE};
use crate::sandbox::runtime::Sandboxes;
use crate::sandbox::spec::Bind;
use crate::sandbox::view::View;
use crate::sandbox::Namespaces;
use crate::timers::Timers;
pub use counts::{AgentCounts, CpuTotals};
pub use inheritance::Grant;
use interpreter::SdkCheck;
use program::{Lookup, Program};
pub use record::Restarted;
use record::{Agent, SpawnWaiter, StopReason, WorkloadReport};
use restart::Restarts;

/// One incarnation of an agent (it has one more each time it restarts):
/// what owns a sandbox. An incarnation's events carry its number, so events
/// of an earlier one are recognised as stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incarnation {
    /// The agent.
    pub agent: u32,
    /// Which of its incarnations.
    pub number: u32,
}

#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// SIGKILL an incarnation that SIGTERM did not end.
    Escalate(Incarnation),
    /// Start the next incarnation after its backoff.
    Restart(Incarnation),
    /// Drop an ended agent from the table.
    Forget { id: u32 },
}

/// A `[[agents.boot]]` entry SPAWN would refuse.
#[derive(Debug, thiserror::Error)]
#[error("agents.boot[{index}] ({name:?}): {reason}")]
pub struct BadBootEntry {
    /// Its place in the list.
    pub index: usize,
    /// The agent's name.
    pub name: String,
    /// Why SPAWN would refuse it.
    pub reason: String,
}

/// What an agent may ask of the kernel (see [`Agents::grant`]).
#[derive(Clone, Copy, Debug)]
pub struct AgentGrant<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its permissions.
    pub permissions: &'a Permissions,
    /// Its limits in force.
    pub limits: Limits,
    /// What it may reach.
    pub network: &'a Egress,
    /// The token budgets it draws on.
    pub budgets: &'a [Budget],
}

/// Whose view of the agents table a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Viewer {
    /// An operator: every agent.
    Operator,
    /// An agent: itself and its descendants.
    Agent(u32),
    /// An EXEC run: the agents it started, and their descendants.
    Run(u64),
}

/// Who asks for a SPAWN, and so what the child may be given.
#[derive(Debug)]
pub enum Spawner {
    /// An operator: what the request asks, paths on the host.
    Operator,
    /// An agent (whose permissions allow it): never more than it has, paths
    /// in its own view.
    Agent(u32),
    /// An EXEC run (whose permissions allow it): never more than the run
    /// was given. The child joins the tree of the agent the run is of (if
    /// an agent's), its paths are looked up in what runs see, and it ends
    /// when the run does.
    Run(Box<RunSpawner>),
}

/// An EXEC run that spawns, and what its child may be given.
#[derive(Debug)]
pub struct RunSpawner {
    /// The run's number.
    pub number: u64,
    /// The agent whose tree the child joins, if the run is an agent's.
    pub parent: Option<u32>,
    /// What the run was given.
    pub grant: Grant,
    /// The token budgets the run draws on.
    pub budgets: Vec<Budget>,
    /// What the run sees of the filesystem.
    pub view: Option<View>,
    /// The interpreter a script runs with when the request names none.
    pub python: PathBuf,
}

/// The agents table and everything that keeps it current.
#[derive(Debug)]
pub struct Agents {
    table: BTreeMap<u32, Agent>,
    next_id: u32,
    deadlines: Timers<Deadline>,
    log_dir: PathBuf,
    python: PathBuf,
    /// Whether interpreters can import the SDK, remembered.
    sdk_check: SdkCheck,
    defaults: Limits,
    retention: Duration,
    stop_grace: Duration,
    max_agents: usize,
    shutting_down: bool,
    /// Agents whose incarnation has ended or is being stopped since the last
    /// [`Agents::take_ended`]: the work they started ends with it.
    ended: Vec<u32>,
    /// The egress proxy, for agents with a network policy.
    gateway: Arc<Gateway>,
    /// What the metrics count of agents.
    pub counts: AgentCounts,
    /// The last agent whose cgroup the metrics sampled (see `usage.rs`).
    sample_cursor: u32,
}

impl Agents {
    /// The agents table for `config`; creates the log directory.
    pub fn new(config: &Config, gateway: Arc<Gateway>) -> io::Result<Agents> {
        let log_dir = config.agents.log_dir();
        std::fs::create_dir_all(&log_dir).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cannot create the agent log directory {}: {err}",
                    log_dir.display()
                ),
            )
        })?;
        let agents = &config.agents;
        Ok(Agents {
            table: BTreeMap::new(),
            next_id: 1,
            deadlines: Timers::default(),
            log_dir,
            python: agents.python(),
            sdk_check: SdkCheck::default(),
            defaults: default_limits(config),
            retention: Duration::from_secs(agents.retention_secs),
            stop_grace: Duration::from_millis(agents.stop_grace_ms),
            max_agents: agents.max_agents,
            shutting_down: false,
            ended: Vec::new(),
            gateway,
            counts: AgentCounts::default(),
            sample_cursor: 0,
        })
    }

    /// An agent's name, what it may ask of the kernel, and the token
    /// budgets it draws on.
    pub fn grant(&self, id: u32) -> Option<AgentGrant<'_>> {
        self.table.get(&id).map(|agent| AgentGrant {
            name: &agent.name,
            permissions: &agent.permissions,
            limits: agent.limits,
            network: &agent.egress,
            budgets: &agent.budgets,
        })
    }

    /// The sandbox of agent `id`'s current incarnation, if it has one.
    pub fn sandbox_of(&self, id: u32) -> Option<crate::sandbox::runtime::SandboxKey> {
        self.table.get(&id).and_then(|agent| agent.sandbox)
    }

    /// Whether an agent's incarnation has ended, or it is being stopped,
    /// since the
    /// last [`take_ended`](Self::take_ended).
    pub fn has_ended(&self) -> bool {
        !self.ended.is_empty()
    }

    /// Agents whose incarnation has ended or is being stopped since the last
    /// call:
    /// the work they started — EXEC runs, sessions, tasks — ends with it.
    pub fn take_ended(&mut self) -> Vec<u32> {
        let mut ended = std::mem::take(&mut self.ended);
        ended.sort_unstable();
        ended.dedup();
        ended
    }

    /// Stops the live agents EXEC run `number` started, and everything
    /// they started in turn: they end with the run.
    pub fn stop_started_by(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        number: u64,
    ) {
        let doomed: Vec<u32> = self
            .table
            .values()
            .filter(|a| a.is_live() && self.sees(Viewer::Run(number), a.id))
            .map(|a| a.id)
            .collect();
        let now = Instant::now();
        for id in doomed {
            log::info!("agent {id}: stopped, as the EXEC run that started it has ended");
            self.stop(
                sandboxes,
                replies,
                id,
                StopReason::Kill,
                Duration::ZERO,
                now,
            );
        }
    }

    /// SPAWN: starts an agent. `Ok` means the reply will go to `reply_to`
    /// once the workload runs (or fails to start). For an agent's SPAWN
    /// (whose caller may spawn: see `syscall::spawn`), `tokens_left` is
    /// what its token budgets still allow.
    pub fn spawn(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        spawner: Spawner,
        request: SpawnRequest,
        tokens_left: Option<u64>,
        reply_to: ReplyTo,
    ) -> Result<u32, ErrorReply> {
        let waiter = SpawnWaiter {
            reply_to,
            by_agent: !matches!(spawner, Spawner::Operator),
            warnings: Vec::new(),
        };
        self.admit(sandboxes, spawner, request, tokens_left, Some(waiter))
    }

    /// Starts a boot agent (`[[agents.boot]]`), as the operator would;
    /// returns its id. LIST marks it `boot: true`.
    pub fn spawn_boot(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        request: SpawnRequest,
    ) -> Result<u32, ErrorReply> {
        let id = self.admit(sandboxes, Spawner::Operator, request, None, None)?;
        if let Some(agent) = self.table.get_mut(&id) {
            agent.boot = true;
        }
        Ok(id)
    }

    /// Checks every `[[agents.boot]]` entry as SPAWN would (its program
    /// found, its environment allowed) without starting anything: a bad
    /// entry stops the kernel before it starts, naming the entry.
    pub fn check_boot(config: &Config) -> Result<(), BadBootEntry> {
        for (index, request) in config.agents.boot.iter().enumerate() {
            program::resolve(request, &config.agents.python(), Lookup::Host)
                .and_then(|_| program::check_env(request))
                .map_err(|refused| BadBootEntry {
                    index,
                    name: request.name.clone(),
                    reason: refused.error,
                })?;
        }
        Ok(())
    }

    /// The agent at the top of `id`'s family: the eldest ancestor it had
    /// when it was spawned (itself, if none). Kept with the agent, so a
    /// family stays one however its middle generations come and go.
    pub fn root_of(&self, id: u32) -> u32 {
        self.table.get(&id).map_or(id, |agent| agent.root)
    }

    /// The live agent named `name`, if any: its id and whether it is a
    /// boot agent.
    pub fn live_named(&self, name: &str) -> Option<(u32, bool)> {
        self.table
            .values()
            .find(|a| a.is_live() && a.name == name)
            .map(|a| (a.id, a.boot))
    }

    /// Admits and starts an agent; `waiter` hears when its first incarnation
    /// starts.
    fn admit(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        spawner: Spawner,
        request: SpawnRequest,
        tokens_left: Option<u64>,
        mut waiter: Option<SpawnWaiter>,
    ) -> Result<u32, ErrorReply> {
        self.refuse_if_shutting_down()?;
        let (parent, started_by) = match &spawner {
            Spawner::Operator => (None, None),
            // An agent a run's agent spawns is the run's too: it ends with
            // the run, even once the agent between them is forgotten.
            Spawner::Agent(parent) => (
                Some(*parent),
                self.table.get(parent).and_then(|p| p.started_by),
            ),
            Spawner::Run(run) => (run.parent, Some(run.number)),
        };
        let (grant, program, inherited) = match spawner {
            Spawner::Operator => {
                let program = program::resolve(&request, &self.python, Lookup::Host)?;
                let grant = Grant {
                    network: inheritance::child_network(
                        &Egress::Host,
                        &request,
                        self.gateway.default_policy(),
                    )?,
                    limits: self.effective_limits(&request.limits),
                    permissions: request.permissions.or(Permissions::default()),
                };
                (grant, program, Vec::new())
            }
            Spawner::Agent(parent_id) => {
                self.child_of(sandboxes, parent_id, &request, tokens_left)?
            }
            Spawner::Run(run) => {
                let child = inheritance::child_grant(
                    &run.grant,
                    &request,
                    tokens_left,
                    self.gateway.default_policy(),
                )?;
                let lookup = run.view.as_ref().map_or(Lookup::Host, Lookup::View);
                let program = program::resolve(&request, &run.python, lookup)?;
                (child, program, run.budgets)
            }
        };
        program::check_env(&request)?;
        self.check_room_for(&request.name)?;
        self.check_egress(sandboxes, &request, &grant.network)?;

        let id = self.next_id;
        let door = Self::open_door(sandboxes, id)?;
        self.next_id += 1;
        let isolation = isolation(sandboxes, &request, &grant.network);
        let log = self.log_dir.join(format!("{}-{id}.log", request.name));
        set_aside_earlier_log(&log);
        log::info!(
            "agent {id} ({}) spawning: {} (log {})",
            request.name,
            program.argv.join(" "),
            log.display()
        );
        let warnings = self
            .sdk_check
            .warnings(program.interpreter_on_host.as_deref());
        for warning in &warnings {
            log::warn!("agent {id} ({}): {warning}", request.name);
        }
        if let Some(waiter) = waiter.as_mut() {
            waiter.warnings = warnings;
        }
        let own_budget = (grant.permissions.llm_tokens > 0).then_some(Budget {
            owner: id,
            tokens: grant.permissions.llm_tokens,
        });
        let now = Instant::now();
        self.table.insert(
            id,
            Agent {
                id,
                name: request.name.clone(),
                parent,
                started_by,
                root: parent.map_or(id, |p| self.root_of(p)),
                restarts: Restarts::new(
                    request.restart_policy,
                    request.max_restarts,
                    Duration::from_secs(request.restart_window),
                ),
                request,
                egress: grant.network,
                endpoint: None,
                net_record: None,
                program,
                limits: grant.limits,
                permissions: grant.permissions,
                budgets: own_budget.into_iter().chain(inherited).collect(),
                isolation,
                state: AgentState::Starting,
                incarnation: 0,
                sandbox: None,
                pid: None,
                workload: WorkloadReport::default(),
                oom_killed: false,
                started_at: SystemTime::now(),
                started: now,
                ended: None,
                stop: None,
                spawn_reply: waiter,
                door: Some(door),
                log,
                last_run: Default::default(),
                sampled: Default::default(),
                boot: false,
            },
        );
        self.start_incarnation(sandboxes, id, now);
        Ok(id)
    }

    /// Whether a policy can be served to what `request` asks for: only in
    /// a sandbox of its own network, and only while the proxy runs.
    fn check_egress(
        &self,
        sandboxes: &impl Sandboxes<Incarnation>,
        request: &SpawnRequest,
        egress: &Egress,
    ) -> Result<(), ErrorReply> {
        if egress.policy().is_none() {
            return Ok(());
        }
        if !shape_of(sandboxes, request.sandboxed, egress).sandboxed {
            let why = if request.sandboxed {
                "this host gives no namespaces, so there is no network of its own to confine"
            } else {
                "a policy confines a sandbox's network; an unsandboxed agent has the host's"
            };
            return Err(ErrorReply::new(
                if request.sandboxed {
                    ErrorCode::Unavailable
                } else {
                    ErrorCode::BadRequest
                },
                format!("SPAWN field `network`: {why}"),
            ));
        }
        match self.gateway.unavailable() {
            Some(why) => Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("SPAWN field `network`: policies cannot be served: {why}"),
            )),
            None => Ok(()),
        }
    }

    /// What agent `parent_id` may give the child `request` asks for: its
    /// grant (never more than the parent's), its program (paths looked up
    /// in the parent's own view), and the token budgets it inherits.
    fn child_of(
        &self,
        sandboxes: &impl Sandboxes<Incarnation>,
        parent_id: u32,
        request: &SpawnRequest,
        tokens_left: Option<u64>,
    ) -> Result<(Grant, Program, Vec<Budget>), ErrorReply> {
        let parent = self
            .table
            .get(&parent_id)
            .ok_or_else(|| ErrorReply::new(ErrorCode::PermissionDenied, "unknown calling agent"))?;
        let grant = inheritance::child_grant(
            &parent.grant(),
            request,
            tokens_left,
            self.gateway.default_policy(),
        )?;
        // A script's interpreter defaults to the one the parent runs with,
        // which its own view is sure to hold.
        let python = parent
            .program
            .interpreter
            .as_deref()
            .unwrap_or(&self.python);
        let view = view_of(sandboxes, parent);
        let lookup = view.as_ref().map_or(Lookup::Host, Lookup::View);
        let program = program::resolve(request, python, lookup)?;
        Ok((grant, program, parent.budgets.clone()))
    }

    /// KILL: stops a live agent (SIGTERM to its whole tree, SIGKILL after
    /// `grace_ms`). Returns its id.
    pub fn kill(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        caller: Viewer,
        request: &KillRequest,
    ) -> Result<u32, ErrorReply> {
        let target = request.target()?;
        let id = self
            .table
            .values()
            .find(|a| {
                a.is_live()
                    && match &target {
                        AgentRef::Id(id) => a.id == *id,
                        AgentRef::Name(name) => &a.name == name,
                    }
            })
            .map(|a| a.id)
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    match &target {
                        AgentRef::Id(id) => format!("no live agent with id {id}"),
                        AgentRef::Name(name) => format!("no live agent named {name:?}"),
                    },
                )
            })?;
        if !self.may_stop(caller, id) {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                match caller {
                    Viewer::Run(_) => "an EXEC run may only kill agents it spawned itself",
                    _ => {
                        "agents may only kill agents they spawned (directly or through their \
                         children)"
                    }
                },
            ));
        }
        log::info!("agent {id}: KILL (grace {} ms)", request.grace_ms());
        let grace = Duration::from_millis(request.grace_ms());
        self.stop(
            sandboxes,
            replies,
            id,
            StopReason::Kill,
            grace,
            Instant::now(),
        );
        Ok(id)
    }

    fn effective_limits(&self, asked: &Limits) -> Limits {
        Limits {
            memory: asked.memory.or(self.defaults.memory),
            cpu_quota: asked.cpu_quota.or(if asked.cpu_period.is_some() {
                None
            } else {
                self.defaults.cpu_quota
            }),
            cpu_period: asked.cpu_period.or(self.defaults.cpu_period),
            max_pids: asked.max_pids.or(self.defaults.max_pids),
        }
    }
}

/// Ids start again at 1 with each kernel, so a new agent's log path may
/// hold the log of an earlier kernel's agent of the same name and id. It
/// is kept beside it as `<name>-<id>.log.prev` for the operator, out of
/// LOGS' reach: what a new agent, or its parent, reads is its own.
fn set_aside_earlier_log(log: &std::path::Path) {
    let mut earlier = log.as_os_str().to_owned();
    earlier.push(".prev");
    match std::fs::rename(log, &earlier) {
        Ok(()) => log::debug!("an earlier agent's log moved to {earlier:?}"),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            log::warn!(
                "cannot move aside the earlier log {}: {err}; removing it",
                log.display()
            );
            let _ = std::fs::remove_file(log);
        }
    }
}

/// Where an agent's log is, and whether more may come.
#[derive(Clone, Debug)]
pub struct AgentLog {
    /// The agent's id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its log file.
    pub path: PathBuf,
    /// Its state now.
    pub state: AgentState,
    /// Whether it may still write.
    pub live: bool,
}

/// The limits an agent gets for what its SPAWN leaves out.
pub fn default_limits(config: &Config) -> Limits {
    let agents = &config.agents;
    Limits {
        memory: Some(agents.default_memory),
        cpu_quota: (agents.default_cpu_quota > 0).then_some(agents.default_cpu_quota),
        cpu_period: Some(agents.default_cpu_period),
        max_pids: Some(agents.default_max_pids),
    }
}

/// The cgroup limits for an agent's limits.
pub fn cgroup_limits(limits: &Limits) -> CgroupLimits {
    CgroupLimits {
        memory: limits.memory.unwrap_or(u64::MAX),
        cpu_quota: limits.cpu_quota,
        cpu_period: limits.cpu_period.unwrap_or(100_000),
        max_pids: limits.max_pids.unwrap_or(u64::MAX),
    }
}

/// The sandbox shape an agent needs on this host: sandboxed if it asked
/// to be (and can be), sharing the host's network if its egress is that.
fn shape_of(sandboxes: &impl Sandboxes<Incarnation>, sandboxed: bool, egress: &Egress) -> Shape {
    let sandboxed = sandboxed && sandboxes.machine().has_namespaces();
    Shape {
        sandboxed,
        // Outside a sandbox there is only the host's network.
        network: *egress == Egress::Host && sandboxed,
        nested: false,
    }
}

impl Agent {
    /// The sandbox shape its incarnations get.
    fn shape(&self, sandboxes: &impl Sandboxes<Incarnation>) -> Shape {
        shape_of(sandboxes, self.request.sandboxed, &self.egress)
    }
}

/// What a sandboxed agent sees of the filesystem (`None`: it is not
/// sandboxed, so it sees the host).
fn view_of(sandboxes: &impl Sandboxes<Incarnation>, agent: &Agent) -> Option<View> {
    let mut binds = agent.program.binds.clone();
    if let Some(door) = agent.door.and_then(|door| sandboxes.door_path(door)) {
        binds.push(Bind {
            source: door.to_path_buf(),
            target: SOCKET_INSIDE.into(),
            writable: true,
        });
    }
    sandboxes.view(agent.shape(sandboxes), &binds)
}

/// The isolation a request gets on this host, and why it is less than
/// asked, if it is.
fn isolation(
    sandboxes: &impl Sandboxes<Incarnation>,
    request: &SpawnRequest,
    egress: &Egress,
) -> Isolation {
    let machine = sandboxes.machine();
    let shape = shape_of(sandboxes, request.sandboxed, egress);
    let mut missing = Vec::new();
    if request.sandboxed {
        if let Some(reason) = &machine.no_namespaces {
            missing.push(format!("no namespaces: {reason}"));
        }
        if let Some(reason) = &machine.no_cgroups {
            missing.push(format!("no cgroup limits: {reason}"));
        }
    }
    let namespaces = Namespaces {
        pid: shape.sandboxed,
        net: shape.sandboxed && !shape.network,
        mount: shape.sandboxed,
        uts: shape.sandboxed,
        ipc: shape.sandboxed,
        user: shape.sandboxed && machine.map_to.is_some(),
    };
    Isolation {
        sandboxed: shape.sandboxed,
        namespaces: namespaces.names(),
        cgroup: if shape.sandboxed {
            machine.cgroup_version()
        } else {
            None
        },
        degraded_reason: (!missing.is_empty()).then(|| missing.join("; ")),
    }
}
