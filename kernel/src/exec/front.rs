//! EXEC as the kernel sees it, [`Exec`]: runs and session orders are
//! admitted here (is EXEC available, are the files and limits within
//! bounds, has the owner room to wait) and handed to the [`Dispatcher`];
//! an owner's work ends here with it: a closed connection's runs, an
//! ended agent's runs and sessions.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_egress::policy::Policy;
use agentos_egress::Gateway;
use agentos_primitives::timers::Timers;
use agentos_proto::payload::{
    ExecRequest, FileCall, Language, Lifetime, Limits, ProcCall, ProcessesReply, PtySize,
    SessionInfo,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Registry, Token};

use super::backlog::{Backlog, SessionOp};
use super::dirs::ExecDirs;
use super::disk_work::DiskWork;
use super::disks::SessionDisks;
use super::dispatch::Dispatcher;
use super::exec_cgroups::ExecCgroups;
use super::exec_host::HostId;
use super::lifetimes::Lifetimes;
use super::limits::RunDefaults;
use super::network::RunNetwork;
use super::order::{open_for_runs, Kill, Order, OrderCaps, Running};
use super::pool::Pool;
use super::procs::{Answered, Procs};
use super::session_meta::Ends;
use super::sources::PROCS_TOKENS;
use super::spans::RunSpans;
use super::waiting::{RunCaller, SessionKey, Waiting};
use super::{files, zygote};
use crate::address::{Answer, Reply, ReplyTo};
use crate::cgroup::{CgroupLimits, Cgroups, Freezer};
use crate::config::Config;
use crate::identity::Principal;
use crate::sandbox::runtime::{SandboxEvent, Sandboxes};
use crate::telemetry::tracer::Tracer;

