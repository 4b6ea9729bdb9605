//! EXEC: agent-written code run in pooled, isolated sandboxes. Only what a
//! run prints comes back, each stream capped in fixed memory ([`output`]).
//!
//! An exec host (`exec_host`, started and replaced by `hosts`) is a
//! sandbox of the runtime (the exec-host shape) whose workload is a Python
//! zygote ([`zygote`]): it keeps run children forked from its warm image,
//! each already isolated and waiting for code, and hands them to the kernel
//! over the channel its claim brought ([`wire`]). A request waits
//! (`waiting`) until `dispatch` gives it the oldest ready child
//! (`child`), which is sent the order and answers once it has said how it
//! ended and its output pipes have closed (`order`); a child serves one
//! run and is gone, and the host prepares another. A timeout kills the
//! run's whole PID namespace through the pidfd the child sent first. Each
//! run has a cgroup of its own (`run_cgroup`), made ahead of need off the
//! reactor (`cgroups`), with limits within its caller's ([`limits`]); an
//! agent's runs have theirs inside the agent's own cgroup, so what they use
//! adds up against the agent's limits. Sessions keep their child, and their
//! snapshots (`snapshots`), from run to run (`sessions`).
//!
//! EXEC is shared fairly between owners ([`queues`]): each agent tree and
//! each operator has a queue of its own, served in turn, with a cap on the
//! runs one owner holds and room always kept for operators. An owner's
//! work ends with it (`ending`): a closed connection's runs, an ended
//! agent's runs and sessions.
//!
//! This file holds [`Exec`] and the requests it takes; the files that add
//! to it (`admission`, `dispatch`, `hosts`, `sessions`, `ending`, and
//! `network`: a run's policy held to its owner's when it starts) build on
//! the others, which never name it. Everything here runs on the reactor
//! thread and never blocks.

mod admission;
mod cgroups;
mod child;
mod counts;
mod dispatch;
mod ending;
mod exec_host;
pub mod files;
mod hosts;
pub mod limits;
mod network;
mod order;
pub mod output;
pub mod queues;
mod run_cgroup;
mod sessions;
mod snapshots;
mod waiting;
pub mod wire;
pub mod zygote;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_proto::payload::{ExecReply, ExecRequest, Language, Limits};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Registry, Token};
use slab::Slab;

use crate::address::{Adopted, Reply, ReplyTo};
use crate::cgroup::{CgroupLimits, Cgroups};
use crate::config::Config;
use crate::identity::Principal;
use crate::network::policy::Policy;
use crate::network::record::Record;
use crate::network::Gateway;
use crate::sandbox::runtime::Sandboxes;
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;
use crate::timers::Timers;
use cgroups::RunCgroups;
use child::{RunChild, Stage};
use exec_host::ExecHost;
pub use exec_host::HostId;
use limits::RunDefaults;
use order::{Kill, Order};
use output::Stream;
pub use queues::Share;
use queues::{Caps, Queues};
use run_cgroup::AgentRunCgroups;
pub use run_cgroup::ChargedTo;
use snapshots::Snapshots;
use waiting::{RunAsk, Session, SessionKey, Waiting};
use zygote::ExecHostSetup;

/// How many tokens EXEC's sources may take, from its base.
pub const TOKEN_SPAN: usize = 1 << 40;
/// Requests that may wait for a run child, from everyone; beyond this,
/// `busy`.
const MAX_WAITING: usize = 1024;
/// Of those, from one owner (its sessions' queues included)...
const MAX_WAITING_PER_OWNER: usize = 256;
/// ...and kept for operators: agents cannot fill the queues.
const OPERATOR_WAITING: usize = 256;
/// Sessions lost to the memory controller remembered for their owners.
const MAX_LOST_SESSIONS: usize = 1024;

/// What one of EXEC's tokens stands for.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// A host's channel, by the host's key.
    Channel(usize),
    /// A run child's socket, by the child's key.
    Socket(usize),
    /// One of a run child's output pipes.
    Output(usize, Stream),
}

/// What one of EXEC's timers is for.
#[derive(Clone, Debug)]
enum Wake {
    /// A run's timeout, if it is still that run.
    Timeout { child: usize, started: Instant },
    /// Start the hosts that are missing.
    StartHosts,
    /// Close a session unused since `last_used`, if it still is.
    SessionIdle { key: SessionKey, last_used: Instant },
    /// Answer the waiting requests whose deadline has passed.
    WaitedTooLong,
}

