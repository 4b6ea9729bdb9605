//! Agents: isolated processes the kernel starts, watches, restarts and
//! stops.
//!
//! Everything here runs on the reactor thread and never blocks: launches go
//! to the launch thread ([`launching`]), and everything that happens to an
//! agent afterwards arrives as an event — its init's pidfd (exit), its
//! status pipe (started, failed, how the workload ended), its cgroup's OOM
//! watch, its own socket ([`door`]) — or as one of its deadlines (escalate
//! a KILL to SIGKILL, restart after backoff, forget an ended agent).
//!
//! Life of an agent: `starting` (launch in flight) → `running` (workload
//! exec'd; the SPAWN reply goes out) → it ends: `exited`, `killed` or
//! `oom_killed` — or `restarting` while a restart waits out its backoff —
//! and `failed` when it could not start or used up its restarts. Ended
//! agents stay listed for `agents.retention_secs`, then are forgotten.

pub mod door;
mod launching;
pub mod program;
mod record;
pub mod restart;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{
    AgentInfo, AgentRef, AgentState, CgroupVersion, Isolation, KillRequest, Limits, SpawnReply,
    SpawnRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::event::Event;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token, Waker};

use slab::Slab;

use crate::cgroup::{CgroupLimits, Cgroups};
use crate::config::Config;
use crate::identity::{peer_cred, Identity};
use crate::reactor::ReplyTo;
use crate::sandbox::plan::{self, Profile, Workload, SOCKET_INSIDE, WORKSPACE};
use crate::sandbox::spec::Rlimits;
use crate::sandbox::{Launcher, Status, User};
use crate::syscall::Io;
use crate::timers::Timers;
use door::Door;
use launching::{LaunchDone, LaunchJob, LaunchThread};
use record::{Agent, Outcome, Run, Stop};
use restart::{Decision, Restarts, RunEnd};

/// Tokens from here up belong to the agents table.
pub const TOKEN_BASE: usize = 1 << 40;
/// And below this.
const TOKEN_END: usize = 1 << 48;

/// Between the cgroup's last process exiting and the cgroup being
/// removable there can be a moment; retry this often, this many times.
const CGROUP_RETRY: Duration = Duration::from_millis(50);
const CGROUP_RETRIES: u32 = 100;

#[derive(Clone, Copy, Debug)]
enum Source {
    Door(u32),
    Exit(u32),
    Status(u32),
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
    /// Try again to remove an ended agent's cgroup.
    RemoveCgroup { id: u32, attempt: u32 },
}

