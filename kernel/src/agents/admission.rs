//! What must hold before an agent runs, whether SPAWN starts it or a
//! restart starts an ended one again — the kernel is not shutting down,
//! there is room, its name is not a live agent's, and it has a socket —
//! and, for SPAWN, what the new agent is given: its program, its grant
//! (never more than its spawner has), its budgets and its log.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_egress::{Egress, Gateway};
use agentos_proto::payload::{AgentState, Limits, Permissions, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::inheritance::{self, Grant};
use super::interpreter::SdkCheck;
use super::isolation::{isolation_of, shape_of, view_of};
use super::program::{self, Lookup, Program};
use super::record::{Agent, Incarnation, SpawnWaiter, WorkloadReport};
use super::restart::Restarts;
use super::table::Table;
use crate::config::Config;
use crate::identity::Identity;
use crate::permissions::Budget;
use crate::sandbox::runtime::{DoorKey, Sandboxes};
use crate::sandbox::view::View;

/// Who asks for a SPAWN, and so what the child may be given.
#[derive(Debug)]
pub enum Spawner {
    /// An operator, by uid: what the request asks, paths on the host.
    Operator(u32),
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
    /// The operator whose run it is, if the run is an operator's.
    pub operator: Option<u32>,
    /// What the run was given.
    pub grant: Grant,
    /// The token budgets the run draws on.
    pub budgets: Vec<Budget>,
    /// What the run sees of the filesystem.
    pub view: Option<View>,
    /// The interpreter a script runs with when the request names none.
    pub python: PathBuf,
}

/// What admitting agents needs: where their logs go, what they run with
/// unless they say otherwise, and how many may run.
#[derive(Debug)]
pub struct Admission {
    log_dir: PathBuf,
    python: PathBuf,
    /// Whether interpreters can import the SDK, remembered.
    sdk_check: SdkCheck,
    /// The limits an agent gets for what its SPAWN leaves out.
    defaults: Limits,
    max_agents: usize,
    /// The egress proxy, for agents with a network policy.
    gateway: Arc<Gateway>,
}

impl Admission {
    /// Admission as `config` says; creates the log directory.
    pub fn new(config: &Config, gateway: Arc<Gateway>) -> io::Result<Admission> {
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
        Ok(Admission {
            log_dir,
            python: config.agents.python(),
            sdk_check: SdkCheck::default(),
            defaults: default_limits(config),
            max_agents: config.agents.max_agents,
            gateway,
        })
    }

    /// The record of the agent `spawner` asks for with `request`, the next
    /// of `table`, with its socket open; `waiter` hears when its first
    /// incarnation starts. For an agent's SPAWN, `tokens_left` is what its
    /// token budgets still allow.
    pub fn admit(
        &mut self,
        table: &Table,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        spawner: Spawner,
        request: SpawnRequest,
        tokens_left: Option<u64>,
        mut waiter: Option<SpawnWaiter>,
    ) -> Result<Agent, ErrorReply> {
        let owner_uid = owner_uid(table, &spawner);
        let (parent, started_by) = match &spawner {
            Spawner::Operator(_) => (None, None),
            // An agent a run's agent spawns is the run's too: it ends with
            // the run, even once the agent between them is forgotten.
            Spawner::Agent(parent) => {
                (Some(*parent), table.get(*parent).and_then(|p| p.started_by))
            }
            Spawner::Run(run) => (run.parent, Some(run.number)),
        };
        let (grant, program, inherited) = match spawner {
            Spawner::Operator(_) => {
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
                self.child_of(table, sandboxes, parent_id, &request, tokens_left)?
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
        self.check_room(table, &request.name)?;
        self.check_egress(sandboxes, &request, &grant.network)?;

        let id = table.next_id();
        let door = open_door(sandboxes, id)?;
        let isolation = isolation_of(sandboxes, &request, &grant.network);
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
        Ok(Agent {
            id,
            name: request.name.clone(),
            parent,
            started_by,
            root: parent.map_or(id, |p| table.root_of(p)),
            owner_uid,
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
            volumes: Vec::new(),
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
            started: Instant::now(),
            ended: None,
            stop: None,
            spawn_reply: waiter,
            door: Some(door),
            log,
            last_run: Default::default(),
            sampled: Default::default(),
            boot: false,
        })
    }

    /// Room in `table` for one more live agent, and `name` free among the
    /// live ones.
    pub fn check_room(&self, table: &Table, name: &str) -> Result<(), ErrorReply> {
        let live = table.values().filter(|a| a.is_live()).count();
        if live >= self.max_agents {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("{live} agents are running, the configured maximum; kill one first"),
            ));
        }
        if let Some(existing) = table.live_named(name) {
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!(
                    "agent {name:?} already exists (id {}, {}); kill it or choose another name",
                    existing.id,
                    existing.state.as_str()
                ),
            ));
        }
        Ok(())
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
        table: &Table,
        sandboxes: &impl Sandboxes<Incarnation>,
        parent_id: u32,
        request: &SpawnRequest,
        tokens_left: Option<u64>,
    ) -> Result<(Grant, Program, Vec<Budget>), ErrorReply> {
        let parent = table
            .get(parent_id)
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
        let view = view_of(
            sandboxes,
            parent.shape(sandboxes),
            &parent.program.binds,
            parent.door,
        );
        let lookup = view.as_ref().map_or(Lookup::Host, Lookup::View);
        let program = program::resolve(request, python, lookup)?;
        Ok((grant, program, parent.budgets.clone()))
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

/// The refusal of new work once shutdown has begun.
pub fn shutting_down() -> ErrorReply {
    ErrorReply::new(ErrorCode::Unavailable, "the kernel is shutting down")
}

/// Agent `id`'s own socket: what it, and its children, connect to.
pub fn open_door(
    sandboxes: &mut impl Sandboxes<Incarnation>,
    id: u32,
) -> Result<DoorKey, ErrorReply> {
    sandboxes
        .open_door(&id.to_string(), Identity::Agent { id })
        .map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot create the agent's socket: {err}"),
            )
        })
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

/// Ids start again at 1 with each kernel, so a new agent's log path may
/// hold the log of an earlier kernel's agent of the same name and id. It
/// is kept beside it as `<name>-<id>.log.prev` for the operator, out of
/// LOGS' reach: what a new agent, or its parent, reads is its own.
fn set_aside_earlier_log(log: &Path) {
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

/// The uid of the operator whose tree an agent `spawner` starts joins:
/// the spawning operator's, or its parent's (whose tree it joins).
fn owner_uid(table: &Table, spawner: &Spawner) -> u32 {
    let parents = |parent: Option<u32>| parent.and_then(|p| table.get(p)).map(|p| p.owner_uid);
    match spawner {
        Spawner::Operator(uid) => *uid,
        Spawner::Agent(parent) => parents(Some(*parent)).unwrap_or(NO_OWNER),
        Spawner::Run(run) => parents(run.parent).or(run.operator).unwrap_or(NO_OWNER),
    }
}

/// The owner of an agent whose parent the table has forgotten: no
/// operator's (`(uid_t)-1` is never a user's), so it reaches no
/// operator's tree.
const NO_OWNER: u32 = u32::MAX;