/// Who asks for a run.
#[derive(Clone, Debug)]
pub struct RunCaller {
    /// Whose work it is: the owner of the sessions it reaches.
    pub principal: Principal,
    /// Whose share of EXEC it counts against.
    pub share: Share,
    /// Its own limits, which bound the run's (an operator has none).
    pub limits: Limits,
    /// The agent cgroup its runs are charged under, if it is an agent's
    /// (or an agent's run's) work.
    pub charged_to: Option<ChargedTo>,
    /// The network policy its run gets, if it gets one (the run's grant's).
    pub policy: Option<Policy>,
    /// The connection record of the agent whose work it is, if it has one:
    /// its runs' connections count there too.
    pub net_record: Option<Arc<Mutex<Record>>>,
    /// The agent whose work it is, for the span.
    pub agent: Option<SpanAgent>,
}

/// The EXEC subsystem.
#[derive(Debug)]
pub struct Exec {
    /// The egress proxy, for runs with a network policy.
    gateway: Arc<Gateway>,
    /// What the metrics say of EXEC.
    counts: counts::ExecCounts,
    /// Where runs' spans go.
    tracer: Arc<Tracer>,
    registry: Registry,
    token_base: usize,
    sources: Slab<Source>,
    hosts: Slab<ExecHost>,
    next_host: HostId,
    wanted_hosts: usize,
    children: Slab<RunChild>,
    /// Ready children, oldest first.
    ready: VecDeque<usize>,
    /// Requests waiting for a ready child, by owner.
    queues: Queues<Waiting>,
    /// Whether sessions' queued runs were served before the queues last
    /// time room came (the two take turns).
    sessions_first: bool,
    sessions: HashMap<SessionKey, Session>,
    /// Sessions whose idle interpreter the memory controller killed, until
    /// their owner names them again and is told (at most
    /// [`MAX_LOST_SESSIONS`] remembered).
    lost_to_memory: HashSet<SessionKey>,
    /// Cgroups inside agents' own for their runs, by agent.
    agent_cgroups: HashMap<u32, AgentRunCgroups>,
    /// Sessions' snapshots.
    snapshots: Snapshots,
    session_idle: Duration,
    max_sessions: usize,
    /// Sessions all owners together may hold.
    max_sessions_total: usize,
    timers: Timers<Wake>,
    /// Runs' own connections to the kernel, for the reactor to admit.
    adopted: Vec<Adopted>,
    setup: ExecHostSetup,
    /// Each host's cgroup: room for its zygote and every prepared run.
    host_limits: CgroupLimits,
    /// Makes and removes runs' own cgroups (none without cgroups).
    run_cgroups: Option<RunCgroups>,
    /// A run's limits when it asks for none.
    run_defaults: RunDefaults,
    /// Ready children to keep with a shell started, while bash runs come.
    ready_shells: usize,
    /// When the last bash run came, if one has.
    last_bash: Option<Instant>,
    log: PathBuf,
    output_bytes: usize,
    max_file_bytes: u64,
    default_timeout: Duration,
    /// Why EXEC cannot work on this host, if it cannot.
    unavailable: Option<String>,
    shutting_down: bool,
    /// Runs accepted from each agent (for LIST), by agent id.
    runs_by_agent: HashMap<u32, u64>,
    /// Owners' policies as NET `set` last replaced them, while their work
    /// lasts: queued runs are held to them when they start.
    policies_now: HashMap<Principal, Policy>,
}