/// The agents table and everything that keeps it current.
#[derive(Debug)]
pub struct Agents {
    table: BTreeMap<u32, Agent>,
    next_id: u32,
    sources: Slab<Source>,
    deadlines: Timers<Deadline>,
    launches: LaunchThread,
    in_flight: usize,
    cgroups: Option<Cgroups>,
    /// Why there are no cgroups, when there are none.
    no_cgroups: Option<String>,
    profile: Profile,
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
    /// Sets up agent support: cgroups, the run directory for agent sockets
    /// and sandbox roots (next to the kernel socket), the log directory,
    /// and the launch thread.
    /// Finished launches wake the reactor through `waker` (mio allows one
    /// waker per poll, shared with the worker pool).
    pub fn new(config: &Config, waker: Arc<Waker>, run_dir: &Path) -> io::Result<Agents> {
        let (cgroups, no_cgroups) = match Cgroups::detect() {
            Ok(cgroups) => match cgroups.start() {
                Ok(()) => (Some(cgroups), None),
                Err(err) => (None, Some(format!("cgroups could not be set up: {err}"))),
            },
            Err(reason) => (None, Some(reason)),
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
        let doors = run_dir.join("agents");
        let staging = run_dir.join("sandbox-root");
        for dir in [&doors, &staging] {
            create_private_dir(dir)?;
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
            extra_masks: config_files(config),
        };
        let launcher = Launcher::new(Path::new("/proc/self/exe"))?;
        Ok(Agents {
            table: BTreeMap::new(),
            next_id: 1,
            sources: Slab::new(),
            deadlines: Timers::default(),
            launches: LaunchThread::start(launcher, waker)?,
            in_flight: 0,
            cgroups,
            no_cgroups,
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
        })
    }

    /// The cgroup version enforcing limits, if any.
    pub fn cgroup_version(&self) -> Option<CgroupVersion> {
        self.cgroups.as_ref().map(Cgroups::version)
    }

    /// Whether a token is one of ours.
    pub fn owns(&self, token: Token) -> bool {
        (TOKEN_BASE..TOKEN_END).contains(&token.0)
    }

    /// Takes in launches the launch thread has finished (after a wake-up).
    pub fn poll_launches(&mut self, io: &mut Io<'_>) {
        let now = Instant::now();
        let finished: Vec<LaunchDone> = self.launches.completed().collect();
        for done in finished {
            self.launched(io, done, now);
        }
    }

    /// An agent by id.
    pub fn get(&self, id: u32) -> Option<&Agent> {
        self.table.get(&id)
    }

    /// SPAWN: starts an agent. `Ok` means the reply will be delivered to
    /// `reply_to` once the workload runs (or fails to start).
    pub fn spawn(
        &mut self,
        io: &mut Io<'_>,
        caller: Identity,
        mut request: SpawnRequest,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        if self.shutting_down {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "the kernel is shutting down",
            ));
        }
        let parent = caller.agent();
        if let Some(parent_id) = parent {
            let parent = self.table.get(&parent_id).ok_or_else(|| {
                ErrorReply::new(ErrorCode::PermissionDenied, "unknown calling agent")
            })?;
            if !parent.request.permissions.spawn {
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
                    "agents may only spawn sandboxed agents",
                ));
            }
            // A child can do no more than its parent.
            let granted = parent.request.permissions;
            let asked = &mut request.permissions;
            asked.think &= granted.think;
            asked.exec &= granted.exec;
            if granted.llm_tokens > 0
                && (asked.llm_tokens == 0 || asked.llm_tokens > granted.llm_tokens)
            {
                asked.llm_tokens = granted.llm_tokens;
            }
        }
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
        let program = program::resolve(&request, &self.python)?;
        program::check_env(&request)?;
        let limits = self.effective_limits(&request.limits);

        let id = self.next_id;
        let internal = |what: &str, err: &dyn std::fmt::Display| {
            ErrorReply::new(ErrorCode::Internal, format!("{what}: {err}"))
        };
        let door = Door::open(&self.doors, id)
            .map_err(|e| internal("cannot create the agent's socket", &e))?;
        let sandboxed = request.sandboxed && self.no_namespaces.is_none();
        let cgroup = match (&self.cgroups, request.sandboxed) {
            (Some(cgroups), true) => Some(
                cgroups
                    .create(&format!("agent-{id}"), &cgroup_limits(&limits))
                    .map_err(|e| internal("cannot create the agent's cgroup", &e))?,
            ),
            _ => None,
        };
        let isolation = self.isolation(&request, sandboxed, cgroup.as_ref().map(|c| c.version()));
        let door_token = self
            .register(io.registry, door.listener.as_raw_fd(), Source::Door(id))
            .map_err(|e| internal("cannot watch the agent's socket", &e))?;
        self.next_id += 1;
        let now = Instant::now();
        let log = self.log_dir.join(format!("{}-{id}.log", request.name));
        log::info!(
            "agent {id} ({}) spawning: {} (log {})",
            request.name,
            program.argv.join(" "),
            log.display()
        );
        let agent = Agent {
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
            limits,
            isolation,
            state: AgentState::Starting,
            run_number: 0,
            run: None,
            launching: false,
            outcome: Outcome::default(),
            oom_killed: false,
            oom_baseline: 0,
            started_at: SystemTime::now(),
            started: now,
            ended: None,
            stop: None,
            spawn_reply: Some(reply_to),
            cgroup,
            oom_watch: None,
            door: Some((door, door_token)),
            pid_namespace: None,
            log,
            llm: Default::default(),
        };
        self.table.insert(id, agent);
        self.watch_oom(io.registry, id);
        self.launch(id);
        Ok(())
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
        let not_found = || {
            ErrorReply::new(
                ErrorCode::NotFound,
                match &target {
                    AgentRef::Id(id) => format!("no live agent with id {id}"),
                    AgentRef::Name(name) => format!("no live agent named {name:?}"),
                },
            )
        };
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
            .ok_or_else(not_found)?;
        if let Some(caller_id) = caller.agent() {
            if !self.is_descendant(id, caller_id) {
                return Err(ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    "agents may only kill agents they spawned (directly or through their children)",
                ));
            }
        }
        log::info!("agent {id}: KILL (grace {} ms)", request.grace_ms());
        self.stop(
            io,
            id,
            Stop::Kill,
            Duration::from_millis(request.grace_ms()),
            Instant::now(),
        );
        Ok(id)
    }

    /// LIST: every agent, live or recently ended.
    pub fn list(&self, now: Instant) -> Vec<AgentInfo> {
        self.table.values().map(|a| a.info(now)).collect()
    }

    /// Handles readiness of one of our tokens.
    pub fn on_event(&mut self, io: &mut Io<'_>, token: Token, event: &Event) {
        let now = Instant::now();
        let Some(source) = self.sources.get(token.0 - TOKEN_BASE).copied() else {
            return;
        };
        match source {
            Source::Door(id) => self.knock(io, id),
            Source::Status(id) => self.read_status(io, id, now),
            Source::Exit(id) => self.exited(io, id, now),
            Source::Oom(id) => self.oom_event(id),
        }
        let _ = event;
    }

    /// The earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.deadlines.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(&mut self, io: &mut Io<'_>, now: Instant) {
        let _ = &io;
        while let Some(deadline) = self.deadlines.pop_due(now) {
            match deadline {
                Deadline::Escalate { id, run } => {
                    if let Some(agent) = self.table.get(&id).filter(|a| a.run_number == run) {
                        if let Some(live) = &agent.run {
                            log::info!("agent {id}: grace over, SIGKILL");
                            signal_run(live, libc::SIGKILL);
                        }
                    }
                }
                Deadline::Restart { id, run } => {
                    let due = self
                        .table
                        .get(&id)
                        .is_some_and(|a| a.run_number == run && a.state == AgentState::Restarting);
                    if due {
                        self.launch(id);
                    }
                }
                Deadline::Forget { id } => {
                    if self.table.get(&id).is_some_and(|a| !a.is_live()) {
                        self.table.remove(&id);
                    }
                }
                Deadline::RemoveCgroup { id, attempt } => self.remove_cgroup(id, attempt, now),
            }
        }
    }

    /// Stops every agent: SIGTERM now, SIGKILL after the stop grace.
    pub fn begin_shutdown(&mut self, io: &mut Io<'_>, grace: Duration) {
        self.shutting_down = true;
        let now = Instant::now();
        let grace = grace.min(self.stop_grace);
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

    /// No agent process and no launch remains.
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.table.values().all(|a| a.run.is_none())
    }

    /// Last step of shutdown (may block briefly): kills what remains,
    /// removes cgroups, sockets and the run directory.
    pub fn finish_shutdown(&mut self, registry: &Registry) {
        // Launches still in flight come back and are killed at once.
        while self.in_flight > 0 {
            match self.launches.wait_completed(Duration::from_secs(2)) {
                Some(done) => {
                    self.in_flight -= 1;
                    if let Ok(launched) = done.result {
                        // SAFETY: pidfd_send_signal on a pidfd we own.
                        unsafe { pidfd_signal(launched.pidfd.as_raw_fd(), libc::SIGKILL) };
                        wait_pidfd(&launched.pidfd, true);
                    }
                }
                None => break,
            }
        }
        let ids: Vec<u32> = self.table.keys().copied().collect();
        for id in ids {
            let Some(agent) = self.table.get_mut(&id) else {
                continue;
            };
            if let Some(run) = agent.run.take() {
                signal_run(&run, libc::SIGKILL);
                wait_pidfd(&run.pidfd, true);
                let _ = registry.deregister(&mut SourceFd(&run.pidfd.as_raw_fd()));
            }
            if let Some(cgroup) = agent.cgroup.take() {
                let deadline = Instant::now() + Duration::from_secs(2);
                loop {
                    cgroup.kill_all();
                    match cgroup.remove() {
                        Ok(()) => break,
                        Err(err) if Instant::now() > deadline => {
                            log::warn!("cannot remove agent {id}'s cgroup: {err}");
                            break;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }
            agent.door = None;
            agent.oom_watch = None;
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.shutdown();
        }
        for dir in [&self.doors, &self.profile.staging] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    // ---- internals -------------------------------------------------------

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

    fn isolation(
        &self,
        request: &SpawnRequest,
        sandboxed: bool,
        cgroup: Option<CgroupVersion>,
    ) -> Isolation {
        let mut missing = Vec::new();
        if request.sandboxed {
            if let Some(reason) = &self.no_namespaces {
                missing.push(format!("no namespaces: {reason}"));
            }
            if cgroup.is_none() {
                if let Some(reason) = &self.no_cgroups {
                    missing.push(format!("no cgroup limits: {reason}"));
                }
            }
        }
        let namespaces = if sandboxed {
            crate::sandbox::Namespaces {
                pid: true,
                net: !request.network,
                mount: true,
                uts: true,
                ipc: true,
                user: self.map_to.is_some(),
            }
            .names()
        } else {
            Vec::new()
        };
        Isolation {
            sandboxed,
            namespaces,
            cgroup,
            degraded_reason: (!missing.is_empty()).then(|| missing.join("; ")),
        }
    }

    /// Hands the agent's next run to the launch thread.
    fn launch(&mut self, id: u32) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.run_number += 1;
        agent.state = AgentState::Starting;
        agent.outcome = Outcome::default();
        agent.oom_killed = false;
        agent.started_at = SystemTime::now();
        agent.started = Instant::now();
        agent.oom_baseline = agent.cgroup.as_ref().map_or(0, |c| c.oom_kills());
        let sandboxed = agent.isolation.sandboxed;
        let door_path = agent
            .door
            .as_ref()
            .map(|(door, _)| door.path().to_path_buf())
            .unwrap_or_default();
        let (socket_env, home) = if sandboxed {
            (PathBuf::from(SOCKET_INSIDE), PathBuf::from(WORKSPACE))
        } else {
            (
                door_path.clone(),
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from),
            )
        };
        let env = program::environment(&agent.request, id, &socket_env, &home);
        let cgroup_procs = agent
            .cgroup
            .as_ref()
            .map(|c| c.procs_files())
            .unwrap_or_default();
        let workload = Workload {
            name: agent.name.clone(),
            program: agent.program.program.clone(),
            argv: agent.program.argv.clone(),
            env,
            cwd: agent.program.cwd.clone(),
            script: agent.program.script.clone(),
            interpreter: agent.program.interpreter.clone(),
            network: agent.request.network,
            socket: door_path,
            cgroup_fds: cgroup_procs.len(),
        };
        let spec = if sandboxed {
            plan::sandboxed(&self.profile, &workload)
        } else {
            plan::unsandboxed(&self.profile, &workload)
        };
        agent.launching = true;
        self.in_flight += 1;
        self.launches.submit(LaunchJob {
            agent: id,
            run: agent.run_number,
            spec,
            log: agent.log.clone(),
            cgroup_procs,
            map_to: if sandboxed { self.map_to } else { None },
        });
    }

    /// A launch came back from the launch thread.
    fn launched(&mut self, io: &mut Io<'_>, done: LaunchDone, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let current = self
            .table
            .get(&done.agent)
            .is_some_and(|a| a.run_number == done.run);
        let launched = match done.result {
            Ok(launched) if current => launched,
            Ok(launched) => {
                // SAFETY: pidfd_send_signal on a pidfd we own.
                unsafe { pidfd_signal(launched.pidfd.as_raw_fd(), libc::SIGKILL) };
                return;
            }
            Err(message) => {
                log::error!("agent {}: {message}", done.agent);
                if current {
                    self.fail_start(io, done.agent, ErrorCode::Internal, message, now);
                }
                return;
            }
        };
        let id = done.agent;
        let exit_token =
            match self.register(io.registry, launched.pidfd.as_raw_fd(), Source::Exit(id)) {
                Ok(token) => token,
                Err(err) => {
                    // SAFETY: pidfd_send_signal on a pidfd we own.
                    unsafe { pidfd_signal(launched.pidfd.as_raw_fd(), libc::SIGKILL) };
                    self.fail_start(
                        io,
                        id,
                        ErrorCode::Internal,
                        format!("cannot watch the agent: {err}"),
                        now,
                    );
                    return;
                }
            };
        let status_token = self
            .register(
                io.registry,
                launched.status.fd().as_raw_fd(),
                Source::Status(id),
            )
            .ok();
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.launching = false;
        agent.pid_namespace = agent
            .isolation
            .namespaces
            .iter()
            .any(|n| n == "pid")
            .then(|| pid_namespace_of(launched.pid))
            .flatten();
        let run = Run {
            pid: launched.pid,
            pidfd: launched.pidfd,
            exit_token,
            status: status_token.map(|token| (launched.status, token)),
        };
        if agent.stop.is_some() {
            // KILLed while the launch was in flight.
            signal_run(&run, libc::SIGKILL);
        }
        agent.run = Some(run);
    }

    /// Status lines from a run's init.
    fn read_status(&mut self, io: &mut Io<'_>, id: u32, _now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        let Some((reader, token)) = agent.run.as_mut().and_then(|run| run.status.as_mut()) else {
            return;
        };
        let token = *token;
        let (statuses, closed) = reader.read_available();
        for status in statuses {
            apply_status(agent, status, io);
        }
        if closed {
            if let Some((reader, _)) = agent.run.as_mut().and_then(|r| r.status.take()) {
                let _ = io
                    .registry
                    .deregister(&mut SourceFd(&reader.fd().as_raw_fd()));
            }
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
    }

    /// A run's init exited.
    fn exited(&mut self, io: &mut Io<'_>, id: u32, now: Instant) {
        // Take in what the status pipe still holds: how the workload ended.
        self.read_status(io, id, now);
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        let Some(mut run) = agent.run.take() else {
            return;
        };
        let init_status = wait_pidfd(&run.pidfd, false);
        let _ = io
            .registry
            .deregister(&mut SourceFd(&run.pidfd.as_raw_fd()));
        self.sources.try_remove(run.exit_token.0 - TOKEN_BASE);
        if let Some((reader, token)) = run.status.take() {
            let _ = io
                .registry
                .deregister(&mut SourceFd(&reader.fd().as_raw_fd()));
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        // The init reports the workload's ending; if it could not (it was
        // killed itself: SIGKILL, OOM), its own wait status stands in.
        if agent.outcome.exit_code.is_none() && agent.outcome.signal.is_none() {
            match init_status {
                Some(InitEnd::Exited(code)) if agent.outcome.start_error.is_none() => {
                    agent.outcome.exit_code = Some(code)
                }
                Some(InitEnd::Signaled(signal)) => agent.outcome.signal = Some(signal),
                _ => {}
            }
        }
        let oom_kills = agent.cgroup.as_ref().map_or(0, |c| c.oom_kills());
        if oom_kills > agent.oom_baseline {
            agent.oom_killed = true;
        }
        if let Some((code, message)) = agent.outcome.start_error.clone() {
            log::info!("agent {id} ({}): could not start: {message}", agent.name);
            self.fail_start(io, id, code, message, now);
            return;
        }
        if !agent.outcome.ready {
            let message =
                "the sandbox ended before the workload started; see the agent log".to_owned();
            self.fail_start(io, id, ErrorCode::Internal, message, now);
            return;
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

    /// A run could not start: answer a waiting SPAWN, then let the restart
    /// policy decide (a first run that fails to start is simply `failed`).
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
        agent.launching = false;
        if let Some(reply_to) = agent.spawn_reply.take() {
            io.replies
                .push((reply_to, ErrorReply::new(code, message).to_json()));
            agent.state = AgentState::Failed;
            self.finish(io, id, now);
            return;
        }
        agent.state = AgentState::Failed;
        let end = if agent.stop.is_some() {
            RunEnd::Stopped
        } else {
            RunEnd::Failure
        };
        self.after_run(io, id, end, now);
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
                self.deadlines.schedule(
                    now + delay,
                    Deadline::Restart {
                        id,
                        run: agent.run_number,
                    },
                );
            }
            Decision::Rest => self.finish(io, id, now),
            Decision::GiveUp => {
                log::warn!("agent {id} ({}): restarts used up; failed", agent.name);
                agent.state = AgentState::Failed;
                self.finish(io, id, now);
            }
        }
    }

    /// The agent has ended for good: close its socket, remove its cgroup,
    /// and forget it after the retention time.
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
        if let Some((watch, token)) = agent.oom_watch.take() {
            let _ = io.registry.deregister(&mut SourceFd(&watch.as_raw_fd()));
            self.sources.try_remove(token.0 - TOKEN_BASE);
        }
        self.remove_cgroup(id, 0, now);
        self.deadlines
            .schedule(now + self.retention, Deadline::Forget { id });
    }

    fn remove_cgroup(&mut self, id: u32, attempt: u32, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        let Some(cgroup) = agent.cgroup.as_ref() else {
            return;
        };
        if agent.run.is_some() {
            return;
        }
        if attempt > CGROUP_RETRIES / 2 {
            // Something outlived the sandbox (it cannot in a PID namespace).
            cgroup.kill_all();
        }
        match cgroup.remove() {
            Ok(()) => {
                // Keep the last figures' source gone: LIST shows zeros after.
                agent.cgroup = None;
            }
            Err(err) if attempt >= CGROUP_RETRIES => {
                log::warn!("agent {id}: cannot remove its cgroup: {err}");
            }
            Err(_) => self.deadlines.schedule(
                now + CGROUP_RETRY,
                Deadline::RemoveCgroup {
                    id,
                    attempt: attempt + 1,
                },
            ),
        }
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
        if let Some(run) = &agent.run {
            if grace.is_zero() {
                signal_run(run, libc::SIGKILL);
            } else {
                signal_run(run, libc::SIGTERM);
                self.deadlines.schedule(
                    now + grace,
                    Deadline::Escalate {
                        id,
                        run: agent.run_number,
                    },
                );
            }
        }
        // A launch still in flight is killed as soon as it lands.
    }

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
                        let peer_ns = peer_cred(&stream)
                            .ok()
                            .and_then(|peer| pid_namespace_of(peer.pid));
                        if peer_ns != Some(expected) {
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
}

/// Applies one status line to an agent.
fn apply_status(agent: &mut Agent, status: Status, io: &mut Io<'_>) {
    match status {
        Status::Ready { .. } => {
            agent.outcome.ready = true;
            if agent.stop.is_none() {
                agent.state = AgentState::Running;
            }
            if let Some(reply_to) = agent.spawn_reply.take() {
                let reply = SpawnReply {
                    success: true,
                    id: agent.id,
                    name: agent.name.clone(),
                    pid: agent.run.as_ref().map_or(0, |r| r.pid as u32),
                    status: agent.state,
                    isolation: agent.isolation.clone(),
                };
                io.replies
                    .push((reply_to, agentos_proto::payload::to_json(&reply)));
            }
            log::info!("agent {} ({}): running", agent.id, agent.name);
        }
        Status::Error { code, message } => agent.outcome.start_error = Some((code, message)),
        Status::Exited(code) => agent.outcome.exit_code = Some(code),
        Status::Signaled(signal) => agent.outcome.signal = Some(signal),
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

/// Config files sandboxes must not see.
fn config_files(config: &Config) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(crate::config::DEFAULT_CONFIG_PATH)];
    files.extend(config.file.clone());
    files
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(err) => Err(io::Error::new(
            err.kind(),
            format!("cannot create {}: {err}", dir.display()),
        )),
    }
}