/// The EXEC subsystem.
#[derive(Debug)]
pub struct Exec {
    /// What runs: its hosts, children, queues and sessions.
    dispatcher: Dispatcher,
    /// Why EXEC cannot work on this host, if it cannot.
    unavailable: Option<String>,
    /// Runs accepted from each agent (for LIST), by agent id.
    runs_by_agent: HashMap<u32, u64>,
    /// Processes started in sessions.
    procs: Procs,
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
        dirs: ExecDirs,
    ) -> io::Result<Exec> {
        let exec = &config.exec;
        let unavailable = zygote::unavailable(&exec.python, namespaces);
        if let Some(reason) = &unavailable {
            log::warn!("EXEC unavailable: {reason}");
        }
        let available = unavailable.is_none();
        let cgroups = cgroups.filter(|_| available);
        let mut disks = SessionDisks::start(config, &dirs.state, Arc::clone(&waker));
        if config.fleet.database.is_some() && disks.available() {
            let exec = &config.exec;
            (disks.fleet_staging).turn_on(exec.snapshot_bytes, exec.template_disk_bytes);
        }
        let dispatcher = Dispatcher {
            pool: Pool::new(config, registry, token_base, dirs.tools, available)?,
            backlog: Backlog::new(exec, disks),
            cgroups: ExecCgroups::start(cgroups, RunDefaults::of(exec), waker)?,
            network: RunNetwork::default(),
            spans: RunSpans::default(),
            timers: Timers::default(),
            lifetimes: Lifetimes::default(),
            caps: OrderCaps::new(exec),
            shutting_down: false,
        };
        let mut exec = Exec {
            dispatcher,
            unavailable,
            runs_by_agent: HashMap::new(),
            procs: Procs::new(registry, token_base + PROCS_TOKENS)?,
        };
        // Stored sessions' lifetimes run on (or ended while the kernel was
        // down: at once).
        let records = exec.dispatcher.backlog.disks().store.stored.records();
        let ends: Vec<(SessionKey, Ends)> = (records.iter())
            .filter_map(|(key, record)| Some((key.clone(), record.meta.ends?)))
            .collect();
        for (key, ends) in ends {
            exec.dispatcher.lifetime_set(&key, Some(ends));
        }
        Ok(exec)
    }

    /// The exec hosts and their run children (what runs have printed,
    /// their connections, their figures).
    pub fn pool(&self) -> &Pool {
        &self.dispatcher.pool
    }

    /// The pool, to take runs' connections from or count their tool calls.
    pub fn pool_mut(&mut self) -> &mut Pool {
        &mut self.dispatcher.pool
    }

    /// Sessions' and templates' disks.
    pub fn disks(&mut self) -> &mut DiskWork {
        self.dispatcher.backlog.disks()
    }

    /// The `tools` package has changed: each host's zygote imports it
    /// again, and the children it prepared with the old one are replaced,
    /// those warm with a template too (sessions keep theirs).
    pub fn tools_changed(&mut self) {
        self.dispatcher.pool.tools_changed(&self.dispatcher.cgroups);
        self.dispatcher
            .backlog
            .disks()
            .let_warm_go(self.dispatcher.pool.children());
    }

    /// Whether EXEC can serve runs on this host.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// What a run sees of the filesystem beyond its private `/tmp` and
    /// `/workspace`: its host's sandbox's binds (its shape's own aside).
    pub fn host_binds(&self) -> Vec<crate::sandbox::spec::Bind> {
        zygote::binds(self.dispatcher.pool.setup())
    }

    /// Runs with a network policy are served by `gateway`'s proxy
    /// (without one, such runs are refused); spans of runs go to `tracer`.
    pub fn connect(&mut self, gateway: Arc<Gateway>, tracer: Arc<Tracer>) {
        self.dispatcher.network.serve_with(gateway);
        self.dispatcher.spans.trace_with(tracer);
    }

    /// A run's cgroup limits: what `asked` asks for, else the defaults —
    /// never more than `caller`'s own.
    pub fn run_limits(
        &self,
        caller: &RunCaller,
        asked: Option<&Limits>,
    ) -> Result<CgroupLimits, ErrorReply> {
        self.dispatcher.cgroups.limits(&caller.limits, asked)
    }

    /// EXEC runs accepted from `agent`, its tasks' included.
    pub fn runs_by(&self, agent: u32) -> u64 {
        self.runs_by_agent.get(&agent).copied().unwrap_or(0)
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
        open_for_runs(self.unavailable.as_deref(), self.dispatcher.shutting_down)?;
        files::check(&request.files, self.dispatcher.caps.max_file_bytes)?;
        let asked = request.limits.as_ref();
        let limits = self.dispatcher.cgroups.for_request(&caller.limits, asked)?;
        self.dispatcher.backlog.may_wait(caller.share)?;
        let now = Instant::now();
        if request.language == Language::Bash {
            self.dispatcher.pool.bash_came(now);
        }
        let timeout = self.dispatcher.caps.timeout(request.timeout_ms);
        if let Some(name) = &request.session {
            let key = (caller.principal, name.clone());
            if let Some(lost) = self
                .dispatcher
                .backlog
                .admit(&key, &request, caller.share)?
            {
                replies.push((reply_to, lost.into()));
                return Ok(());
            }
        }
        if let Principal::Agent { id } = caller.principal {
            *self.runs_by_agent.entry(id).or_default() += 1;
        }
        let span = self
            .dispatcher
            .spans
            .open(&request, run, caller.agent.as_ref());
        let asked = (&request, caller.principal, reply_to);
        let template = self.dispatcher.backlog.disks().template_for(asked)?;
        let volumes = self
            .dispatcher
            .backlog
            .disks()
            .volumes_for((asked.0, asked.1), run)?;
        let mut waiting = Waiting::new(request, caller, reply_to, limits, timeout, now);
        waiting.template = template;
        waiting.volumes = volumes;
        waiting.run = Some(run);
        waiting.span = span;
        self.dispatcher.queue(waiting, replies, now);
        // A request that could not start at once is answered at its
        // deadline if it is still waiting then.
        self.dispatcher.expire_if_waiting(reply_to, now + timeout);
        Ok(())
    }

    /// Readiness of one of EXEC's tokens.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>) {
        if self.procs.owns(token) {
            return self.procs.on_event(token, replies, Instant::now());
        }
        self.dispatcher.on_event(token, replies);
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        let procs = self.procs.next_deadline(now);
        self.dispatcher
            .next_deadline(now)
            .into_iter()
            .chain(procs)
            .min()
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let procs = &self.procs;
        let in_use = |key: &SessionKey, since: Instant| procs.in_use(key, since);
        self.dispatcher
            .on_deadlines(sandboxes, in_use, replies, now);
        self.procs.on_deadlines(now, replies);
    }

    /// A process op on one of `caller`'s sessions (see [`Procs`]): answered
    /// now, or later (`None`).
    pub fn proc_call(
        &mut self,
        caller: RunCaller,
        call: ProcCall,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Answered {
        let now = Instant::now();
        let key = (caller.principal, call.session().to_owned());
        // What it printed, and how it ended, outlive a session's end a while.
        let reads = matches!(call, ProcCall::Processes { .. } | ProcCall::Output(_));
        if !(reads && self.procs.knows(&key)) {
            self.session_for_procs(&key)?;
        }
        match call {
            ProcCall::Start(start) => {
                let (sessions, _) = self.dispatcher.backlog.sessions_and_disks();
                let env = (sessions.meta(&key))
                    .map(|m| m.env.clone())
                    .unwrap_or_default();
                let interpreter = sessions.interpreter_of(&key);
                // Before the start is taken: from then on it is answered
                // by the steward, or by its end.
                let limits = self.session_limits(&key, &caller)?;
                let of = (&key, interpreter);
                let new_steward = self.procs.start(of, *start, &env, reply_to, replies)?;
                self.fork_steward(&key, caller, new_steward, limits, replies, now);
                Ok(None)
            }
            ProcCall::Processes { .. } => Ok(Some(Answer::json(&ProcessesReply {
                success: true,
                processes: self.procs.processes(&key),
            }))),
            ProcCall::Output(output) => {
                let quota = caller.principal.quota_owner();
                self.procs.output(&key, output, quota, reply_to, now)
            }
            ProcCall::Input(input) => self.procs.input(&key, input),
            ProcCall::Signal(signal) => {
                let which = signal.process()?;
                (self.procs).signal(&key, which, signal.signal, reply_to, replies)
            }
            ProcCall::Resize(resize) => {
                let size = PtySize {
                    cols: resize.cols,
                    rows: resize.rows,
                };
                self.procs.resize(&key, resize.process()?, size)
            }
        }
    }

    /// A file op in one of `caller`'s sessions, carried out by its
    /// steward: answered later.
    pub fn file_call(
        &mut self,
        caller: RunCaller,
        call: FileCall,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Answered {
        let key = (caller.principal, call.session().to_owned());
        self.session_for_procs(&key)?;
        // A watch's events are the kernel's; the steward is only told of
        // its end.
        match call {
            FileCall::Events(events) => {
                let quota = caller.principal.quota_owner();
                return (self.procs).events(&key, events, quota, reply_to, Instant::now());
            }
            FileCall::Unwatch(unwatch) => return self.procs.unwatch(&key, &unwatch.watch, replies),
            _ => {}
        }
        let limits = self.session_limits(&key, &caller)?;
        let interpreter = self
            .dispatcher
            .backlog
            .sessions_and_disks()
            .0
            .interpreter_of(&key);
        let new_steward = self
            .procs
            .file((&key, interpreter), &call, reply_to, replies)?;
        self.fork_steward(&key, caller, new_steward, limits, replies, Instant::now());
        Ok(None)
    }

    /// Has session `key`'s interpreter fork its steward on `socket`, if
    /// there is one (a new steward's), when the session's turn comes
    /// (behind a run going, if one is).
    fn fork_steward(
        &mut self,
        key: &SessionKey,
        caller: RunCaller,
        socket: Option<OwnedFd>,
        limits: CgroupLimits,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        if socket.is_none() {
            return;
        }
        let timeout = self.dispatcher.caps.default_timeout;
        let order = Order::Steward { socket };
        let mut waiting =
            Waiting::for_session(key, caller, order, ReplyTo::Nobody, limits, timeout, now);
        // The template the session was opened from: its programs are on
        // the processes' PATH.
        let asked = (&waiting.request, key.0, ReplyTo::Nobody);
        waiting.template = self
            .dispatcher
            .backlog
            .disks()
            .template_for(asked)
            .ok()
            .flatten();
        self.dispatcher.queue(waiting, replies, now);
    }

    /// The limits of the kernel's own orders to session `key`: those it
    /// was opened with (an order applies its limits to the session's
    /// cgroup), else `caller`'s defaults.
    fn session_limits(
        &mut self,
        key: &SessionKey,
        caller: &RunCaller,
    ) -> Result<CgroupLimits, ErrorReply> {
        let (sessions, _) = self.dispatcher.backlog.sessions_and_disks();
        match sessions.orders_as(key) {
            Some((_, limits, _)) => Ok(limits),
            None => self.dispatcher.cgroups.limits(&caller.limits, None),
        }
    }

    /// `Ok` if session `key` is open and running, so processes may be
    /// started in it or reached: `not_found` if there is no such session
    /// of the caller's, `unavailable` if it is paused or stored.
    fn session_for_procs(&mut self, key: &SessionKey) -> Result<(), ErrorReply> {
        open_for_runs(self.unavailable.as_deref(), self.dispatcher.shutting_down)?;
        let backlog = &mut self.dispatcher.backlog;
        let why = if backlog.is_paused(key) {
            "it is paused: RESUME it first"
        } else if backlog.is_opening(key) {
            "it is being opened: retry once it is"
        } else if backlog.is_live(key) {
            return Ok(());
        } else if backlog.disks().store.stored.record(key).is_some() {
            "it is stored on its disk with no interpreter running: open it (or RESUME it) first"
        } else {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("no session {:?} of yours", key.1),
            ));
        };
        Err(ErrorReply::new(
            ErrorCode::Unavailable,
            format!("session {:?} has no processes to reach: {why}", key.1),
        ))
    }

    /// Asks the runtime for the hosts that are missing.
    pub fn start_hosts(&mut self, sandboxes: &mut impl Sandboxes<HostId>, now: Instant) {
        self.dispatcher.start_hosts(sandboxes, now);
    }

    /// Takes in what happened to a host's sandbox (see
    /// [`Dispatcher::on_sandbox`]).
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        now: Instant,
    ) {
        self.dispatcher.on_sandbox(sandboxes, event, now);
    }

    /// What the disks' and cgroups' threads have done since the last call
    /// (see [`Dispatcher::on_wake`]).
    pub fn on_wake(&mut self, replies: &mut Vec<Reply>) {
        self.dispatcher.on_wake(replies);
    }

    /// PAUSE (`frozen`) or RESUME of session `key` (see
    /// [`Dispatcher::freeze_session`]).
    pub fn freeze_session(
        &mut self,
        key: &SessionKey,
        frozen: bool,
        replies: &mut Vec<Reply>,
    ) -> Result<Freezer, ErrorReply> {
        let freezer = self.dispatcher.freeze_session(key, frozen, replies)?;
        // Its processes' timeouts, and its steward's time to answer, stand
        // still meanwhile.
        self.procs.frozen(key, frozen, Instant::now());
        Ok(freezer)
    }

    /// The owner's sessions (`op: sessions`): those with an interpreter,
    /// and those stored on their disks; with `usage`, what each one's
    /// sandbox uses.
    pub fn sessions(&self, owner: Principal, usage: bool) -> Vec<SessionInfo> {
        let children = self.dispatcher.pool.children();
        let figures = |child| {
            let used = usage.then(|| children.session_usage(child)).flatten();
            (children.workspace_bytes(child), used)
        };
        self.dispatcher.backlog.sessions(owner, figures)
    }

    /// Ends a session (`op: close`): its interpreter and its files go;
    /// a run of it still going is killed. Whether there was one.
    pub fn close(&mut self, owner: Principal, name: &str, replies: &mut Vec<Reply>) -> bool {
        self.dispatcher.close(&(owner, name.to_owned()), replies)
    }

    /// Sets session `key`'s lifetime from now, or clears it (`op:
    /// lifetime`): when it ends now.
    pub fn set_lifetime(
        &mut self,
        key: &SessionKey,
        lifetime: Option<Lifetime>,
    ) -> Result<Option<Ends>, ErrorReply> {
        self.dispatcher.set_lifetime(key, lifetime)
    }

    /// `op: snapshot` or `op: restore`, queued behind the session's runs
    /// (see [`Backlog::order_for`]): a snapshot is answered once the
    /// kernel has stored it; a restore gives the session a fresh
    /// interpreter on the snapshot's files and globals.
    pub fn session_order(
        &mut self,
        caller: RunCaller,
        session: &str,
        op: SessionOp<'_>,
        reply_to: ReplyTo,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let key = (caller.principal, session.to_owned());
        let limits = self.session_limits(&key, &caller)?;
        self.dispatcher.backlog.may_wait(caller.share)?;
        let share = caller.share;
        let Some(order) = self
            .dispatcher
            .backlog
            .order_for(&key, op, share, reply_to)?
        else {
            return Ok(());
        };
        let (now, timeout) = (Instant::now(), self.dispatcher.caps.default_timeout);
        let waiting = Waiting::for_session(&key, caller, order, reply_to, limits, timeout, now);
        // A hibernated session's wake opens it.
        self.dispatcher.queue(waiting, replies, now);
        Ok(())
    }

    /// Cancels the run whose reply goes to `reply_to`: one still waiting
    /// for a sandbox is dropped; a running one is killed (SIGKILL to PID 1
    /// of its namespace, so everything it started dies), and its reply
    /// still goes out, saying so. Returns whether there was one.
    pub fn cancel(&mut self, reply_to: ReplyTo, replies: &mut Vec<Reply>) -> bool {
        let waited = self.dispatcher.backlog.cancel(reply_to, replies);
        let children = self.dispatcher.pool.children_mut();
        let ran = children.kill_running(|r| r.reply_to == reply_to, Kill::Cancelled);
        waited || ran
    }

    /// A connection closed: the runs it asked for end with it — those
    /// waiting are answered (to no one) at once, those running are killed.
    pub fn connection_closed(&mut self, serial: u64, replies: &mut Vec<Reply>) {
        let of_it = |to: &ReplyTo| to.connection() == Some(serial);
        let (waiting, running) = (
            |w: &Waiting| of_it(&w.reply_to),
            |r: &Running| of_it(&r.reply_to),
        );
        let why = "the connection that asked for it closed";
        self.dispatcher.backlog.end_where(waiting, why, replies);
        (self.dispatcher.pool.children_mut()).kill_running(running, Kill::Cancelled);
        self.procs.connection_closed(serial);
    }

    /// `principal` has ended (an agent that exited, was killed or is
    /// restarting; a run whose reply has gone): its waiting and running
    /// runs end, and so do its sessions, with their snapshots. An agent's
    /// spare cgroups go with the cgroup they were made in. Its policy as
    /// NET `set` left it is forgotten: nothing of it waits to start.
    pub fn end_work_of(&mut self, principal: Principal, why: &str, replies: &mut Vec<Reply>) {
        let (waiting, running) = (
            |w: &Waiting| w.owner == principal,
            |r: &Running| r.of.owner == principal,
        );
        self.dispatcher.backlog.end_where(waiting, why, replies);
        (self.dispatcher.pool.children_mut()).kill_running(running, Kill::OwnerEnded);
        for name in self.dispatcher.backlog.end_owner(principal) {
            self.close(principal, &name, replies);
        }
        self.dispatcher.network.forget(principal);
        if let Principal::Agent { id } = principal {
            self.dispatcher.cgroups.forget_agent(id);
        }
    }

    /// NET `set` replaced the policies of `owners` (an agent's, and those
    /// of the runs under it, narrowed with it): the endpoints serving their
    /// runs and sessions are narrowed to lie within them, and their queued
    /// runs are held to them when they start.
    pub fn policies_replaced(&mut self, owners: Vec<(Principal, Policy)>) {
        let endpoints = self.dispatcher.pool.children_mut().endpoints_mut();
        self.dispatcher.network.replaced(owners, endpoints);
    }

    /// Stops taking runs: waiting ones are refused, running ones killed
    /// (their replies still go out), hosts stopped.
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
    ) {
        self.dispatcher.shutting_down = true;
        self.dispatcher.backlog.shut_down(replies);
        self.dispatcher.pool.stop(sandboxes);
    }

    /// Last step of shutdown (may block briefly): the runs' cgroups are
    /// removed, and whatever is left in them killed.
    pub fn finish_shutdown(&mut self) {
        self.dispatcher
            .cgroups
            .finish(self.dispatcher.pool.take_cgroups());
        self.dispatcher.backlog.disks().store.finish();
    }
}
