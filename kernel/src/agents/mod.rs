//! Agents: isolated processes the kernel starts, watches, restarts and
//! stops.
//!
//! Everything here runs on the reactor thread and never blocks. Sandboxes
//! are prepared on the launch thread ([`launching`]) — ahead of time for
//! the warm pool, or on demand — and each run of an agent *claims* one: it
//! sends the sandbox what to run and the log to write, renames the
//! sandbox's cgroup after the agent and sets the agent's limits on it.
//! Claiming a warm sandbox costs a few small writes, so SPAWN of a default
//! agent does not wait for namespaces, a root filesystem or a cgroup
//! migration.
//!
//! Everything that happens afterwards arrives as an event — the sandbox's
//! pidfd (exit), its status pipe (started, failed, how the workload ended),
//! its cgroup's OOM watch, the agent's own socket ([`door`]) — or as a
//! deadline (escalate a KILL to SIGKILL, restart after backoff, forget an
//! ended agent, refill the pool).
//!
//! A SPAWN made by an agent gives the child no more than the agent has
//! ([`inheritance`]), and its paths are looked up in the agent's own view
//! of the filesystem ([`program`]).
//!
//! Life of an agent: `starting` → `running` (workload exec'd; the SPAWN
//! reply goes out) → it ends: `exited`, `killed` or `oom_killed` — or
//! `restarting` while a restart waits out its backoff — and `failed` when
//! it could not start or used up its restarts. Ended agents stay listed for
//! `agents.retention_secs`, then are forgotten.

pub mod door;
mod inheritance;
mod launching;
pub mod program;
mod record;
pub mod restart;
mod sandboxes;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{
    AgentInfo, AgentRef, AgentState, CgroupVersion, Isolation, KillRequest, Limits, Permissions,
    SpawnReply, SpawnRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::event::Event;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token, Waker};
use slab::Slab;

use crate::cgroup::{AgentCgroup, CgroupLimits, CgroupStats, Cgroups};
use crate::config::Config;
use crate::identity::{peer_cred, peer_pid_namespaces, Identity};
use crate::llm::Budget;
use crate::reactor::ReplyTo;
use crate::sandbox::confine::Confinement;
use crate::sandbox::plan::{self, Profile, Shape, Workload, SOCKET_INSIDE, WORKSPACE};
use crate::sandbox::spec::{Bind, Rlimits};
use crate::sandbox::view::{View, Viewer};
use crate::sandbox::{Launcher, Namespaces, SandboxSpec, Status, User};
use crate::syscall::Io;
use crate::timers::Timers;
use door::Door;
use inheritance::Grant;
use launching::{LaunchDone, LaunchJob, LaunchThread};
use program::{Lookup, Program};
use record::{Agent, Outcome, SpawnWaiter, Stop};
use restart::{Decision, Restarts, RunEnd};
use sandboxes::{pid_namespace_of, wait_pidfd, InitEnd, Sandbox};

/// Tokens in this range belong to the agents table.
pub const TOKEN_BASE: usize = 1 << 40;
const TOKEN_END: usize = 1 << 48;

/// Between the cgroup's last process exiting and the cgroup being
/// removable there can be a moment; retry this often, this many times.
const CGROUP_RETRY: Duration = Duration::from_millis(50);
const CGROUP_RETRIES: u32 = 100;
/// After a warm sandbox fails, wait this long before preparing another.
const POOL_RETRY: Duration = Duration::from_secs(1);
/// After a claim, wait this long before preparing its replacement: on a
/// small machine, preparing a sandbox competes for the CPU with the
/// workload just started and with the SPAWN reply going out.
const POOL_REFILL_DELAY: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug)]
enum Source {
    /// An agent's own socket.
    Door(u32),
    /// A sandbox's pidfd.
    Exit(usize),
    /// A sandbox's status pipe.
    Status(usize),
    /// An agent's OOM watch.
    Oom(u32),
}

#[derive(Clone, Copy, Debug)]
enum Deadline {
    /// SIGKILL a run that SIGTERM did not end.
    Escalate { id: u32, run: u32 },
    /// Start the next run after its backoff.
    Restart { id: u32, run: u32 },
    /// Drop an ended agent from the table.
    Forget { id: u32 },
    /// Try again to remove the cgroups of ended runs.
    SweepCgroups,
    /// Prepare warm sandboxes (after a claim, or again after a failure).
    RefillPool,
}

/// Who a launch is for.
#[derive(Clone, Copy, Debug)]
enum LaunchFor {
    /// The warm pool.
    Pool,
    /// This run of this agent.
    Agent { id: u32, run: u32 },
}

/// What an agent may ask of the kernel (see [`Agents::grant`]).
#[derive(Clone, Copy, Debug)]
pub struct AgentGrant<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its permissions.
    pub permissions: Permissions,
    /// The token budgets it draws on.
    pub budgets: &'a [Budget],
}

/// The agents table and everything that keeps it current.
#[derive(Debug)]
pub struct Agents {
    table: BTreeMap<u32, Agent>,
    next_id: u32,
    sandboxes: Slab<Sandbox>,
    /// Parked sandboxes of the default shape, oldest first.
    pool: Vec<usize>,
    pool_size: usize,
    /// Runs waiting for a sandbox of the default shape, oldest first: each
    /// takes the next one that comes back from the launch thread, whether
    /// launched for it or for the pool.
    waiting: VecDeque<(u32, u32)>,
    pool_retry_pending: bool,
    launches: LaunchThread,
    pending_launches: HashMap<u64, LaunchFor>,
    next_launch: u64,
    sources: Slab<Source>,
    deadlines: Timers<Deadline>,
    /// cgroups of ended runs, removed as soon as they are empty.
    dying: Dying,
    cgroups: Option<Arc<Cgroups>>,
    /// Why there are no cgroups, when there are none.
    no_cgroups: Option<String>,
    profile: Profile,
    /// The spec of each sandbox shape, built once at start: the profile
    /// never changes, and building it probes the host's system directories.
    shapes: HashMap<Shape, SandboxSpec>,
    /// Whose permissions a sandboxed workload has on the host's files.
    viewer: Viewer,
    /// How the workload's user is mapped when the daemon is not root.
    map_to: Option<(u32, u32)>,
    /// Why sandboxes cannot have namespaces at all, when they cannot.
    no_namespaces: Option<String>,
    doors: PathBuf,
    log_dir: PathBuf,
    python: PathBuf,
    defaults: Limits,
    retention: Duration,
    stop_grace: Duration,
    max_agents: usize,
    shutting_down: bool,
}

