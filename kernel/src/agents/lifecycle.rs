//! The life of an agent: each incarnation acquires a sandbox, claims it, and ends;
//! then the restart policy decides between another incarnation and the end. Every
//! step is driven by a [`SandboxEvent`] or a deadline, and nothing here
//! touches a process directly: the sandbox runtime does, through the
//! [`Sandboxes`] seam. The agents' records are the table's; each step is
//! handed the record it changes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_egress::Gateway;
use agentos_primitives::timers::Timers;
use agentos_proto::payload::{AgentState, KernelEvent, SpawnReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::isolation::cgroup_limits;
use super::program;
use super::record::{Agent, Incarnation, StopReason, WorkloadReport};
use super::restart::{Decision, Ending};
use super::table::Table;
use super::usage::AgentCounts;
use crate::address::{Answer, Reply};
use crate::cgroup::{CgroupLimits, CgroupStats};
use crate::events::{AgentEventData, Notice};
use crate::process::ProcessEnd;
use crate::sandbox::plan::{Workload, SOCKET_INSIDE, WORKSPACE};
use crate::sandbox::runtime::{ClaimOrder, SandboxEvent, SandboxKey, Sandboxes};
use crate::sandbox::Status;

/// Where a step of an agent's life has its effects, besides the agent:
/// the sandboxes, the replies to send, the counts — and when it happens.
#[derive(Debug)]
pub struct Effects<'a, S> {
    /// The sandbox runtime.
    pub sandboxes: &'a mut S,
    /// Replies to send (a SPAWN's, once its agent runs or fails to).
    pub replies: &'a mut Vec<Reply>,
    /// What the metrics count.
    pub counts: &'a mut AgentCounts,
    /// What subscribers to events hear of (see [`crate::events`]).
    pub notices: &'a mut Vec<Notice>,
    /// Now.
    pub now: Instant,
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

/// What drives agents' lives besides their records: the deadlines, the
/// agents whose work must end, and whether the kernel is shutting down.
#[derive(Debug)]
pub struct Life {
    deadlines: Timers<Deadline>,
    /// Agents whose incarnation has ended or is being stopped since the
    /// last [`Life::take_ended`]: the work they started ends with it.
    ended: Vec<u32>,
    /// How long an ended agent stays listed.
    retention: Duration,
    /// The longest SIGTERM grace a shutdown gives.
    stop_grace: Duration,
    shutting_down: bool,
    /// The egress proxy, for agents with a network policy.
    gateway: Arc<Gateway>,
}

impl Life {
    /// Ended agents kept for `retention`; a shutdown's SIGTERM followed by
    /// SIGKILL after `stop_grace` at most.
    pub fn new(retention: Duration, stop_grace: Duration, gateway: Arc<Gateway>) -> Life {
        Life {
            deadlines: Timers::default(),
            ended: Vec::new(),
            retention,
            stop_grace,
            shutting_down: false,
            gateway,
        }
    }

    /// Whether shutdown has begun: nothing new starts.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Whether an agent's incarnation has ended, or it is being stopped,
    /// since the last [`take_ended`](Self::take_ended).
    pub fn has_ended(&self) -> bool {
        !self.ended.is_empty()
    }

    /// Agents whose incarnation has ended or is being stopped since the
    /// last call, each once, in order.
    pub fn take_ended(&mut self) -> Vec<u32> {
        let mut ended = std::mem::take(&mut self.ended);
        ended.sort_unstable();
        ended.dedup();
        ended
    }

    /// Takes in what happened to an incarnation's sandbox.
    pub fn on_sandbox<S: Sandboxes<Incarnation>>(
        &mut self,
        table: &mut Table,
        fx: &mut Effects<'_, S>,
        event: SandboxEvent<Incarnation>,
    ) {
        match event {
            SandboxEvent::Ready { owner, sandbox } => self.sandbox_ready(table, fx, owner, sandbox),
            SandboxEvent::Failed { owner, error } => {
                if let Some(agent) = table.current(owner) {
                    let message = error.to_string();
                    self.fail_start(agent, fx, error.code(), message);
                }
            }
            SandboxEvent::Status { owner, status } => {
                if let Some(agent) = table.current(owner) {
                    apply_status(agent, status, fx.replies, fx.notices);
                }
            }
            SandboxEvent::OomKill { owner } => {
                let Some(agent) = table.current(owner) else {
                    return;
                };
                fx.counts.oom_kills += 1;
                if !agent.oom_killed {
                    log::info!(
                        "agent {} ({}): the memory limit killed a process",
                        agent.id,
                        agent.name
                    );
                    agent.oom_killed = true;
                    fx.notices.push(notice(agent, KernelEvent::AgentOomKilled));
                }
            }
            SandboxEvent::Ended {
                owner,
                init,
                oom_killed,
                usage,
            } => {
                if let Some(agent) = table.current(owner) {
                    let end = SandboxEnd {
                        init,
                        oom_killed,
                        usage,
                    };
                    self.run_ended(agent, fx, end);
                }
            }
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.deadlines.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(
        &mut self,
        table: &mut Table,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        now: Instant,
    ) {
        while let Some(deadline) = self.deadlines.pop_due(now) {
            match deadline {
                Deadline::Escalate(incarnation) => {
                    if let Some(sandbox) = table.current(incarnation).and_then(|a| a.sandbox) {
                        log::info!("agent {}: grace over, SIGKILL", incarnation.agent);
                        sandboxes.signal(sandbox, libc::SIGKILL);
                    }
                }
                Deadline::Restart(incarnation) => {
                    if let Some(agent) = table
                        .current(incarnation)
                        .filter(|a| a.state == AgentState::Restarting)
                    {
                        self.start_incarnation(agent, sandboxes, now);
                    }
                }
                Deadline::Forget { id } => {
                    // A restart may have revived it, and it may have ended
                    // again since: only the retention of its last end counts.
                    let expired = |a: &Agent| {
                        a.ended.is_some_and(|ended| {
                            now.saturating_duration_since(ended) >= self.retention
                        })
                    };
                    if table.get(id).is_some_and(|a| !a.is_live() && expired(a)) {
                        table.remove(id);
                    }
                }
            }
        }
    }

    /// Stops every live agent of `table`: SIGTERM now, SIGKILL after the
    /// stop grace (or `grace`, if shorter).
    pub fn begin_shutdown<S: Sandboxes<Incarnation>>(
        &mut self,
        table: &mut Table,
        fx: &mut Effects<'_, S>,
        grace: Duration,
    ) {
        self.shutting_down = true;
        let grace = grace.min(self.stop_grace);
        let live = table.live_ids(|_| true);
        if !live.is_empty() {
            log::info!("stopping {} agent(s)", live.len());
        }
        for id in live {
            if let Some(agent) = table.get_mut(id) {
                self.stop(agent, fx, StopReason::Shutdown, grace);
            }
        }
    }

    /// Starts the agent's next incarnation: in a warm sandbox if one fits, else in
    /// one prepared for it.
    pub fn start_incarnation(
        &mut self,
        agent: &mut Agent,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        now: Instant,
    ) {
        agent.incarnation += 1;
        agent.state = AgentState::Starting;
        agent.workload = WorkloadReport::default();
        agent.oom_killed = false;
        agent.started_at = SystemTime::now();
        agent.started = now;
        let incarnation = agent.incarnation();
        let shape = agent.shape(sandboxes);
        if let Some(sandbox) = sandboxes.acquire(incarnation, shape, now) {
            self.claim(agent, sandboxes, sandbox, incarnation);
        }
    }

    /// Starts the next incarnation of an agent that was stopped, or had
    /// ended, for a restart.
    pub fn start_again(
        &mut self,
        agent: &mut Agent,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        now: Instant,
    ) {
        agent.stop = None;
        agent.ended = None;
        agent.restarts.total += 1;
        self.start_incarnation(agent, sandboxes, now);
    }

    /// A sandbox arrived for `incarnation`: claim it, unless the incarnation was stopped
    /// (or superseded) while it was prepared.
    fn sandbox_ready<S: Sandboxes<Incarnation>>(
        &mut self,
        table: &mut Table,
        fx: &mut Effects<'_, S>,
        incarnation: Incarnation,
        sandbox: SandboxKey,
    ) {
        if let Some(agent) = table
            .current(incarnation)
            .filter(|a| a.state == AgentState::Starting && a.stop.is_none())
        {
            return self.claim(agent, fx.sandboxes, sandbox, incarnation);
        }
        fx.sandboxes.discard(sandbox);
        if let Some(agent) = table
            .get_mut(incarnation.agent)
            .filter(|a| a.stop.is_some() && a.is_live() && a.sandbox.is_none())
        {
            self.killed_before_start(agent, fx);
        }
    }

    /// Gives the sandbox to the incarnation: it is told what to run, and its cgroup
    /// becomes the agent's, with the agent's limits.
    fn claim(
        &mut self,
        agent: &mut Agent,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        sandbox: SandboxKey,
        incarnation: Incarnation,
    ) {
        let id = agent.id;
        let door = agent
            .door
            .and_then(|door| sandboxes.door_path(door))
            .map(PathBuf::from)
            .unwrap_or_default();
        let (socket, home) = if agent.shape(sandboxes).sandboxed {
            (PathBuf::from(SOCKET_INSIDE), PathBuf::from(WORKSPACE))
        } else {
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
            (door.clone(), home)
        };
        let mut env = program::environment(&agent.request, id, &socket, &home);
        let mut endpoint_error = None;
        if let Some(policy) = agent.egress.policy() {
            let label = format!("agent {id} ({})", agent.name);
            match sandboxes
                .listen_inside(sandbox)
                .and_then(|listener| self.gateway.open(label, listener, policy.clone()))
            {
                Ok(endpoint) => {
                    agent.net_record = Some(Arc::clone(endpoint.record()));
                    agent.endpoint = Some(endpoint);
                    // The kernel's variables win over the request's: a
                    // sandbox cannot point itself past its proxy anyway,
                    // but its own programs should find it.
                    let proxy_env = self.gateway.environment();
                    env.retain(|(key, _)| !proxy_env.iter().any(|(k, _)| k == key));
                    env.extend(proxy_env);
                }
                Err(err) => endpoint_error = Some(err),
            }
        }
        let workload = Workload {
            name: agent.name.clone(),
            program: agent.program.program.clone(),
            argv: agent.program.argv.clone(),
            env,
            cwd: agent.program.cwd.clone(),
            script: agent.program.script.clone(),
            binds: agent.program.binds.clone(),
            socket: Some(door),
        };
        let order = ClaimOrder {
            workload: &workload,
            log: &agent.log,
            cgroup_name: format!("agent-{id}-{}", incarnation.number),
            // Unsandboxed, it is as the host's processes are: no limits.
            limits: if agent.shape(sandboxes).sandboxed {
                cgroup_limits(&agent.limits)
            } else {
                CgroupLimits::NONE
            },
            door: agent.door,
            channel: None,
        };
        // Its volumes go into its root before its workload enters it.
        let mounted = match agent.volumes.is_empty() {
            true => Ok(()),
            false => sandboxes.mount_volumes(sandbox, &agent.volumes),
        };
        let claimed = sandboxes.claim(sandbox, incarnation, order);
        agent.sandbox = Some(sandbox);
        match claimed {
            Ok(claimed) => agent.pid = Some(claimed.pid),
            Err(error) => {
                log::error!("agent {id}: {error}");
                agent.workload.start_error = Some((error.code(), error.to_string()));
            }
        }
        if let Err(err) = mounted {
            // Without them it would run with less than it was given: the
            // incarnation ends before its workload does anything.
            let message = format!("SPAWN field `volumes`: they cannot be mounted: {err}");
            log::error!("agent {id}: {message}");
            agent.workload.start_error = Some((ErrorCode::Unavailable, message));
            sandboxes.signal(sandbox, libc::SIGKILL);
        }
        if let Some(err) = endpoint_error {
            // Without its endpoint it would run with no network at all:
            // the incarnation ends before its workload does anything.
            let message =
                format!("SPAWN field `network`: the proxy endpoint cannot be made: {err}");
            log::error!("agent {id}: {message}");
            agent.workload.start_error = Some((ErrorCode::Unavailable, message));
            sandboxes.signal(sandbox, libc::SIGKILL);
        }
    }

    /// The agent's current incarnation has ended.
    fn run_ended<S: Sandboxes<Incarnation>>(
        &mut self,
        agent: &mut Agent,
        fx: &mut Effects<'_, S>,
        end: SandboxEnd,
    ) {
        let id = agent.id;
        // Whatever comes next (a restart, or the end), the work it started
        // ends with this incarnation.
        self.ended.push(id);
        agent.sandbox = None;
        agent.pid = None;
        // Its endpoint closes, and every connection through it.
        agent.endpoint = None;
        // The init reports the workload's ending; if it could not (it was
        // killed itself: SIGKILL, OOM), its own wait status stands in.
        if agent.workload.exit_code.is_none() && agent.workload.signal.is_none() {
            match end.init {
                Some(ProcessEnd::Exited(code)) if agent.workload.start_error.is_none() => {
                    agent.workload.exit_code = Some(code)
                }
                Some(ProcessEnd::Signaled(signal)) => agent.workload.signal = Some(signal),
                _ => {}
            }
        }
        if end.oom_killed && !agent.oom_killed {
            // Only the end told of it: no OOM event came while it ran.
            fx.notices.push(notice(agent, KernelEvent::AgentOomKilled));
        }
        agent.oom_killed |= end.oom_killed;
        agent.last_run = end.usage;
        agent.sampled = CgroupStats::default();
        fx.counts.ended_cpu.add(&end.usage);
        if let Some((code, message)) = agent.workload.start_error.clone() {
            log::info!("agent {id} ({}): could not start: {message}", agent.name);
            return self.fail_start(agent, fx, code, message);
        }
        if !agent.workload.ready {
            let message = if agent.stop.is_some() {
                "the agent was stopped before it started".to_owned()
            } else {
                "the sandbox ended before the workload started; see the agent log".to_owned()
            };
            return self.fail_start(agent, fx, ErrorCode::Internal, message);
        }
        let end = match (agent.stop, agent.workload.exit_code, agent.workload.signal) {
            (Some(_), _, _) => Ending::Stopped,
            (None, Some(0), None) if !agent.oom_killed => Ending::Success,
            _ => Ending::Failure,
        };
        agent.state = if agent.stop.is_some() {
            AgentState::Killed
        } else if agent.oom_killed && agent.workload.signal == Some(libc::SIGKILL) {
            AgentState::OomKilled
        } else {
            AgentState::Exited
        };
        log::info!(
            "agent {id} ({}): {} (exit code {:?}, signal {:?}{})",
            agent.name,
            agent.state.as_str(),
            agent.workload.exit_code,
            agent.workload.signal,
            if agent.oom_killed { ", OOM kill" } else { "" }
        );
        self.after_run(agent, fx, end);
    }

    /// An incarnation could not start: answer a waiting SPAWN (the agent is then
    /// simply `failed`), or let the restart policy decide.
    fn fail_start<S: Sandboxes<Incarnation>>(
        &mut self,
        agent: &mut Agent,
        fx: &mut Effects<'_, S>,
        code: ErrorCode,
        message: String,
    ) {
        agent.state = if agent.stop.is_some() {
            AgentState::Killed
        } else {
            AgentState::Failed
        };
        // A SPAWN still waiting hears of the incarnation a restart starts.
        let restarting = agent.stop == Some(StopReason::Restart);
        if let Some(waiter) = agent.spawn_reply.take_if(|_| !restarting) {
            fx.replies
                .push((waiter.reply_to, ErrorReply::new(code, message).into()));
            return self.finish(agent, fx);
        }
        let end = if agent.stop.is_some() {
            Ending::Stopped
        } else {
            Ending::Failure
        };
        self.after_run(agent, fx, end);
    }

    /// An incarnation stopped before it had a sandbox: a SPAWN still waiting hears so.
    fn killed_before_start<S: Sandboxes<Incarnation>>(
        &mut self,
        agent: &mut Agent,
        fx: &mut Effects<'_, S>,
    ) {
        let message = format!("agent {} was killed before it started", agent.id);
        self.fail_start(agent, fx, ErrorCode::NotFound, message);
    }

    /// An incarnation is over: restart it, or let the agent end.
    fn after_run<S: Sandboxes<Incarnation>>(
        &mut self,
        agent: &mut Agent,
        fx: &mut Effects<'_, S>,
        end: Ending,
    ) {
        let (id, now) = (agent.id, fx.now);
        if self.shutting_down {
            return self.finish(agent, fx);
        }
        if agent.stop == Some(StopReason::Restart) {
            log::info!("agent {id} ({}): stopped; starting it again", agent.name);
            fx.notices.push(notice(agent, KernelEvent::AgentRestarting));
            return self.start_again(agent, fx.sandboxes, now);
        }
        match agent.restarts.decide(end, now) {
            Decision::RestartAfter(delay) => {
                fx.counts.restarts += 1;
                log::info!("agent {id} ({}): restarting in {delay:?}", agent.name);
                agent.state = AgentState::Restarting;
                fx.notices.push(notice(agent, KernelEvent::AgentRestarting));
                self.deadlines
                    .schedule(now + delay, Deadline::Restart(agent.incarnation()));
            }
            Decision::Rest => self.finish(agent, fx),
            Decision::GiveUp => {
                log::warn!("agent {id} ({}): restarts used up; failed", agent.name);
                agent.state = AgentState::Failed;
                fx.notices.push(notice(agent, KernelEvent::AgentEscalated));
                self.finish(agent, fx);
            }
        }
    }

    /// The agent has ended for good: close its socket, and forget it after
    /// the retention time.
    fn finish<S: Sandboxes<Incarnation>>(&mut self, agent: &mut Agent, fx: &mut Effects<'_, S>) {
        let now = fx.now;
        agent.ended = Some(now);
        if let Some(door) = agent.door.take() {
            fx.sandboxes.close_door(door);
        }
        fx.notices.push(notice(agent, KernelEvent::AgentExited));
        self.deadlines
            .schedule(now + self.retention, Deadline::Forget { id: agent.id });
    }

    /// Asks a live agent to stop: SIGTERM, and SIGKILL after `grace` (at
    /// once, if none).
    pub fn stop<S: Sandboxes<Incarnation>>(
        &mut self,
        agent: &mut Agent,
        fx: &mut Effects<'_, S>,
        why: StopReason,
        grace: Duration,
    ) {
        // Its work ends now, not once its processes have heeded the signal.
        self.ended.push(agent.id);
        agent.stop = Some(why);
        if agent.state == AgentState::Restarting {
            // Nothing runs while it waits out its backoff.
            if why == StopReason::Restart {
                return self.start_again(agent, fx.sandboxes, fx.now);
            }
            agent.state = AgentState::Killed;
            return self.finish(agent, fx);
        }
        let incarnation = agent.incarnation();
        if fx.sandboxes.withdraw(incarnation) {
            // Waiting for any sandbox: nothing runs yet, so it ends here.
            return self.killed_before_start(agent, fx);
        }
        let Some(sandbox) = agent.sandbox else {
            // Its own sandbox is still being prepared: it is discarded on arrival.
            return;
        };
        if grace.is_zero() {
            fx.sandboxes.signal(sandbox, libc::SIGKILL);
        } else {
            fx.sandboxes.signal(sandbox, libc::SIGTERM);
            self.deadlines
                .schedule(fx.now + grace, Deadline::Escalate(incarnation));
        }
    }
}

/// How an incarnation's sandbox ended, as the runtime reported it.
#[derive(Clone, Copy, Debug)]
struct SandboxEnd {
    init: Option<ProcessEnd>,
    oom_killed: bool,
    usage: CgroupStats,
}

/// What subscribers hear of `agent`, as it is now.
fn notice(agent: &Agent, kind: KernelEvent) -> Notice {
    let data = AgentEventData {
        agent_id: agent.id,
        name: agent.name.clone(),
        parent_id: agent.parent,
        state: Some(agent.state),
        exit_code: agent.workload.exit_code,
        signal: agent.workload.signal,
        restarts: Some(agent.restarts.total),
        by: None,
    };
    Notice::now(kind, data)
}

/// Applies one status line to an agent.
fn apply_status(
    agent: &mut Agent,
    status: Status,
    replies: &mut Vec<Reply>,
    notices: &mut Vec<Notice>,
) {
    match status {
        Status::Ready { .. } => {
            agent.workload.ready = true;
            if agent.stop.is_none() {
                agent.state = AgentState::Running;
            }
            notices.push(notice(agent, KernelEvent::AgentSpawned));
            if let Some(waiter) = agent.spawn_reply.take() {
                let reply = SpawnReply {
                    success: true,
                    id: agent.id,
                    name: agent.name.clone(),
                    // An agent cannot see its children's processes.
                    pid: agent.pid.filter(|_| !waiter.by_agent).map(|p| p as u32),
                    status: agent.state,
                    isolation: agent.isolation.clone(),
                    warnings: waiter.warnings,
                };
                replies.push((waiter.reply_to, Answer::json(&reply)));
            }
            log::info!("agent {} ({}): running", agent.id, agent.name);
        }
        Status::Error { code, message } => agent.workload.start_error = Some((code, message)),
        Status::Exited(code) => agent.workload.exit_code = Some(code),
        Status::Signaled(signal) => agent.workload.signal = Some(signal),
    }
}