impl Exec {
    /// EXEC as configured; hosts start with [`Exec::start_hosts`]. Its
    /// sources are registered with `registry` from `token_base` on. With
    /// `cgroups`, each run gets a cgroup of its own, made in the
    /// background, which wakes `waker`.
    pub fn new(
        config: &Config,
        registry: &Registry,
        token_base: usize,
        namespaces: bool,
        cgroups: Option<Arc<Cgroups>>,
        waker: Arc<mio::Waker>,
        tools_dir: Option<PathBuf>,
    ) -> io::Result<Exec> {
        let exec = &config.exec;
        let unavailable = if !namespaces {
            Some(
                "EXEC needs namespaces for its isolation, and this host gives the daemon none"
                    .to_owned(),
            )
        } else if !exec.python.exists() {
            Some(format!(
                "exec.python ({}) does not exist",
                exec.python.display()
            ))
        } else {
            None
        };
        if let Some(reason) = &unavailable {
            log::warn!("EXEC unavailable: {reason}");
        }
        let run_defaults = RunDefaults {
            memory: exec.default_memory,
            max_pids: exec.default_max_pids,
        };
        let run_cgroups = match cgroups.filter(|_| unavailable.is_none()) {
            Some(cgroups) => Some(RunCgroups::start(
                cgroups,
                run_defaults.cgroup_limits(),
                waker,
            )?),
            None => None,
        };
        Ok(Exec {
            registry: registry.try_clone()?,
            token_base,
            sources: Slab::new(),
            hosts: Slab::new(),
            next_host: 1,
            wanted_hosts: if unavailable.is_some() { 0 } else { exec.hosts },
            children: Slab::new(),
            ready: VecDeque::new(),
            queues: Queues::new(Caps::for_slots(
                exec.hosts * exec.ready_runs,
                exec.max_running_per_owner,
            )),
            sessions_first: false,
            sessions: HashMap::new(),
            lost_to_memory: HashSet::new(),
            agent_cgroups: HashMap::new(),
            snapshots: Snapshots::new(exec.snapshot_bytes, exec.snapshot_bytes_total),
            runs_by_agent: HashMap::new(),
            policies_now: HashMap::new(),
            session_idle: Duration::from_secs(exec.session_idle_secs),
            max_sessions: exec.max_sessions,
            max_sessions_total: exec.max_sessions_total,
            timers: Timers::default(),
            adopted: Vec::new(),
            setup: ExecHostSetup {
                python: exec.python.clone(),
                ready_runs: exec.ready_runs,
                tmp_bytes: config.agents.tmp_bytes,
                workspace_bytes: config.agents.workspace_bytes,
                tools_dir,
            },
            host_limits: {
                let share = exec.ready_runs as u64 + 1;
                CgroupLimits {
                    memory: exec.default_memory.saturating_mul(share),
                    cpu_quota: None,
                    cpu_period: 100_000,
                    max_pids: exec.default_max_pids.saturating_mul(share),
                }
            },
            run_cgroups,
            run_defaults,
            ready_shells: exec.ready_shells,
            last_bash: None,
            log: config.agents.log_dir().join("exec-host.log"),
            output_bytes: exec.output_bytes,
            max_file_bytes: exec.max_file_bytes,
            default_timeout: Duration::from_millis(exec.default_timeout_ms),
            unavailable,
            gateway: Arc::new(Gateway::without_proxy()),
            counts: counts::ExecCounts::default(),
            tracer: Arc::new(Tracer::default()),
            shutting_down: false,
        })
    }

    /// The `tools` package has changed: each host's zygote imports it
    /// again, and the children it prepared with the old one are replaced
    /// (sessions keep theirs).
    pub fn tools_changed(&mut self) {
        for (_, host) in &self.hosts {
            if let Some((channel, _)) = &host.channel {
                if let Err(err) = wire::send_reload_tools(channel.as_fd()) {
                    log::debug!("exec host {}: cannot tell it of new tools: {err}", host.id);
                }
            }
        }
        let ready: Vec<usize> = self.ready.drain(..).collect();
        for child in ready {
            if let Some(run) = self.children.get_mut(child) {
                run.kill_quietly();
            }
            self.drop_child(child);
        }
    }

    /// What the run whose reply goes to `reply_to` has printed so far
    /// (within `max` bytes), while it runs.
    pub fn output_so_far(&self, reply_to: ReplyTo, max: usize) -> Option<String> {
        self.children.iter().find_map(|(_, run)| match &run.stage {
            Stage::Running(running) if running.reply_to == reply_to => {
                Some(running.output_so_far(max))
            }
            _ => None,
        })
    }

    /// A TOOL call made on the kernel connection of run `number` was
    /// answered with `bytes`: the run's reply counts it.
    pub fn tool_delivered(&mut self, number: u64, bytes: usize) {
        let running = self
            .children
            .iter_mut()
            .find_map(|(_, child)| match &mut child.stage {
                Stage::Running(running) if running.of.run == Some(number) => Some(running),
                _ => None,
            });
        if let Some(running) = running {
            running.tool_calls += 1;
            running.tool_bytes += bytes as u64;
        }
    }

    /// Runs' connections to the kernel made since the last call, each
    /// tagged with its run's number.
    pub fn take_adopted(&mut self) -> Vec<Adopted> {
        std::mem::take(&mut self.adopted)
    }

    /// Whether runs' connections wait for the reactor.
    pub fn has_adopted(&self) -> bool {
        !self.adopted.is_empty()
    }

