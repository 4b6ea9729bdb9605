//! The life of an agent: each incarnation acquires a sandbox, claims it, and ends;
//! then the restart policy decides between another incarnation and the end. Every
//! step is driven by a [`SandboxEvent`] or a deadline, and nothing here
//! touches a process directly: the sandbox runtime does, through the
//! [`Sandboxes`] seam.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{AgentState, SpawnReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::record::{Agent, StopReason, WorkloadReport};
use super::restart::{Decision, Ending};
use super::{cgroup_limits, program, Agents, Deadline, Incarnation};
use crate::address::{Answer, Reply};
use crate::cgroup::CgroupStats;
use crate::process::ProcessEnd;
use crate::sandbox::plan::{Workload, SOCKET_INSIDE, WORKSPACE};
use crate::sandbox::runtime::{ClaimOrder, SandboxEvent, SandboxKey, Sandboxes};
use crate::sandbox::Status;

impl Agents {
    /// Takes in what happened to an incarnation's sandbox.
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        event: SandboxEvent<Incarnation>,
        now: Instant,
    ) {
        match event {
            SandboxEvent::Ready { owner, sandbox } => {
                self.sandbox_ready(sandboxes, replies, owner, sandbox, now)
            }
            SandboxEvent::Failed { owner, error } => {
                if self.current(owner).is_some() {
                    let message = error.to_string();
                    self.fail_start(sandboxes, replies, owner.agent, error.code(), message, now);
                }
            }
            SandboxEvent::Status { owner, status } => {
                if let Some(agent) = self.current(owner) {
                    apply_status(agent, status, replies);
                }
            }
            SandboxEvent::OomKill { owner } => {
                if self.current(owner).is_some() {
                    self.counts.oom_kills += 1;
                }
                if let Some(agent) = self.current(owner).filter(|a| !a.oom_killed) {
                    log::info!(
                        "agent {} ({}): the memory limit killed a process",
                        agent.id,
                        agent.name
                    );
                    agent.oom_killed = true;
                }
            }
            SandboxEvent::Ended {
                owner,
                init,
                oom_killed,
                usage,
            } => {
                if self.current(owner).is_some() {
                    let end = SandboxEnd {
                        init,
                        oom_killed,
                        usage,
                    };
                    self.run_ended(sandboxes, replies, owner.agent, end, now);
                }
            }
        }
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.deadlines.time_to_next(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(&mut self, sandboxes: &mut impl Sandboxes<Incarnation>, now: Instant) {
        while let Some(deadline) = self.deadlines.pop_due(now) {
            match deadline {
                Deadline::Escalate(incarnation) => {
                    if let Some(sandbox) = self.current(incarnation).and_then(|a| a.sandbox) {
                        log::info!("agent {}: grace over, SIGKILL", incarnation.agent);
                        sandboxes.signal(sandbox, libc::SIGKILL);
                    }
                }
                Deadline::Restart(incarnation) => {
                    let due = self
                        .current(incarnation)
                        .is_some_and(|a| a.state == AgentState::Restarting);
                    if due {
                        self.start_incarnation(sandboxes, incarnation.agent, now);
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
                    if self
                        .table
                        .get(&id)
                        .is_some_and(|a| !a.is_live() && expired(a))
                    {
                        self.table.remove(&id);
                    }
                }
            }
        }
    }

    /// Stops every agent: SIGTERM now, SIGKILL after the stop grace (or
    /// `grace`, if shorter).
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        grace: Duration,
    ) {
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
            self.stop(sandboxes, replies, id, StopReason::Shutdown, grace, now);
        }
    }

    /// The agent, if `incarnation` is its current incarnation.
    fn current(&mut self, incarnation: Incarnation) -> Option<&mut Agent> {
        self.table
            .get_mut(&incarnation.agent)
            .filter(|a| a.incarnation == incarnation.number)
    }

    /// Starts the agent's next incarnation: in a warm sandbox if one fits, else in
    /// one prepared for it.
    pub(super) fn start_incarnation(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        id: u32,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.incarnation += 1;
        agent.state = AgentState::Starting;
        agent.workload = WorkloadReport::default();
        agent.oom_killed = false;
        agent.started_at = SystemTime::now();
        agent.started = now;
        let incarnation = Incarnation {
            agent: id,
            number: agent.incarnation,
        };
        let shape = agent.shape(sandboxes);
        if let Some(sandbox) = sandboxes.acquire(incarnation, shape, now) {
            self.claim(sandboxes, sandbox, incarnation);
        }
    }

    /// A sandbox arrived for `incarnation`: claim it, unless the incarnation was stopped
    /// (or superseded) while it was prepared.
    fn sandbox_ready(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        incarnation: Incarnation,
        sandbox: SandboxKey,
        now: Instant,
    ) {
        let wanted = self
            .current(incarnation)
            .is_some_and(|a| a.state == AgentState::Starting && a.stop.is_none());
        if wanted {
            return self.claim(sandboxes, sandbox, incarnation);
        }
        sandboxes.discard(sandbox);
        let stopped_early = self
            .table
            .get(&incarnation.agent)
            .is_some_and(|a| a.stop.is_some() && a.is_live() && a.sandbox.is_none());
        if stopped_early {
            self.killed_before_start(sandboxes, replies, incarnation.agent, now);
        }
    }

    /// Gives the sandbox to the incarnation: it is told what to run, and its cgroup
    /// becomes the agent's, with the agent's limits.
    fn claim(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        sandbox: SandboxKey,
        incarnation: Incarnation,
    ) {
        let Some(agent) = self.table.get_mut(&incarnation.agent) else {
            return sandboxes.discard(sandbox);
        };
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
            limits: cgroup_limits(&agent.limits),
            door: agent.door,
            channel: None,
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
    fn run_ended(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        id: u32,
        end: SandboxEnd,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
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
        agent.oom_killed |= end.oom_killed;
        agent.last_run = end.usage;
        agent.sampled = CgroupStats::default();
        self.counts.ended_cpu.add(&end.usage);
        if let Some((code, message)) = agent.workload.start_error.clone() {
            log::info!("agent {id} ({}): could not start: {message}", agent.name);
            return self.fail_start(sandboxes, replies, id, code, message, now);
        }
        if !agent.workload.ready {
            let message = if agent.stop.is_some() {
                "the agent was stopped before it started".to_owned()
            } else {
                "the sandbox ended before the workload started; see the agent log".to_owned()
            };
            return self.fail_start(sandboxes, replies, id, ErrorCode::Internal, message, now);
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
        self.after_run(sandboxes, id, end, now);
    }

    /// An incarnation could not start: answer a waiting SPAWN (the agent is then
    /// simply `failed`), or let the restart policy decide.
    fn fail_start(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
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
        // A SPAWN still waiting hears of the incarnation a restart starts.
        let restarting = agent.stop == Some(StopReason::Restart);
        if let Some(waiter) = agent.spawn_reply.take_if(|_| !restarting) {
            replies.push((waiter.reply_to, ErrorReply::new(code, message).into()));
            return self.finish(sandboxes, id, now);
        }
        let end = if agent.stop.is_some() {
            Ending::Stopped
        } else {
            Ending::Failure
        };
        self.after_run(sandboxes, id, end, now);
    }

    /// An incarnation stopped before it had a sandbox: a SPAWN still waiting hears so.
    fn killed_before_start(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        id: u32,
        now: Instant,
    ) {
        let message = format!("agent {id} was killed before it started");
        self.fail_start(sandboxes, replies, id, ErrorCode::NotFound, message, now);
    }

    /// An incarnation is over: restart it, or let the agent end.
    fn after_run(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        id: u32,
        end: Ending,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        if self.shutting_down {
            return self.finish(sandboxes, id, now);
        }
        if agent.stop == Some(StopReason::Restart) {
            log::info!("agent {id} ({}): stopped; starting it again", agent.name);
            return self.start_again(sandboxes, id, now);
        }
        match agent.restarts.decide(end, now) {
            Decision::RestartAfter(delay) => {
                self.counts.restarts += 1;
                log::info!("agent {id} ({}): restarting in {delay:?}", agent.name);
                agent.state = AgentState::Restarting;
                let incarnation = Incarnation {
                    agent: id,
                    number: agent.incarnation,
                };
                self.deadlines
                    .schedule(now + delay, Deadline::Restart(incarnation));
            }
            Decision::Rest => self.finish(sandboxes, id, now),
            Decision::GiveUp => {
                log::warn!("agent {id} ({}): restarts used up; failed", agent.name);
                agent.state = AgentState::Failed;
                self.finish(sandboxes, id, now);
            }
        }
    }

    /// The agent has ended for good: close its socket, and forget it after
    /// the retention time.
    fn finish(&mut self, sandboxes: &mut impl Sandboxes<Incarnation>, id: u32, now: Instant) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        agent.ended = Some(now);
        if let Some(door) = agent.door.take() {
            sandboxes.close_door(door);
        }
        self.deadlines
            .schedule(now + self.retention, Deadline::Forget { id });
    }

    /// Asks a live agent to stop.
    pub(super) fn stop(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        id: u32,
        why: StopReason,
        grace: Duration,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(&id) else {
            return;
        };
        // Its work ends now, not once its processes have heeded the signal.
        self.ended.push(id);
        agent.stop = Some(why);
        if agent.state == AgentState::Restarting {
            // Nothing runs while it waits out its backoff.
            if why == StopReason::Restart {
                return self.start_again(sandboxes, id, now);
            }
            agent.state = AgentState::Killed;
            return self.finish(sandboxes, id, now);
        }
        let incarnation = Incarnation {
            agent: id,
            number: agent.incarnation,
        };
        let sandbox = agent.sandbox;
        if sandboxes.withdraw(incarnation) {
            // Waiting for any sandbox: nothing runs yet, so it ends here.
            return self.killed_before_start(sandboxes, replies, id, now);
        }
        let Some(sandbox) = sandbox else {
            // Its own sandbox is still being prepared: it is discarded on arrival.
            return;
        };
        if grace.is_zero() {
            sandboxes.signal(sandbox, libc::SIGKILL);
        } else {
            sandboxes.signal(sandbox, libc::SIGTERM);
            self.deadlines
                .schedule(now + grace, Deadline::Escalate(incarnation));
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

/// Applies one status line to an agent.
fn apply_status(agent: &mut Agent, status: Status, replies: &mut Vec<Reply>) {
    match status {
        Status::Ready { .. } => {
            agent.workload.ready = true;
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