impl Agents {
    /// Sets up agent support: cgroups, the state directory beside the
    /// kernel socket (`<socket>.d`: agent sockets and the sandbox roots'
    /// staging directory, cleared of whatever an earlier kernel left), the
    /// log directory, the launch thread, and the first warm sandboxes.
    /// Finished launches wake the reactor through `waker` (mio allows one
    /// waker per poll).
    pub fn new(config: &Config, waker: Arc<Waker>, socket: &Path) -> io::Result<Agents> {
        let (cgroups, no_cgroups) = match Cgroups::detect() {
            Ok(cgroups) => match cgroups.start() {
                Ok(()) => (Some(Arc::new(cgroups)), None),
                Err(err) => (None, Some(format!("cgroups could not be set up: {err}"))),
            },
            Err(reason) => (None, Some(reason.to_string())),
        };
        match (&cgroups, &no_cgroups) {
            (Some(c), _) => {
                log::info!("agent limits enforced with cgroup {}", c.version().as_str())
            }
            (None, Some(reason)) => log::warn!("{reason}"),
            _ => {}
        }
        let root = nix::unistd::geteuid().is_root();
        let (no_namespaces, map_to) = if root {
            (None, None)
        } else {
            match probe_user_namespaces() {
                Ok(()) => (
                    None,
                    Some((
                        nix::unistd::geteuid().as_raw(),
                        nix::unistd::getegid().as_raw(),
                    )),
                ),
                Err(reason) => (Some(reason), None),
            }
        };
        if let Some(reason) = &no_namespaces {
            log::warn!("{reason}");
        }
        // The socket is ours (its lock is held), and so is its state
        // directory: what a killed kernel left there is stale.
        let state = state_dir_of(socket);
        fresh_private_dir(&state)?;
        // Binds are made from paths with no symlink in them.
        let state = std::fs::canonicalize(&state)?;
        let doors = state.join("agents");
        let staging = state.join("sandbox-root");
        for dir in [&doors, &staging] {
            fresh_private_dir(dir)?;
        }
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
        let profile = Profile {
            staging,
            user: root.then_some(User {
                uid: agents.uid,
                gid: agents.gid,
            }),
            user_namespace: map_to.is_some(),
            tmp_size: agents.tmp_bytes,
            workspace_size: agents.workspace_bytes,
            rlimits: Rlimits {
                nofile: agents.nofile,
                fsize: agents.max_file_bytes,
            },
            log_cap: agents.log_bytes,
            extra_masks: kernel_files(config, socket, &state, &log_dir),
        };
        let launcher = Launcher::new(Path::new("/proc/self/exe"))?;
        let mut this = Agents {
            table: BTreeMap::new(),
            next_id: 1,
            sandboxes: Slab::new(),
            pool: Vec::new(),
            waiting: VecDeque::new(),
            // Without namespaces there is nothing worth preparing ahead.
            pool_size: if no_namespaces.is_some() {
                0
            } else {
                agents.warm_pool
            },
            pool_retry_pending: false,
            launches: LaunchThread::start(launcher, cgroups.clone(), waker)?,
            pending_launches: HashMap::new(),
            next_launch: 0,
            sources: Slab::new(),
            deadlines: Timers::default(),
            dying: Dying::default(),
            cgroups,
            no_cgroups,
            shapes: Shape::ALL
                .iter()
                .map(|shape| (*shape, plan::sandbox(&profile, *shape)))
                .collect(),
            viewer: match profile.user {
                Some(user) => Viewer {
                    uid: user.uid,
                    gid: user.gid,
                },
                None => Viewer {
                    uid: nix::unistd::geteuid().as_raw(),
                    gid: nix::unistd::getegid().as_raw(),
                },
            },
            profile,
            map_to,
            no_namespaces,
            doors,
            log_dir,
            python: agents.python.clone(),
            defaults: Limits {
                memory: Some(agents.default_memory),
                cpu_quota: (agents.default_cpu_quota > 0).then_some(agents.default_cpu_quota),
                cpu_period: Some(agents.default_cpu_period),
                max_pids: Some(agents.default_max_pids),
            },
            retention: Duration::from_secs(agents.retention_secs),
            stop_grace: Duration::from_millis(agents.stop_grace_ms),
            max_agents: agents.max_agents,
            shutting_down: false,
        };
        this.fill_pool();
        Ok(this)
    }

    /// How the kernel's own children are confined (`None`: this host gives
    /// the daemon no namespaces, so they run as the daemon does).
    pub fn confinement(&self) -> Option<Confinement> {
        if self.no_namespaces.is_some() {
            return None;
        }
        Confinement::for_kernel_children(&self.profile)
    }

    /// The cgroup version enforcing limits, if any.
    pub fn cgroup_version(&self) -> Option<CgroupVersion> {
        self.cgroups.as_ref().map(|c| c.version())
    }

    /// Whether a token is one of ours.
    pub fn owns(&self, token: Token) -> bool {
        (TOKEN_BASE..TOKEN_END).contains(&token.0)
    }

    /// An agent by id.
    pub fn get(&self, id: u32) -> Option<&Agent> {
        self.table.get(&id)
    }

