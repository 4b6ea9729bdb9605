//! The dispatcher, [`Exec`]: it holds EXEC's parts and does what takes
//! more than one of them. A request is admitted and waits in the backlog
//! (its owner's queue, or its session's) until the pool has a ready child
//! for it, within its owner's share; it is then sent with its cgroup
//! (`exec_cgroups`) and its network (`network`); its reply is built when
//! the child has ended, and the child let go or kept for its session. An
//! owner's work ends with it: a closed connection's runs, an ended agent's
//! runs and sessions. Everything here runs on the reactor thread and never
//! blocks.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_egress::policy::Policy;
use agentos_egress::Gateway;
use agentos_primitives::timers::Timers;
use agentos_proto::payload::{ExecRequest, Language, Limits, SessionInfo};
use agentos_proto::ErrorReply;
use mio::{Registry, Token};

use super::backlog::{Backlog, Closed, Idle, SessionOp};
use super::cgroups::MadeFor;
use super::children::Done;
use super::dirs::ExecDirs;
use super::disk_work::DiskWork;
use super::disks::SessionDisks;
use super::exec_cgroups::ExecCgroups;
use super::exec_host::HostId;
use super::hosts::HOST_RETRY;
use super::limits::RunDefaults;
use super::network::RunNetwork;
use super::order::{open_for_runs, Kill, Order, OrderCaps, Running};
use super::pool::{Event, Launch, Pool};
use super::spans::RunSpans;
use super::waiting::{RunCaller, SessionKey, Waiting};
use super::{files, zygote};
use crate::address::{Reply, ReplyTo};
use crate::cgroup::{CgroupLimits, Cgroups, Freezer};
use crate::config::Config;
use crate::identity::Principal;
use crate::sandbox::runtime::{SandboxEvent, Sandboxes};
use crate::telemetry::tracer::Tracer;

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