    /// Whether EXEC can serve runs on this host.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// Whether a token is one of EXEC's.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKEN_SPAN).contains(&token.0)
    }

    /// What a run sees of the filesystem beyond its private `/tmp` and
    /// `/workspace`, as the binds of its host's sandbox (the exec-host
    /// shape's own aside).
    pub fn host_binds(&self) -> Vec<crate::sandbox::spec::Bind> {
        zygote::binds(&self.setup)
    }

    /// Runs with a network policy are served by `gateway`'s proxy
    /// (without one, such runs are refused).
    pub fn serve_policies_with(&mut self, gateway: Arc<Gateway>) {
        self.gateway = gateway;
    }

    /// The interpreter runs use.
    pub fn python(&self) -> &std::path::Path {
        &self.setup.python
    }

    /// A run's cgroup limits: what `asked` asks for, else the defaults —
    /// never more than `caller`'s own.
    pub fn run_limits(
        &self,
        caller: &RunCaller,
        asked: Option<&Limits>,
    ) -> Result<CgroupLimits, ErrorReply> {
        limits::run_limits(&caller.limits, asked, self.run_defaults)
    }

    /// A run request; `run` is its number, whose principal its own kernel
    /// connection speaks for. Refusals come back at once; otherwise the
    /// reply is pushed to `replies` when the run ends.
    pub fn run(
        &mut self,
        request: ExecRequest,
        caller: RunCaller,
        run: u64,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        if let Some(reason) = &self.unavailable {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("EXEC is unavailable: {reason}"),
            ));
        }
        if self.shutting_down {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "the kernel is shutting down",
            ));
        }
        files::check(&request.files, self.max_file_bytes)?;
        if request.limits.is_some() && self.run_cgroups.is_none() {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "EXEC field `limits`: this host gives the kernel no cgroups, so a run cannot \
                 have limits of its own",
            ));
        }
        let limits = self.run_limits(&caller, request.limits.as_ref())?;
        self.may_wait(caller.share)?;
        let now = Instant::now();
        if request.language == Language::Bash {
            self.last_bash = Some(now);
        }
        let timeout = request
            .timeout_ms
            .map_or(self.default_timeout, Duration::from_millis);
        let deadline = now + timeout;
        let session = request.session.clone().map(|name| (caller.principal, name));
        if let Some(lost) = session
            .as_ref()
            .filter(|k| self.lost_to_memory.contains(*k))
        {
            // Told once: the run after this one opens a new session.
            self.lost_to_memory.remove(lost);
            let reply = ExecReply {
                oom_killed: true,
                error: Some(format!(
                    "session {:?} ended while it waited: its interpreter was killed for memory \
                     (the run's limit, or its agent's, which its runs and sessions share); \
                     this run did not start, and the next one opens a new session",
                    lost.1
                )),
                code: Some(ErrorCode::NotFound),
                session: Some(lost.1.clone()),
                ..ExecReply::default()
            };
            replies.push((reply_to, reply.into()));
            return Ok(());
        }
        // A session's runs all ask the same of their connection as the run
        // that opened it.
        if let Some(key) = &session {
            let opened = self
                .sessions
                .get(key)
                .map(|open| open.grant.clone())
                .or_else(|| self.opening_grant(key));
            if opened.is_some_and(|grant| grant != RunAsk::of(&request)) {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!(
                        "EXEC field `permissions`: session {:?} was opened by a run that asked \
                         for other permissions (or network); its runs must all ask the same \
                         (close it to open one with others)",
                        key.1
                    ),
                ));
            }
        }
        // A run for a session neither open nor about to open (by a run
        // already waiting) opens one.
        let opens_session = session.as_ref().is_some_and(|key| {
            !self.sessions.contains_key(key)
                && !self.queues.iter().any(|w| w.session.as_ref() == Some(key))
        });
        if opens_session {
            self.may_open_session(caller.principal)?;
        }
        if let Principal::Agent { id } = caller.principal {
            *self.runs_by_agent.entry(id).or_default() += 1;
        }
        let span = self.open_run_span(&request, run, caller.agent.as_ref());
        let waiting = Waiting {
            request,
            reply_to,
            owner: caller.principal,
            share: caller.share,
            run: Some(run),
            charged_to: caller.charged_to,
            limits,
            timeout,
            deadline,
            session: session.clone(),
            order: Order::Run,
            carried: None,
            queued_at: now,
            policy: caller.policy,
            net_record: caller.net_record,
            span,
        };
        match session.filter(|key| self.sessions.contains_key(key)) {
            Some(key) => {
                if let Some(open) = self.sessions.get_mut(&key) {
                    open.queue.push_back(waiting);
                }
                self.serve_session(&key, replies, now);
            }
            None => {
                self.queues.push_back(caller.share, waiting);
                self.dispatch(replies, now);
            }
        }
        self.expire_if_still_waiting(reply_to, deadline);
        Ok(())
    }

    /// Spans of runs go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// The span of run `run` for `request`, with tracing on: under the
    /// request's `trace`, if it names one.
    fn open_run_span(
        &self,
        request: &ExecRequest,
        run: u64,
        agent: Option<&SpanAgent>,
    ) -> Option<OpenSpan> {
        let parent = request.trace.as_deref().and_then(TraceContext::parse);
        let language = match request.language {
            Language::Python => "python",
            Language::Bash => "bash",
        };
        let mut span = self.tracer.open(
            format!("exec {language}"),
            SpanKind::Internal,
            parent.as_ref(),
        )?;
        span.agent(agent);
        span.text("agentos.exec.language", language);
        span.int("agentos.exec.run", run as i64);
        if let Some(session) = &request.session {
            span.text("agentos.exec.session", session.clone());
        }
        Some(span)
    }

    /// Adds EXEC's series to the kernel's metrics.
    pub fn add_metrics(&self, snapshot: &mut crate::telemetry::metrics::Snapshot) {
        self.counts.add_to(snapshot);
    }

    /// Run children prepared and waiting for code.
    pub fn ready_runs(&self) -> usize {
        self.ready.len()
    }

    /// EXEC runs accepted from `agent`, its tasks' included.
    pub fn runs_by(&self, agent: u32) -> u64 {
        self.runs_by_agent.get(&agent).copied().unwrap_or(0)
    }

    /// Readiness of one of EXEC's tokens.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>) {
        let now = Instant::now();
        let Some(source) = self.sources.get(token.0 - self.token_base).copied() else {
            return;
        };
        match source {
            Source::Channel(host) => self.take_children(host, replies, now),
            Source::Socket(child) => {
                let Some(run) = self.children.get_mut(child) else {
                    return;
                };
                match run.stage {
                    Stage::Preparing => match run.receive_pidfd() {
                        Ok(true) => self.child_ready(child, replies, now),
                        Ok(false) => {}
                        Err(_) => self.drop_child(child),
                    },
                    Stage::Ready => {
                        // A waiting child says nothing: this is its close
                        // (its host ended).
                        if run.has_hung_up() {
                            self.child_gone(child, replies);
                        }
                    }
                    Stage::Running(_) => {
                        let unsent = run.flush().unwrap_or_else(|err| {
                            log::debug!("exec run: cannot send the order: {err}");
                            run.kill(Kill::Unsent);
                            false
                        });
                        run.read_socket();
                        if run.overflowed() {
                            run.kill_quietly();
                        }
                        self.watch_writable(child, unsent);
                        self.finish_if_done(child, replies, now);
                    }
                    Stage::Renewing => match run.receive_pipes() {
                        Ok(true) => self.renewed(child, replies, now),
                        Ok(false) => {}
                        Err(_) => {
                            run.kill_quietly();
                            self.child_gone(child, replies);
                        }
                    },
                    Stage::Ended => {}
                }
            }
            Source::Output(child, stream) => {
                if let Some(run) = self.children.get_mut(child) {
                    if run.read_stream(stream) {
                        self.forget_output(child, stream);
                    }
                    self.finish_if_done(child, replies, now);
                }
            }
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.timers.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        while let Some(wake) = self.timers.pop_due(now) {
            match wake {
                Wake::Timeout { child, started } => {
                    if let Some(run) = self.children.get_mut(child) {
                        let timeout = match &run.stage {
                            Stage::Running(r) if r.started == started => Some(r.timeout),
                            _ => None,
                        };
                        if let Some(timeout) = timeout {
                            run.kill(Kill::Timeout(timeout));
                        }
                    }
                }
                Wake::StartHosts => self.start_hosts(sandboxes, now),
                Wake::WaitedTooLong => self.expire_waiting(replies, now),
                Wake::SessionIdle { key, last_used } => {
                    let idle = self
                        .sessions
                        .get(&key)
                        .is_some_and(|s| !s.busy && s.last_used == last_used);
                    if idle {
                        log::debug!("exec session {:?} closed after being idle", key.1);
                        self.close(key.0, &key.1, replies);
                    }
                }
            }
        }
    }
}