    /// SPAWN: starts an agent. `Ok` means the reply will be delivered to
    /// `reply_to` once the workload runs (or fails to start). For an
    /// agent's SPAWN, `tokens_left` is what its token budgets still allow.
    pub fn spawn(
        &mut self,
        io: &mut Io<'_>,
        caller: Identity,
        request: SpawnRequest,
        tokens_left: Option<u64>,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        if self.shutting_down {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "the kernel is shutting down",
            ));
        }
        let parent = caller.agent();
        let (grant, program, inherited) = match parent {
            None => {
                let program = program::resolve(&request, &self.python, Lookup::Host)?;
                let grant = Grant {
                    network: request.network,
                    limits: self.effective_limits(&request.limits),
                    permissions: request.permissions.or(Permissions::default()),
                };
                (grant, program, Vec::new())
            }
            Some(parent_id) => self.child_of(parent_id, &request, tokens_left)?,
        };
        program::check_env(&request)?;
        let live = self.table.values().filter(|a| a.is_live()).count();
        if live >= self.max_agents {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("{live} agents are running, the configured maximum; kill one first"),
            ));
        }
        if let Some(existing) = self
            .table
            .values()
            .find(|a| a.is_live() && a.name == request.name)
        {
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!(
                    "agent {:?} already exists (id {}, {}); kill it or choose another name",
                    request.name,
                    existing.id,
                    existing.state.as_str()
                ),
            ));
        }

        let id = self.next_id;
        let door = Door::open(&self.doors, id).map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot create the agent's socket: {err}"),
            )
        })?;
        let door_token = self
            .register(io.registry, door.listener.as_raw_fd(), Source::Door(id))
            .map_err(|err| {
                ErrorReply::new(
                    ErrorCode::Internal,
                    format!("cannot watch the agent's socket: {err}"),
                )
            })?;
        self.next_id += 1;
        let isolation = self.isolation(&request);
        let log = self.log_dir.join(format!("{}-{id}.log", request.name));
        log::info!(
            "agent {id} ({}) spawning: {} (log {})",
            request.name,
            program.argv.join(" "),
            log.display()
        );
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
                restarts: Restarts::new(
                    request.restart_policy,
                    request.max_restarts,
                    Duration::from_secs(request.restart_window),
                ),
                request,
                program,
                limits: grant.limits,
                permissions: grant.permissions,
                budgets: own_budget.into_iter().chain(inherited).collect(),
                isolation,
                state: AgentState::Starting,
                run_number: 0,
                sandbox: None,
                pid: None,
                outcome: Outcome::default(),
                oom_killed: false,
                oom_baseline: 0,
                started_at: SystemTime::now(),
                started: now,
                ended: None,
                stop: None,
                spawn_reply: Some(SpawnWaiter {
                    reply_to,
                    by_agent: parent.is_some(),
                }),
                cgroup: None,
                oom_watch: None,
                door: Some((door, door_token)),
                pid_namespace: None,
                log,
                last_run: Default::default(),
            },
        );
        self.start_run(io, id, now);
        Ok(())
    }

    /// What agent `parent_id` may give the child `request` asks for: its
    /// grant (never more than the parent's), its program (paths looked up
    /// in the parent's own view), and the token budgets it inherits.
    fn child_of(
        &self,
        parent_id: u32,
        request: &SpawnRequest,
        tokens_left: Option<u64>,
    ) -> Result<(Grant, Program, Vec<Budget>), ErrorReply> {
        let parent = self
            .table
            .get(&parent_id)
            .ok_or_else(|| ErrorReply::new(ErrorCode::PermissionDenied, "unknown calling agent"))?;
        if !parent.permissions.spawn {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "agent {} may not spawn agents (its permissions.spawn is false)",
                    parent.name
                ),
            ));
        }
        if !request.sandboxed {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "SPAWN field `sandboxed`: agents may only spawn sandboxed agents",
            ));
        }
        let grant = inheritance::child_grant(&parent.grant(), request, tokens_left)?;
        // A script's interpreter defaults to the one the parent runs with,
        // which its own view is sure to hold.
        let python = parent
            .program
            .interpreter
            .as_deref()
            .unwrap_or(&self.python);
        let view = self.view_of(parent);
        let lookup = view.as_ref().map_or(Lookup::Host, Lookup::View);
        let program = program::resolve(request, python, lookup)?;
        Ok((grant, program, parent.budgets.clone()))
    }

    /// What a sandboxed agent sees of the filesystem (`None`: it is not
    /// sandboxed, so it sees the host).
    fn view_of(&self, agent: &Agent) -> Option<View> {
        let shape = self.shape_of(&agent.request);
        let root = self.shapes.get(&shape)?.root.as_ref()?;
        let mut binds = agent.program.binds.clone();
        if let Some((door, _)) = &agent.door {
            binds.push(Bind {
                source: door.path().to_path_buf(),
                target: SOCKET_INSIDE.into(),
                writable: true,
            });
        }
        Some(View::of(root, &binds, self.viewer))
    }

    /// Whether a process in these PID namespaces (its own first, then its
    /// ancestors) lives inside one of the kernel's sandboxes.
    pub fn is_inside_a_sandbox(&self, pid_namespaces: &[u64]) -> bool {
        self.sandboxes
            .iter()
            .filter_map(|(_, sandbox)| sandbox.pid_namespace)
            .any(|namespace| pid_namespaces.contains(&namespace))
    }

    /// KILL: stops a live agent (SIGTERM to its whole tree, SIGKILL after
    /// `grace_ms`). Returns its id.
    pub fn kill(
        &mut self,
        io: &mut Io<'_>,
        caller: Identity,
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
        if let Some(caller_id) = caller.agent() {
            if !self.is_descendant(id, caller_id) {
                return Err(ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    "agents may only kill agents they spawned (directly or through their children)",
                ));
            }
        }
        log::info!("agent {id}: KILL (grace {} ms)", request.grace_ms());
        let grace = Duration::from_millis(request.grace_ms());
        self.stop(io, id, Stop::Kill, grace, Instant::now());
        Ok(id)
    }

    /// An agent's name, what it may ask of the kernel, and the token
    /// budgets it draws on.
    pub fn grant(&self, id: u32) -> Option<AgentGrant<'_>> {
        self.table.get(&id).map(|agent| AgentGrant {
            name: &agent.name,
            permissions: agent.permissions,
            budgets: &agent.budgets,
        })
    }

    /// LIST: every agent, live or recently ended, for an operator; for an
    /// agent, itself and its descendants, with pids as it sees them: its
    /// own top process is PID 1 of its namespace, and its children's
    /// processes it cannot see at all.
    pub fn list(&self, caller: Identity, now: Instant) -> Vec<AgentInfo> {
        let Some(asker) = caller.agent() else {
            return self.table.values().map(|a| a.info(now)).collect();
        };
        let sandboxed = self
            .table
            .get(&asker)
            .is_some_and(|a| self.shape_of(&a.request).sandboxed);
        self.table
            .values()
            .filter(|a| a.id == asker || self.is_descendant(a.id, asker))
            .map(|a| {
                let mut info = a.info(now);
                if sandboxed {
                    info.pid = (a.id == asker && info.pid.is_some()).then_some(1);
                }
                info
            })
            .collect()
    }

    /// Takes in launches the launch thread has finished (after a wake-up).
    pub fn poll_launches(&mut self, io: &mut Io<'_>) {
        let now = Instant::now();
        let finished: Vec<LaunchDone> = self.launches.completed().collect();
        for done in finished {
            self.launched(io, done, now);
        }
    }

    /// Handles readiness of one of our tokens.
    pub fn on_event(&mut self, io: &mut Io<'_>, token: Token, _event: &Event) {
        let now = Instant::now();
        let Some(source) = self.sources.get(token.0 - TOKEN_BASE).copied() else {
            return;
        };
        match source {
            Source::Door(id) => self.knock(io, id),
            Source::Status(key) => self.read_status(io, key),
            Source::Exit(key) => self.sandbox_exited(io, key, now),
            Source::Oom(id) => self.oom_event(id),
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.deadlines.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(&mut self, io: &mut Io<'_>, now: Instant) {
        while let Some(deadline) = self.deadlines.pop_due(now) {
            match deadline {
                Deadline::Escalate { id, run } => {
                    let sandbox = self
                        .table
                        .get(&id)
                        .filter(|a| a.run_number == run)
                        .and_then(|a| a.sandbox)
                        .and_then(|key| self.sandboxes.get(key));
                    if let Some(sandbox) = sandbox {
                        log::info!("agent {id}: grace over, SIGKILL");
                        sandbox.signal(libc::SIGKILL);
                    }
                }
                Deadline::Restart { id, run } => {
                    let due = self
                        .table
                        .get(&id)
                        .is_some_and(|a| a.run_number == run && a.state == AgentState::Restarting);
                    if due {
                        self.start_run(io, id, now);
                    }
                }
                Deadline::Forget { id } => {
                    if self.table.get(&id).is_some_and(|a| !a.is_live()) {
                        self.table.remove(&id);
                    }
                }
                Deadline::SweepCgroups => self.dying.sweep(&mut self.deadlines, now),
                Deadline::RefillPool => {
                    self.pool_retry_pending = false;
                    self.fill_pool();
                }
            }
        }
    }

    /// Stops every agent (SIGTERM now, SIGKILL after the stop grace) and
    /// every warm sandbox.
    pub fn begin_shutdown(&mut self, io: &mut Io<'_>, grace: Duration) {
        self.shutting_down = true;
        let now = Instant::now();
        let grace = grace.min(self.stop_grace);
        for key in std::mem::take(&mut self.pool) {
            if let Some(sandbox) = self.sandboxes.get(key) {
                sandbox.signal(libc::SIGKILL);
            }
        }
        let live: Vec<u32> = self
            .table
            .values()
            .filter(|a| a.is_live())
            .map(|a| a.id)
            .collect();
        if !live.is_empty() {
            log::info!("stopping {} agent(s)", live.len());
        }
        for id in live {
            self.stop(io, id, Stop::Shutdown, grace, now);
        }
    }

    /// No sandbox process and no launch remains.
    pub fn is_idle(&self) -> bool {
        self.pending_launches.is_empty() && self.sandboxes.is_empty()
    }

    /// Last step of shutdown (may block briefly): kills what remains,
    /// removes cgroups, sockets and the run directory.
    pub fn finish_shutdown(&mut self, registry: &Registry) {
        // Launches still in flight come back and are killed at once.
        while !self.pending_launches.is_empty() {
            let Some(done) = self.launches.wait_completed(Duration::from_secs(2)) else {
                break;
            };
            self.pending_launches.remove(&done.seq);
            if let Ok((launched, cgroup)) = done.result {
                // SAFETY: pidfd_send_signal on a pidfd we own.
                unsafe { sandboxes::pidfd_signal(launched.pidfd.as_raw_fd(), libc::SIGKILL) };
                wait_pidfd(&launched.pidfd, true);
                if let Some(cgroup) = cgroup {
                    remove_now(&cgroup);
                }
            }
        }
        for sandbox in self.sandboxes.drain() {
            sandbox.signal(libc::SIGKILL);
            wait_pidfd(&sandbox.pidfd, true);
            let _ = registry.deregister(&mut SourceFd(&sandbox.pidfd.as_raw_fd()));
            if let Some(cgroup) = &sandbox.cgroup {
                remove_now(cgroup);
            }
        }
        for agent in self.table.values_mut() {
            if let Some(cgroup) = agent.cgroup.take() {
                remove_now(&cgroup);
            }
            agent.door = None;
            agent.oom_watch = None;
        }
        for (cgroup, _) in self.dying.0.drain(..) {
            remove_now(&cgroup);
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.shutdown();
        }
        if let Some(state) = self.doors.parent() {
            let _ = std::fs::remove_dir_all(state);
        }
    }

    // ---- runs ----------------------------------------------------------

    fn shape_of(&self, request: &SpawnRequest) -> Shape {
        shape_of(request, self.no_namespaces.is_none())
    }

    /// Starts the agent's next run: in a warm sandbox if one fits, else in
    /// a new one prepared for it.
    fn start_run(&mut self, io: &mut Io<'_>, id: u32, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.run_number += 1;
        agent.state = AgentState::Starting;
        agent.outcome = Outcome::default();
        agent.oom_killed = false;
        agent.started_at = SystemTime::now();
        agent.started = now;
        let run = agent.run_number;
        let shape = shape_of(&agent.request, self.no_namespaces.is_none());
        if shape != Shape::DEFAULT {
            self.launch(LaunchFor::Agent { id, run }, shape);
        } else if self.pool.is_empty() {
            self.waiting.push_back((id, run));
            self.launch(LaunchFor::Pool, shape);
        } else {
            let key = self.pool.remove(0);
            self.claim(io, key, id, now);
            self.retry_pool_later(now, POOL_REFILL_DELAY);
        }
    }

    /// Asks the launch thread for a sandbox of `shape`.
    fn launch(&mut self, for_whom: LaunchFor, shape: Shape) {
        let seq = self.next_launch;
        self.next_launch += 1;
        let cgroup = (shape.sandboxed && self.cgroups.is_some())
            .then(|| (format!("sandbox-{seq}"), cgroup_limits(&self.defaults)));
        self.pending_launches.insert(seq, for_whom);
        let spec = self.spec_of(shape).clone();
        self.launches.submit(LaunchJob {
            seq,
            spec,
            cgroup,
            map_to: if shape.sandboxed { self.map_to } else { None },
        });
    }

    /// Keeps the warm pool at its size.
    fn fill_pool(&mut self) {
        if self.shutting_down || self.pool_retry_pending {
            return;
        }
        let coming = self
            .pending_launches
            .values()
            .filter(|f| matches!(f, LaunchFor::Pool))
            .count();
        for _ in self.pool.len() + coming.saturating_sub(self.waiting.len())..self.pool_size {
            self.launch(LaunchFor::Pool, Shape::DEFAULT);
        }
    }

    /// A sandbox came back from the launch thread.
    fn launched(&mut self, io: &mut Io<'_>, done: LaunchDone, now: Instant) {
        let Some(for_whom) = self.pending_launches.remove(&done.seq) else {
            return;
        };
        let (launched, cgroup) = match done.result {
            Ok(result) => result,
            Err(message) => {
                log::error!("{message}");
                match for_whom {
                    LaunchFor::Pool => {
                        if let Some(id) = self.next_waiting() {
                            self.fail_start(io, id, ErrorCode::Internal, message, now);
                        }
                        self.retry_pool_later(now, POOL_RETRY);
                    }
                    LaunchFor::Agent { id, run } => {
                        if self.table.get(&id).is_some_and(|a| a.run_number == run) {
                            self.fail_start(io, id, ErrorCode::Internal, message, now);
                        }
                    }
                }
                return;
            }
        };
        let shape = match for_whom {
            LaunchFor::Pool => Shape::DEFAULT,
            LaunchFor::Agent { id, .. } => self
                .table
                .get(&id)
                .map_or(Shape::DEFAULT, |a| self.shape_of(&a.request)),
        };
        let pid_namespace = shape
            .sandboxed
            .then(|| pid_namespace_of(launched.pid))
            .flatten();
        let entry = self.sandboxes.vacant_entry();
        let key = entry.key();
        let exit_token = Token(TOKEN_BASE + self.sources.insert(Source::Exit(key)));
        let status_token = Token(TOKEN_BASE + self.sources.insert(Source::Status(key)));
        let registered = io
            .registry
            .register(
                &mut SourceFd(&launched.pidfd.as_raw_fd()),
                exit_token,
                Interest::READABLE,
            )
            .and_then(|()| {
                io.registry.register(
                    &mut SourceFd(&launched.status.fd().as_raw_fd()),
                    status_token,
                    Interest::READABLE,
                )
            });
        entry.insert(Sandbox {
            pid: launched.pid,
            pidfd: launched.pidfd,
            exit_token,
            status: Some((launched.status, status_token)),
            control: launched.control,
            cgroup,
            shape,
            serving: None,
            pid_namespace,
        });
        if let Err(err) = registered {
            log::error!("cannot watch a new sandbox: {err}");
            self.discard_sandbox(io, key);
            if let LaunchFor::Agent { id, .. } = for_whom {
                let message = format!("cannot watch the sandbox: {err}");
                self.fail_start(io, id, ErrorCode::Internal, message, now);
            }
            return;
        }
        match for_whom {
            LaunchFor::Agent { id, run }
                if self.table.get(&id).is_some_and(|a| {
                    a.run_number == run && a.state == AgentState::Starting && a.stop.is_none()
                }) =>
            {
                self.claim(io, key, id, now);
            }
            LaunchFor::Agent { id, .. } => {
                // Stopped (or superseded) while its sandbox was prepared.
                self.discard_sandbox(io, key);
                if self
                    .table
                    .get(&id)
                    .is_some_and(|a| a.stop.is_some() && a.is_live() && a.sandbox.is_none())
                {
                    self.killed_before_start(io, id, now);
                }
            }
            LaunchFor::Pool => match self.next_waiting() {
                Some(id) => {
                    self.claim(io, key, id, now);
                    self.retry_pool_later(now, POOL_REFILL_DELAY);
                }
                None if self.shutting_down => self.discard_sandbox(io, key),
                None => self.pool.push(key),
            },
        }
    }

    /// The oldest run still waiting for a default sandbox.
    fn next_waiting(&mut self) -> Option<u32> {
        while let Some((id, run)) = self.waiting.pop_front() {
            let current = self.table.get(&id).is_some_and(|a| {
                a.run_number == run && a.state == AgentState::Starting && a.stop.is_none()
            });
            if current {
                return Some(id);
            }
        }
        None
    }

    /// Gives sandbox `key` to the agent's current run: its cgroup becomes the
    /// agent's, with the agent's limits, and it is told what to run.
    fn claim(&mut self, io: &mut Io<'_>, key: usize, id: u32, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return self.discard_sandbox(io, key);
        };
        let Some(sandbox) = self.sandboxes.get_mut(key) else {
            return;
        };
        let run = agent.run_number;
        let mut cgroup = sandbox.cgroup.take();
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(&agent.log)
            .map_err(|err| format!("cannot open the agent log {}: {err}", agent.log.display()));
        let sandboxed = sandbox.shape.sandboxed;
        let door = agent
            .door
            .as_ref()
            .map(|(door, _)| door.path().to_path_buf())
            .unwrap_or_default();
        let (socket, home) = if sandboxed {
            (PathBuf::from(SOCKET_INSIDE), PathBuf::from(WORKSPACE))
        } else {
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
            (door.clone(), home)
        };
        let workload = Workload {
            name: agent.name.clone(),
            program: agent.program.program.clone(),
            argv: agent.program.argv.clone(),
            env: program::environment(&agent.request, id, &socket, &home),
            cwd: agent.program.cwd.clone(),
            script: agent.program.script.clone(),
            binds: agent.program.binds.clone(),
            socket: door,
        };
        // The claim goes first: the init enters its root while the cgroup
        // is named and limited here; it starts the workload only after.
        let sent = log
            .and_then(|log| {
                sandbox
                    .control
                    .claim(&plan::claim(sandbox.shape, &workload), &log)
                    .map_err(|err| format!("cannot hand the sandbox its workload: {err}"))
            })
            .and_then(|()| match cgroup.as_mut() {
                Some(cgroup) => cgroup
                    .rename(&format!("agent-{id}-{run}"))
                    .and_then(|()| cgroup.apply(&cgroup_limits(&agent.limits)))
                    .map_err(|err| err.to_string()),
                None => Ok(()),
            })
            .and_then(|()| {
                sandbox
                    .control
                    .start()
                    .map_err(|err| format!("cannot start the sandbox: {err}"))
            });
        sandbox.serving = Some((id, run));
        agent.sandbox = Some(key);
        agent.pid = Some(sandbox.pid);
        agent.pid_namespace = sandbox.pid_namespace;
        agent.oom_baseline = cgroup.as_ref().map_or(0, |c| c.oom_kills());
        agent.cgroup = cgroup;
        if let Err(message) = sent {
            log::error!("agent {id}: {message}");
            sandbox.signal(libc::SIGKILL);
            agent.outcome.start_error = Some((ErrorCode::Internal, message));
            return;
        }
        self.watch_oom(io.registry, id);
        let _ = now;
    }

    /// Kills a sandbox nobody will use and forgets it once it is reaped.
    fn discard_sandbox(&mut self, io: &mut Io<'_>, key: usize) {
        if let Some(sandbox) = self.sandboxes.get_mut(key) {
            sandbox.serving = None;
            sandbox.signal(libc::SIGKILL);
        }
        self.pool.retain(|k| *k != key);
        let _ = io;
    }

    /// Refills the pool after `delay` (unless a refill is already due).
    fn retry_pool_later(&mut self, now: Instant, delay: Duration) {
        if !self.pool_retry_pending {
            self.pool_retry_pending = true;
            self.deadlines.schedule(now + delay, Deadline::RefillPool);
        }
    }

    fn spec_of(&self, shape: Shape) -> &SandboxSpec {
        &self.shapes[&shape]
    }

    /// Status lines from a sandbox's init.
    fn read_status(&mut self, io: &mut Io<'_>, key: usize) {
        let Some(sandbox) = self.sandboxes.get_mut(key) else {
            return;
        };
        let Some((reader, token)) = sandbox.status.as_mut() else {
            return;
        };
        let token = *token;
        let (statuses, closed) = reader.read_available();
        if closed {
            if let Some((reader, _)) = sandbox.status.take() {
                let _ = io
                    .registry
                    .deregister(&mut SourceFd(&reader.fd().as_raw_fd()));
            }
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        let serving = sandbox.serving;
        let pid = sandbox.pid;
        match serving.and_then(|(id, run)| self.table.get_mut(&id).filter(|a| a.run_number == run))
        {
            Some(agent) => {
                for status in statuses {
                    apply_status(agent, status, io);
                }
            }
            None => {
                for status in statuses {
                    if let Status::Error { message, .. } = status {
                        log::error!("warm sandbox (pid {pid}) failed: {message}");
                    }
                }
            }
        }
    }

    /// A sandbox's init exited.
    fn sandbox_exited(&mut self, io: &mut Io<'_>, key: usize, now: Instant) {
        // Take in what the status pipe still holds: how the workload ended.
        self.read_status(io, key);
        if !self.sandboxes.contains(key) {
            return;
        }
        let mut sandbox = self.sandboxes.remove(key);
        let init_end = wait_pidfd(&sandbox.pidfd, false);
        let _ = io
            .registry
            .deregister(&mut SourceFd(&sandbox.pidfd.as_raw_fd()));
        self.sources.try_remove(sandbox.exit_token.0 - TOKEN_BASE);
        if let Some((reader, token)) = sandbox.status.take() {
            let _ = io
                .registry
                .deregister(&mut SourceFd(&reader.fd().as_raw_fd()));
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        if let Some(cgroup) = sandbox.cgroup.take() {
            // A parked or discarded sandbox: its cgroup goes with it.
            self.dying.retire(cgroup, &mut self.deadlines, now);
        }
        if self.pool.contains(&key) {
            self.pool.retain(|k| *k != key);
            log::warn!("a warm sandbox (pid {}) ended: {init_end:?}", sandbox.pid);
            self.retry_pool_later(now, POOL_RETRY);
        }
        let Some((id, run)) = sandbox.serving else {
            return;
        };
        if self.table.get(&id).is_none_or(|a| a.run_number != run) {
            return;
        }
        self.run_ended(io, id, init_end, now);
    }

    /// The agent's current run has ended.
    fn run_ended(&mut self, io: &mut Io<'_>, id: u32, init_end: Option<InitEnd>, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.sandbox = None;
        agent.pid = None;
        // The init reports the workload's ending; if it could not (it was
        // killed itself: SIGKILL, OOM), its own wait status stands in.
        if agent.outcome.exit_code.is_none() && agent.outcome.signal.is_none() {
            match init_end {
                Some(InitEnd::Exited(code)) if agent.outcome.start_error.is_none() => {
                    agent.outcome.exit_code = Some(code)
                }
                Some(InitEnd::Signaled(signal)) => agent.outcome.signal = Some(signal),
                _ => {}
            }
        }
        if agent
            .cgroup
            .as_ref()
            .is_some_and(|c| c.oom_kills() > agent.oom_baseline)
        {
            agent.oom_killed = true;
        }
        if let Some((watch, token)) = agent.oom_watch.take() {
            let _ = io.registry.deregister(&mut SourceFd(&watch.as_raw_fd()));
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        if let Some(cgroup) = agent.cgroup.take() {
            agent.last_run = CgroupStats {
                memory_current: 0,
                pids_current: 0,
                ..cgroup.stats()
            };
            self.dying.retire(cgroup, &mut self.deadlines, now);
        }
        if let Some((code, message)) = agent.outcome.start_error.clone() {
            log::info!("agent {id} ({}): could not start: {message}", agent.name);
            return self.fail_start(io, id, code, message, now);
        }
        if !agent.outcome.ready {
            let message = if agent.stop.is_some() {
                "the agent was stopped before it started".to_owned()
            } else {
                "the sandbox ended before the workload started; see the agent log".to_owned()
            };
            return self.fail_start(io, id, ErrorCode::Internal, message, now);
        }
        let end = match (agent.stop, agent.outcome.exit_code, agent.outcome.signal) {
            (Some(_), _, _) => RunEnd::Stopped,
            (None, Some(0), None) if !agent.oom_killed => RunEnd::Success,
            _ => RunEnd::Failure,
        };
        agent.state = if agent.stop.is_some() {
            AgentState::Killed
        } else if agent.oom_killed && agent.outcome.signal == Some(libc::SIGKILL) {
            AgentState::OomKilled
        } else {
            AgentState::Exited
        };
        log::info!(
            "agent {id} ({}): {} (exit code {:?}, signal {:?}{})",
            agent.name,
            agent.state.as_str(),
            agent.outcome.exit_code,
            agent.outcome.signal,
            if agent.oom_killed { ", OOM kill" } else { "" }
        );
        self.after_run(io, id, end, now);
    }

    /// A run could not start: answer a waiting SPAWN (the agent is then
    /// simply `failed`), or let the restart policy decide.
    fn fail_start(
        &mut self,
        io: &mut Io<'_>,
        id: u32,
        code: ErrorCode,
        message: String,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.state = if agent.stop.is_some() {
            AgentState::Killed
        } else {
            AgentState::Failed
        };
        if let Some(waiter) = agent.spawn_reply.take() {
            io.replies
                .push((waiter.reply_to, ErrorReply::new(code, message).to_json()));
            return self.finish(io, id, now);
        }
        let end = if agent.stop.is_some() {
            RunEnd::Stopped
        } else {
            RunEnd::Failure
        };
        self.after_run(io, id, end, now);
    }

    /// A run stopped before it had a sandbox: a SPAWN still waiting hears so.
    fn killed_before_start(&mut self, io: &mut Io<'_>, id: u32, now: Instant) {
        let message = format!("agent {id} was killed before it started");
        self.fail_start(io, id, ErrorCode::NotFound, message, now);
    }

    /// A run is over: restart it, or let the agent end.
    fn after_run(&mut self, io: &mut Io<'_>, id: u32, end: RunEnd, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        if self.shutting_down {
            return self.finish(io, id, now);
        }
        match agent.restarts.decide(end, now) {
            Decision::RestartAfter(delay) => {
                log::info!("agent {id} ({}): restarting in {delay:?}", agent.name);
                agent.state = AgentState::Restarting;
                let run = agent.run_number;
                self.deadlines
                    .schedule(now + delay, Deadline::Restart { id, run });
            }
            Decision::Rest => self.finish(io, id, now),
            Decision::GiveUp => {
                log::warn!("agent {id} ({}): restarts used up; failed", agent.name);
                agent.state = AgentState::Failed;
                self.finish(io, id, now);
            }
        }
    }

    /// The agent has ended for good: close its socket, and forget it after
    /// the retention time.
    fn finish(&mut self, io: &mut Io<'_>, id: u32, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.ended = Some(now);
        if let Some((door, token)) = agent.door.take() {
            let _ = io
                .registry
                .deregister(&mut SourceFd(&door.listener.as_raw_fd()));
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        self.deadlines
            .schedule(now + self.retention, Deadline::Forget { id });
    }

    /// Asks a live agent to stop.
    fn stop(&mut self, io: &mut Io<'_>, id: u32, why: Stop, grace: Duration, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.stop = Some(why);
        if agent.state == AgentState::Restarting {
            agent.state = AgentState::Killed;
            return self.finish(io, id, now);
        }
        let run = agent.run_number;
        if let Some(at) = self.waiting.iter().position(|w| *w == (id, run)) {
            // Waiting for any sandbox: nothing runs yet, so it ends here.
            self.waiting.remove(at);
            return self.killed_before_start(io, id, now);
        }
        let Some(sandbox) = agent.sandbox.and_then(|key| self.sandboxes.get(key)) else {
            // Its own sandbox is still being prepared: it is discarded on arrival.
            return;
        };
        if grace.is_zero() {
            sandbox.signal(libc::SIGKILL);
        } else {
            sandbox.signal(libc::SIGTERM);
            self.deadlines
                .schedule(now + grace, Deadline::Escalate { id, run });
        }
    }

    // ---- sockets, OOM, permissions -------------------------------------

    /// A connection on an agent's own socket.
    fn knock(&mut self, io: &mut Io<'_>, id: u32) {
        let Some(agent) = self.table.get(&id) else {
            return;
        };
        let Some((door, _)) = agent.door.as_ref() else {
            return;
        };
        loop {
            match door.listener.accept() {
                Ok((stream, _)) => {
                    if let Some(expected) = agent.pid_namespace {
                        let inside = peer_cred(&stream)
                            .and_then(|peer| peer_pid_namespaces(&stream, &peer))
                            .ok()
                            .flatten()
                            .is_some_and(|chain| chain.contains(&expected));
                        if !inside {
                            log::warn!(
                                "agent {id}: refusing a connection on its socket from outside \
                                 its sandbox"
                            );
                            continue;
                        }
                    }
                    io.adopted.push((stream, Identity::Agent { id }));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    log::warn!("agent {id}: accept failed: {err}");
                    return;
                }
            }
        }
    }

    fn watch_oom(&mut self, registry: &Registry, id: u32) {
        let Some(watch) = self
            .table
            .get(&id)
            .and_then(|a| a.cgroup.as_ref())
            .and_then(|c| {
                c.watch_oom()
                    .map_err(|err| log::warn!("agent {id}: no OOM watch: {err}"))
                    .ok()
            })
        else {
            return;
        };
        if let Ok(token) = self.register(registry, watch.as_raw_fd(), Source::Oom(id)) {
            if let Some(agent) = self.table.get_mut(&id) {
                agent.oom_watch = Some((watch, token));
            }
        }
    }

    fn oom_event(&mut self, id: u32) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        if let (Some(cgroup), Some((watch, _))) = (&agent.cgroup, &agent.oom_watch) {
            cgroup.drain_watch(watch);
            if cgroup.oom_kills() > agent.oom_baseline && !agent.oom_killed {
                log::info!(
                    "agent {id} ({}): the memory limit killed a process",
                    agent.name
                );
                agent.oom_killed = true;
            }
        }
    }

    fn is_descendant(&self, id: u32, ancestor: u32) -> bool {
        let mut current = self.table.get(&id).and_then(|a| a.parent);
        // Ids only grow, so a parent chain cannot loop; the bound is belt and braces.
        for _ in 0..self.table.len() {
            match current {
                Some(parent) if parent == ancestor => return true,
                Some(parent) => current = self.table.get(&parent).and_then(|a| a.parent),
                None => return false,
            }
        }
        false
    }

    fn register(&mut self, registry: &Registry, fd: RawFd, source: Source) -> io::Result<Token> {
        let entry = self.sources.vacant_entry();
        let token = Token(TOKEN_BASE + entry.key());
        registry.register(&mut SourceFd(&fd), token, Interest::READABLE)?;
        entry.insert(source);
        Ok(token)
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

    fn isolation(&self, request: &SpawnRequest) -> Isolation {
        let shape = self.shape_of(request);
        let mut missing = Vec::new();
        if request.sandboxed {
            if let Some(reason) = &self.no_namespaces {
                missing.push(format!("no namespaces: {reason}"));
            }
            if let Some(reason) = &self.no_cgroups {
                missing.push(format!("no cgroup limits: {reason}"));
            }
        }
        let namespaces = Namespaces {
            pid: shape.sandboxed,
            net: shape.sandboxed && !shape.network,
            mount: shape.sandboxed,
            uts: shape.sandboxed,
            ipc: shape.sandboxed,
            user: shape.sandboxed && self.map_to.is_some(),
        };
        Isolation {
            sandboxed: shape.sandboxed,
            namespaces: namespaces.names(),
            cgroup: if shape.sandboxed {
                self.cgroup_version()
            } else {
                None
            },
            degraded_reason: (!missing.is_empty()).then(|| missing.join("; ")),
        }
    }
}

/// cgroups whose processes are gone, or going: a cgroup can be removed only
/// once empty, which may take a moment after its last process exits.
#[derive(Debug, Default)]
struct Dying(Vec<(AgentCgroup, u32)>);

impl Dying {
    /// Removes `cgroup` now if it is empty, else retries on a deadline.
    fn retire(&mut self, cgroup: AgentCgroup, deadlines: &mut Timers<Deadline>, now: Instant) {
        if cgroup.remove().is_ok() {
            return;
        }
        if self.0.is_empty() {
            deadlines.schedule(now + CGROUP_RETRY, Deadline::SweepCgroups);
        }
        self.0.push((cgroup, 0));
    }

    /// One more try for each; past half the tries, whatever is still in a
    /// cgroup (it cannot be, in a PID namespace) is killed.
    fn sweep(&mut self, deadlines: &mut Timers<Deadline>, now: Instant) {
        self.0.retain_mut(|(cgroup, attempts)| {
            *attempts += 1;
            if *attempts > CGROUP_RETRIES / 2 {
                cgroup.kill_all();
            }
            match cgroup.remove() {
                Ok(()) => false,
                Err(err) if *attempts >= CGROUP_RETRIES => {
                    log::warn!("giving up on removing a cgroup: {err}");
                    false
                }
                Err(_) => true,
            }
        });
        if !self.0.is_empty() {
            deadlines.schedule(now + CGROUP_RETRY, Deadline::SweepCgroups);
        }
    }
}

/// Removes a cgroup, killing what is in it and waiting a little (shutdown
/// only).
fn remove_now(cgroup: &AgentCgroup) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        cgroup.kill_all();
        match cgroup.remove() {
            Ok(()) => return,
            Err(err) if Instant::now() > deadline => {
                log::warn!("cannot remove cgroup {}: {err}", cgroup.rel().display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Applies one status line to an agent.
fn apply_status(agent: &mut Agent, status: Status, io: &mut Io<'_>) {
    match status {
        Status::Ready { .. } => {
            agent.outcome.ready = true;
            if agent.stop.is_none() {
                agent.state = AgentState::Running;
            }
            if let Some(waiter) = agent.spawn_reply.take() {
                let reply = SpawnReply {
                    success: true,
                    id: agent.id,
                    name: agent.name.clone(),
                    // An agent cannot see its children's processes.
                    pid: agent.pid.filter(|_| !waiter.by_agent).map(|p| p as u32),
                    status: agent.state,
                    isolation: agent.isolation.clone(),
                };
                io.replies
                    .push((waiter.reply_to, agentos_proto::payload::to_json(&reply)));
            }
            log::info!("agent {} ({}): running", agent.id, agent.name);
        }
        Status::Error { code, message } => agent.outcome.start_error = Some((code, message)),
        Status::Exited(code) => agent.outcome.exit_code = Some(code),
        Status::Signaled(signal) => agent.outcome.signal = Some(signal),
    }
}

/// The sandbox shape a request needs, on a host that can (or cannot) give
/// namespaces.
fn shape_of(request: &SpawnRequest, namespaces: bool) -> Shape {
    let sandboxed = request.sandboxed && namespaces;
    Shape {
        sandboxed,
        // Outside a sandbox there is only the host's network.
        network: request.network && sandboxed,
    }
}

fn cgroup_limits(limits: &Limits) -> CgroupLimits {
    CgroupLimits {
        memory: limits.memory.unwrap_or(u64::MAX),
        cpu_quota: limits.cpu_quota,
        cpu_period: limits.cpu_period.unwrap_or(100_000),
        max_pids: limits.max_pids.unwrap_or(u64::MAX),
    }
}

/// The kernel's own files, which no sandbox may see even when they lie in
/// a directory bound into it: its config files, its socket and lock, its
/// state directory (other agents' sockets), the logs.
fn kernel_files(config: &Config, socket: &Path, state: &Path, logs: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(crate::config::DEFAULT_CONFIG_PATH)];
    files.extend(
        config
            .file
            .iter()
            .filter_map(|f| std::fs::canonicalize(f).ok()),
    );
    let socket_dir = socket
        .parent()
        .and_then(|dir| std::fs::canonicalize(dir).ok());
    if let (Some(dir), Some(name)) = (socket_dir, socket.file_name()) {
        files.push(dir.join(name));
        let mut lock = name.to_os_string();
        lock.push(".lock");
        files.push(dir.join(lock));
    }
    files.push(state.to_path_buf());
    files.extend(std::fs::canonicalize(logs).ok());
    files
}

/// Where the kernel serving `socket` keeps its agents' sockets and the
/// sandbox roots' staging directory: `<socket>.d`, next to the socket, so
/// two kernels never share one.
pub fn state_dir_of(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_os_string();
    name.push(".d");
    PathBuf::from(name)
}

/// Makes `dir` a new, empty directory only its owner may enter, removing
/// whatever was there.
fn fresh_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::remove_dir_all(dir) {
        Ok(()) => log::info!("removed what an earlier kernel left in {}", dir.display()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            return Err(io::Error::new(
                err.kind(),
                format!("cannot clear {}: {err}", dir.display()),
            ))
        }
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("cannot create {}: {err}", dir.display()),
            )
        })
}

/// Whether this (unprivileged) process may create a user namespace: tried
/// in a short-lived child so the daemon itself is untouched.
fn probe_user_namespaces() -> Result<(), String> {
    // SAFETY: the child only calls unshare and _exit.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // SAFETY: async-signal-safe calls only.
            unsafe {
                let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
                libc::_exit(if ok { 0 } else { 1 })
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                _ => Err(
                    "agentosd is not root and this host does not let it create user \
                          namespaces: agents run without namespaces"
                        .into(),
                ),
            }
        }
        Err(err) => Err(format!("cannot probe user namespaces: {err}")),
    }
}