/// The inode of a process's pid namespace.
fn pid_namespace_of(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
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

/// How an init process ended.
enum InitEnd {
    Exited(i32),
    Signaled(i32),
}

/// Reaps the process behind `pidfd` (waiting for it if `block`).
fn wait_pidfd(pidfd: &OwnedFd, block: bool) -> Option<InitEnd> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    // SAFETY: waitid on a pidfd we own, with a valid siginfo pointer.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            flags,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: waitid filled in a SIGCHLD siginfo; these accessors read it.
    let (code, status) = unsafe { (info.si_code, info.si_status()) };
    match code {
        libc::CLD_EXITED => Some(InitEnd::Exited(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => Some(InitEnd::Signaled(status)),
        _ => None,
    }
}

/// Sends `signal` to a run's init, which passes SIGTERM on to the whole
/// workload (and whose death by SIGKILL ends its PID namespace).
fn signal_run(run: &Run, signal: i32) {
    // SAFETY: pidfd_send_signal on a pidfd we own.
    unsafe { pidfd_signal(run.pidfd.as_raw_fd(), signal) };
}

/// pidfd_send_signal(2).
///
/// # Safety
/// `pidfd` must be a pidfd.
unsafe fn pidfd_signal(pidfd: RawFd, signal: i32) {
    // SAFETY: the caller passes a pidfd; the info pointer may be NULL.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}