/// The EXEC subsystem.
#[derive(Debug)]
pub struct Exec {
    /// The exec hosts and their run children.
    pool: Pool,
    /// Requests waiting in their owners' queues, and sessions.
    backlog: Backlog,
    /// Runs' cgroups and their limits.
    cgroups: ExecCgroups,
    /// Runs' network policies and the proxy that serves them.
    network: RunNetwork,
    spans: RunSpans,
    timers: Timers<Wake>,
    caps: OrderCaps,
    /// Why EXEC cannot work on this host, if it cannot.
    unavailable: Option<String>,
    shutting_down: bool,
    /// Runs accepted from each agent (for LIST), by agent id.
    runs_by_agent: HashMap<u32, u64>,
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
        let disks = SessionDisks::start(config, &dirs.state, Arc::clone(&waker));
        Ok(Exec {
            pool: Pool::new(config, registry, token_base, dirs.tools, available)?,
            backlog: Backlog::new(exec, disks),
            cgroups: ExecCgroups::start(cgroups, RunDefaults::of(exec), waker)?,
            network: RunNetwork::default(),
            spans: RunSpans::default(),
            timers: Timers::default(),
            caps: OrderCaps::new(exec),
            unavailable,
            shutting_down: false,
            runs_by_agent: HashMap::new(),
        })
    }

    /// The exec hosts and their run children (what runs have printed,
    /// their connections, their figures).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The pool, to take runs' connections from or count their tool calls.
    pub fn pool_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }

    /// Sessions' and templates' disks.
    pub fn disks(&mut self) -> &mut DiskWork {
        self.backlog.disks()
    }

    /// The `tools` package has changed: each host's zygote imports it
    /// again, and the children it prepared with the old one are replaced,
    /// those warm with a template too (sessions keep theirs).
    pub fn tools_changed(&mut self) {
        self.pool.tools_changed(&self.cgroups);
        self.backlog.disks().let_warm_go(self.pool.children());
    }

    /// Whether EXEC can serve runs on this host.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// What a run sees of the filesystem beyond its private `/tmp` and
    /// `/workspace`: its host's sandbox's binds (its shape's own aside).
    pub fn host_binds(&self) -> Vec<crate::sandbox::spec::Bind> {
        zygote::binds(self.pool.setup())
    }

    /// Runs with a network policy are served by `gateway`'s proxy
    /// (without one, such runs are refused); spans of runs go to `tracer`.
    pub fn connect(&mut self, gateway: Arc<Gateway>, tracer: Arc<Tracer>) {
        self.network.serve_with(gateway);
        self.spans.trace_with(tracer);
    }

    /// A run's cgroup limits: what `asked` asks for, else the defaults —
    /// never more than `caller`'s own.
    pub fn run_limits(
        &self,
        caller: &RunCaller,
        asked: Option<&Limits>,
    ) -> Result<CgroupLimits, ErrorReply> {
        self.cgroups.limits(&caller.limits, asked)
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
        open_for_runs(self.unavailable.as_deref(), self.shutting_down)?;
        files::check(&request.files, self.caps.max_file_bytes)?;
        let asked = request.limits.as_ref();
        let limits = self.cgroups.for_request(&caller.limits, asked)?;
        self.backlog.may_wait(caller.share)?;
        let now = Instant::now();
        if request.language == Language::Bash {
            self.pool.bash_came(now);
        }
        let timeout = self.caps.timeout(request.timeout_ms);
        if let Some(name) = &request.session {
            let key = (caller.principal, name.clone());
            if let Some(lost) = self.backlog.admit(&key, &request, caller.share)? {
                replies.push((reply_to, lost.into()));
                return Ok(());
            }
        }
        if let Principal::Agent { id } = caller.principal {
            *self.runs_by_agent.entry(id).or_default() += 1;
        }
        let span = self.spans.open(&request, run, caller.agent.as_ref());
        let asked = (&request, caller.principal, reply_to);
        let template = self.backlog.disks().template_for(asked)?;
        let volumes = self.backlog.disks().volumes_for((asked.0, asked.1), run)?;
        let mut waiting = Waiting::new(request, caller, reply_to, limits, timeout, now);
        waiting.template = template;
        waiting.volumes = volumes;
        waiting.run = Some(run);
        waiting.span = span;
        match self.backlog.queue(waiting) {
            Some(key) => self.serve_session(&key, replies, now),
            None => self.dispatch(replies, now),
        }
        // A request that could not start at once is answered at its
        // deadline if it is still waiting then.
        if self.backlog.is_waiting(reply_to) {
            self.timers.schedule(now + timeout, Wake::WaitedTooLong);
        }
        Ok(())
    }

    /// Readiness of one of EXEC's tokens.
    pub fn on_event(&mut self, token: Token, replies: &mut Vec<Reply>) {
        let now = Instant::now();
        match self.pool.on_event(token, &self.cgroups, now) {
            Event::Nothing => {}
            Event::Host(host) => {
                while let Some(ready) = self.pool.take_child(host, &self.cgroups, now) {
                    if ready {
                        self.dispatch(replies, now);
                    }
                }
            }
            Event::Ready => self.dispatch(replies, now),
            Event::Gone(child) => self.child_gone(child, replies),
            Event::Progress(child) => self.finish_if_done(child, replies, now),
            Event::Renewed(child) => self.renewed(child, replies, now),
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
                    // A paused run's time limit stands still: it is looked
                    // at again when it may be due.
                    if let Some(due) = self.pool.children_mut().timed_out(child, started, now) {
                        self.timers.schedule(due, Wake::Timeout { child, started });
                    }
                }
                Wake::StartHosts => self.start_hosts(sandboxes, now),
                Wake::WaitedTooLong => {
                    let hosts_up = self.pool.any_up();
                    let running = self.pool.children().running_count();
                    self.backlog.expire(now, hosts_up, running, replies);
                }
                Wake::SessionIdle { key, last_used: at } => {
                    match self.backlog.idle(&key, at, now) {
                        Idle::Used => {}
                        Idle::Ends => drop(self.end_interpreter(&key, replies)),
                        Idle::Hibernates => self.serve_session(&key, replies, now),
                        Idle::HibernatesPaused => drop(self.freeze_session(&key, false, replies)),
                    }
                }
            }
        }
    }

    /// Asks the runtime for the hosts that are missing.
    pub fn start_hosts(&mut self, sandboxes: &mut impl Sandboxes<HostId>, now: Instant) {
        self.pool.start_hosts(sandboxes, now, &self.cgroups);
    }

    /// Takes in what happened to a host's sandbox. A host that failed or
    /// ended takes its children with it; another starts after a pause.
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        now: Instant,
    ) {
        let gone = self.pool.on_sandbox(sandboxes, event, &self.cgroups);
        if gone && !self.shutting_down {
            self.timers.schedule(now + HOST_RETRY, Wake::StartHosts);
        }
    }

    /// Sends the cgroups made since the last call to their hosts, and keeps
    /// those made inside agents' for their runs, which may start now.
    pub fn on_wake(&mut self, replies: &mut Vec<Reply>) {
        let done = self.backlog.disks_done(replies);
        let hibernated = self.backlog.hibernated(&done.hibernated);
        // What waited for a hibernated session waits for a fresh child.
        let mut dispatch_again = !hibernated.is_empty();
        for child in done.refused.into_iter().chain(hibernated) {
            self.pool.children().kill_quietly(child);
            self.drop_child(child);
        }
        for child in done.warmed {
            self.pool.children_mut().settle_template(child);
        }
        for (child, waiting) in done.ready {
            self.start(child, waiting, replies, Instant::now());
        }
        for key in done.sessions {
            self.serve_session(&key, replies, Instant::now());
        }
        for made in self.cgroups.made() {
            match made.made_for {
                MadeFor::Host(host) => self.pool.cgroup_made(host, made.result, &self.cgroups),
                MadeFor::Agent(to) => {
                    dispatch_again = true;
                    if let Err(failed) = self.cgroups.made_for_agent(&to, made.result) {
                        self.backlog.refuse_charged(to.agent, &failed, replies);
                    }
                }
            }
        }
        if dispatch_again {
            self.dispatch(replies, Instant::now());
        }
    }

    /// Gives waiting requests to ready children, owner by owner in turn,
    /// each within its share; a request for a session opened meanwhile
    /// joins that session's queue.
    fn dispatch(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        for key in self.backlog.join_opened() {
            self.serve_session(&key, replies, now);
        }
        self.cgroups.ask_for_agents(self.backlog.charges());
        while self.pool.has_ready() {
            let lending = self.pool.children().lending_runs();
            let cgroups = &self.cgroups;
            let ready = |w: &Waiting| cgroups.has_for(w.charged_to.as_ref());
            let (network, spans) = (&self.network, &self.spans);
            let next = self.backlog.next(ready, &lending, network, spans, replies);
            let Some(mut waiting) = next else {
                self.backlog.disks().top_up(&mut self.pool);
                return;
            };
            let warm = self
                .backlog
                .disks()
                .take_warm(&waiting, self.pool.children());
            let Some(child) = warm.or_else(|| self.pool.take_ready(waiting.is_bash())) else {
                self.backlog.push_front(waiting);
                return;
            };
            self.backlog.open_session(child, &mut waiting, now);
            self.backlog.disks().warm_for(&waiting, &mut self.pool);
            if warm.is_some() || !waiting.needs_disks() {
                self.start(child, waiting, replies, now);
                continue;
            }
            let pidfd = self.pool.children().pidfd(child);
            if let Some(gone) = self.backlog.give_disks(child, pidfd, waiting, replies) {
                self.child_gone(gone, replies);
            }
        }
    }

    /// Starts the next queued order of a session whose child is free. A
    /// restore gives the session a fresh child first: the old one goes, and
    /// the restore waits first in line for another, carrying the session.
    fn serve_session(&mut self, key: &SessionKey, replies: &mut Vec<Reply>, now: Instant) {
        let children = self.pool.children();
        let lending = children.lending_runs();
        let alive = |child| children.is_alive(child);
        let (network, spans) = (&self.network, &self.spans);
        let next = self
            .backlog
            .next_for_session(key, alive, &lending, network, spans, replies);
        let Some(waiting) = next else {
            return;
        };
        let fresh = waiting.carried.is_some() || waiting.given_disk;
        if matches!(waiting.order, Order::Restore { .. }) && !fresh {
            if let Some(child) = self.backlog.begin_restore(key, waiting) {
                self.pool.children().kill_quietly(child);
                self.drop_child(child);
                self.dispatch(replies, now);
            }
            return;
        }
        if let Some(child) = self.backlog.begin(key, now) {
            self.start(child, waiting, replies, now);
        }
    }

    /// Sends a request to a child (a session's keeps it for more). A run
    /// counts against its owner's share until it ends.
    fn start(&mut self, child: usize, waiting: Waiting, replies: &mut Vec<Reply>, now: Instant) {
        let reply_to = waiting.reply_to;
        let with = Launch {
            network: &self.network,
            cgroups: &mut self.cgroups,
            caps: &self.caps,
        };
        match self.pool.launch(child, waiting, with, now) {
            None => {}
            Some(Ok(launched)) => {
                if let Some(share) = launched.holds {
                    self.backlog.started(share);
                }
                let (deadline, started) = (now + launched.timeout, now);
                let wake = Wake::Timeout { child, started };
                self.timers.schedule(deadline, wake);
                self.finish_if_done(child, replies, now);
            }
            Some(Err(refusal)) => {
                // Its child (and a session it held) ends, unused.
                replies.push((reply_to, refusal.into()));
                self.child_gone(child, replies);
            }
        }
    }

    /// Answers a run that has ended, and lets its child go — unless a
    /// session keeps it. Its owner's share has room again: what waited
    /// for that room starts, sessions' queued runs and the queues each
    /// first in turn, so neither can keep the room from the other.
    fn finish_if_done(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(done) = self.pool.finish(child, now) else {
            return;
        };
        let holds = done.holds;
        self.finish_order(child, done, replies, now);
        let Some(share) = holds else {
            return;
        };
        self.backlog.ended(share);
        let sessions_first = self.backlog.sessions_turn();
        if !sessions_first {
            self.dispatch(replies, now);
        }
        for key in self.backlog.sessions_waiting() {
            self.serve_session(&key, replies, now);
        }
        if sessions_first {
            self.dispatch(replies, now);
        }
    }

    /// The reply to a finished order, and what becomes of its child.
    fn finish_order(&mut self, child: usize, done: Done, replies: &mut Vec<Reply>, now: Instant) {
        let key = self.backlog.session_of(child);
        let finished = done.finished;
        let ran_code = matches!(finished.order, Order::Run);
        let bytes = finished.workspace_bytes;
        if let Some(span) = done.span {
            self.spans.ended(span, &finished.reply);
        }
        let reply_to = finished.reply_to;
        let reply = match &key {
            Some(key) => self.backlog.answer(key, finished),
            // A template build's reply waits for the template.
            None => match self
                .backlog
                .disks()
                .build_ran(child, reply_to, finished.reply)
            {
                Some(reply) => Some(reply.into()),
                None => return self.drop_child(child),
            },
        };
        // A snapshot's goes once the kernel has stored it.
        replies.extend(reply.map(|reply| (reply_to, reply)));
        let Some(key) = key else {
            return self.drop_child(child);
        };
        if !done.alive {
            self.backlog.session_died(&key, replies);
            return self.drop_child(child);
        }
        if self.backlog.session_of(child).is_none() {
            // The kernel's own hibernation of it failed: it ended at its
            // answer (see [`Backlog::answer`]), its queue to a fresh child.
            self.pool.children().kill_quietly(child);
            self.drop_child(child);
            return self.dispatch(replies, now);
        }
        if let Err(err) = self.pool.keep(child, &self.cgroups) {
            log::warn!("exec session: cannot watch its output: {err}");
            self.backlog.end_session(&key);
            return self.drop_child(child);
        }
        if let Some(idle_at) = self.backlog.order_ended(&key, ran_code, bytes, now) {
            let (key, last_used) = (key.clone(), now);
            self.timers
                .schedule(idle_at, Wake::SessionIdle { key, last_used });
        }
        self.serve_session(&key, replies, now);
    }

    /// A session's child has handed over its next run's pipes: watched,
    /// they let the session's next run start.
    fn renewed(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(key) = self.backlog.session_of(child) else {
            return self.drop_child(child);
        };
        if let Err(err) = self.pool.renew(child) {
            log::warn!("exec session: cannot watch its output: {err}");
            return self.child_gone(child, replies);
        }
        self.serve_session(&key, replies, now);
    }

    /// A waiting child went away: a session it held ends with it. If the
    /// memory controller killed it (its agent's runs and sessions together
    /// went over the agent's limit, say), the session's next run is told.
    fn child_gone(&mut self, child: usize, replies: &mut Vec<Reply>) {
        if let Some(key) = self.backlog.session_of(child) {
            if self.pool.children().was_oom_killed(child) {
                self.backlog.note_lost(&key);
            }
            self.end_interpreter(&key, replies);
        }
        self.drop_child(child);
    }

    /// Lets a child go; the share its run held has room again.
    fn drop_child(&mut self, child: usize) {
        self.backlog.disks().child_dropped(child);
        if let Some(share) = self.pool.drop_child(child, &self.cgroups) {
            self.backlog.ended(share);
        }
    }

    /// The owner's sessions (`op: sessions`): those with an interpreter,
    /// and those stored on their disks.
    pub fn sessions(&self, owner: Principal) -> Vec<SessionInfo> {
        let children = self.pool.children();
        self.backlog
            .sessions(owner, |child| children.workspace_bytes(child))
    }

    /// PAUSE (`frozen`) or RESUME of session `key`: its interpreter's
    /// freezer, to wait on (see [`Backlog::freeze`]). Resumed, what waited
    /// for it starts.
    pub fn freeze_session(
        &mut self,
        key: &SessionKey,
        frozen: bool,
        replies: &mut Vec<Reply>,
    ) -> Result<Freezer, ErrorReply> {
        let (now, children) = (Instant::now(), self.pool.children_mut());
        let freezer =
            (self.backlog).freeze(key, frozen, |child| children.freeze(child, frozen, now))?;
        self.serve_session(key, replies, now);
        Ok(freezer)
    }

    /// Ends a session (`op: close`): its interpreter and its files go;
    /// a run of it still going is killed. Whether there was one.
    pub fn close(&mut self, owner: Principal, name: &str, replies: &mut Vec<Reply>) -> bool {
        let key = (owner, name.to_owned());
        let had_disk = self.backlog.disks().store.remove(&key);
        self.end_interpreter(&key, replies) || had_disk
    }

    /// Ends session `key`'s interpreter (a run of it still going is
    /// killed); its disk, if it has one, stays. Whether it had one.
    fn end_interpreter(&mut self, key: &SessionKey, replies: &mut Vec<Reply>) -> bool {
        match self.backlog.close(key, replies) {
            Closed::Nothing => false,
            Closed::Restoring => true,
            Closed::Open(child) => {
                // A run of it still going is answered first; its child
                // goes then.
                if self.pool.children_mut().close(child) {
                    self.drop_child(child);
                }
                true
            }
        }
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
        let limits = self.cgroups.limits(&caller.limits, None)?;
        self.backlog.may_wait(caller.share)?;
        let share = caller.share;
        let Some(order) = self.backlog.order_for(&key, op, share, reply_to)? else {
            return Ok(());
        };
        let (now, timeout) = (Instant::now(), self.caps.default_timeout);
        let waiting = Waiting::for_session(&key, caller, order, reply_to, limits, timeout, now);
        // A hibernated session's wake opens it.
        match self.backlog.queue(waiting) {
            Some(key) => self.serve_session(&key, replies, now),
            None => self.dispatch(replies, now),
        }
        Ok(())
    }

    /// Cancels the run whose reply goes to `reply_to`: one still waiting
    /// for a sandbox is dropped; a running one is killed (SIGKILL to PID 1
    /// of its namespace, so everything it started dies), and its reply
    /// still goes out, saying so. Returns whether there was one.
    pub fn cancel(&mut self, reply_to: ReplyTo, replies: &mut Vec<Reply>) -> bool {
        let waited = self.backlog.cancel(reply_to, replies);
        let children = self.pool.children_mut();
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
        self.backlog.end_where(waiting, why, replies);
        (self.pool.children_mut()).kill_running(running, Kill::Cancelled);
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
        self.backlog.end_where(waiting, why, replies);
        (self.pool.children_mut()).kill_running(running, Kill::OwnerEnded);
        for name in self.backlog.end_owner(principal) {
            self.close(principal, &name, replies);
        }
        self.network.forget(principal);
        if let Principal::Agent { id } = principal {
            self.cgroups.forget_agent(id);
        }
    }

    /// NET `set` replaced the policies of `owners` (an agent's, and those
    /// of the runs under it, narrowed with it): the endpoints serving their
    /// runs and sessions are narrowed to lie within them, and their queued
    /// runs are held to them when they start.
    pub fn policies_replaced(&mut self, owners: Vec<(Principal, Policy)>) {
        let endpoints = self.pool.children_mut().endpoints_mut();
        self.network.replaced(owners, endpoints);
    }

    /// Stops taking runs: waiting ones are refused, running ones killed
    /// (their replies still go out), hosts stopped.
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        replies: &mut Vec<Reply>,
    ) {
        self.shutting_down = true;
        self.backlog.shut_down(replies);
        self.pool.stop(sandboxes);
    }

    /// Last step of shutdown (may block briefly): the runs' cgroups are
    /// removed, and whatever is left in them killed.
    pub fn finish_shutdown(&mut self) {
        self.cgroups.finish(self.pool.take_cgroups());
        self.backlog.disks().store.finish();
    }
}
