//! Agents: isolated processes the kernel starts, watches, restarts and
//! stops.
//!
//! This module is the agent table (`table`) and its policy — who may spawn
//! (`admission`), kill (`control`) and list (`views`) what, what a child
//! may be given (`inheritance`), what runs ([`program`]), and each agent's
//! life (`lifecycle`). [`Agents`] is the one door to them: it holds the
//! table, the admission, the lives and what the metrics count (`usage`),
//! and calls the policy's functions (`views`, `control`, `network`,
//! `inheritance`, [`program`]). The sandboxes agents run in belong to the
//! sandbox runtime ([`crate::sandbox::runtime`]), reached only through its
//! [`Sandboxes`] seam: each incarnation of an agent acquires a sandbox,
//! claims it, and hears back through [`SandboxEvent`]s.
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
mod inheritance;
mod interpreter;
mod isolation;
mod lifecycle;
pub mod log_reader;
mod members;
pub mod network;
pub mod program;
mod record;
pub mod restart;
mod table;
#[cfg(test)]
mod tests;
mod usage;
mod views;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_egress::policy::Policy;
use agentos_egress::record::Record as NetRecord;
use agentos_egress::{Egress, Gateway};
use agentos_proto::payload::{
    AgentInfo, AgentRef, AgentState, KillRequest, Limits, NetReply, Network, Permissions,
    SpawnRequest,
};
use agentos_proto::ErrorReply;

use crate::address::{Reply, ReplyTo};
use crate::cgroup::CgroupStats;
use crate::config::Config;
use crate::events::{Audience, Journal, Notice};
use crate::permissions::Budget;
use crate::sandbox::attach::VolumePlace;
use crate::sandbox::runtime::{SandboxEvent, SandboxKey, Sandboxes};
pub use admission::{default_limits, RunSpawner, Spawner};
use admission::{open_door, shutting_down, Admission};
pub use inheritance::Grant;
pub use isolation::cgroup_limits;
use lifecycle::{Effects, Life};
pub use members::Member;
use program::Lookup;
pub use record::{Incarnation, Restarted};
use record::{SpawnWaiter, StopReason};
use table::Table;
pub use table::Viewer;
pub use usage::{AgentCounts, CpuTotals};
pub use views::{AgentFacts, AgentLog};

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

/// The agents table and everything that keeps it current.
#[derive(Debug)]
pub struct Agents {
    /// Every agent, live or recently ended.
    table: Table,
    /// What a new agent is given, and whether there is room for it.
    admission: Admission,
    /// The deadlines and the shutdown that drive agents' lives.
    life: Life,
    /// What the metrics count of agents.
    pub counts: AgentCounts,
    /// What happened to agents in the step under way, not yet told.
    notices: Vec<Notice>,
    /// What happened to agents, with who may see it, for the events hub.
    journal: Journal,
}

impl Agents {
    /// The agents table for `config`; creates the log directory.
    pub fn new(config: &Config, gateway: Arc<Gateway>) -> io::Result<Agents> {
        let agents = &config.agents;
        let life = Life::new(
            Duration::from_secs(agents.retention_secs),
            Duration::from_millis(agents.stop_grace_ms),
            Arc::clone(&gateway),
        );
        Ok(Agents {
            table: Table::default(),
            admission: Admission::new(config, gateway)?,
            life,
            counts: AgentCounts::default(),
            notices: Vec::new(),
            journal: Journal::default(),
        })
    }

    /// An agent's name, what it may ask of the kernel, and the token
    /// budgets it draws on.
    pub fn grant(&self, id: u32) -> Option<AgentGrant<'_>> {
        self.table.get(id).map(|agent| AgentGrant {
            name: &agent.name,
            permissions: &agent.permissions,
            limits: agent.limits,
            network: &agent.egress,
            budgets: &agent.budgets,
        })
    }

    /// Live agents' ids with their current incarnations' sandboxes.
    pub fn live_sandboxes(&self) -> impl Iterator<Item = (u32, SandboxKey)> + '_ {
        self.table
            .values()
            .filter(|agent| agent.is_live())
            .filter_map(|agent| agent.sandbox.map(|sandbox| (agent.id, sandbox)))
    }

    /// The host pid of agent `id`'s top process, while it has one (what
    /// an operator's LIST shows).
    pub fn host_pid(&self, id: u32) -> Option<u32> {
        self.table.get(id)?.pid.map(|pid| pid as u32)
    }

    /// The sandbox of agent `id`'s current incarnation, if it has one.
    pub fn sandbox_of(&self, id: u32) -> Option<SandboxKey> {
        self.table.get(id).and_then(|agent| agent.sandbox)
    }

    /// Whether an agent's incarnation has ended, or it is being stopped,
    /// since the last [`take_ended`](Self::take_ended).
    pub fn has_ended(&self) -> bool {
        self.life.has_ended()
    }

    /// Agents whose incarnation has ended or is being stopped since the last
    /// call: the work they started — EXEC runs, sessions, tasks — ends with it.
    pub fn take_ended(&mut self) -> Vec<u32> {
        self.life.take_ended()
    }

    /// Stops the live agents EXEC run `number` started, and everything
    /// they started in turn: they end with the run.
    pub fn stop_started_by(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        number: u64,
    ) {
        let doomed = self
            .table
            .live_ids(|a| self.table.sees(Viewer::Run(number), a.id));
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
        volumes: Vec<VolumePlace>,
        reply_to: ReplyTo,
    ) -> Result<u32, ErrorReply> {
        let waiter = SpawnWaiter {
            reply_to,
            by_agent: !matches!(spawner, Spawner::Operator(_)),
            warnings: Vec::new(),
        };
        let asked = (request, volumes);
        self.admit(sandboxes, spawner, asked, tokens_left, Some(waiter))
    }

    /// Starts a boot agent (`[[agents.boot]]`), as the operator would;
    /// returns its id. LIST marks it `boot: true`.
    pub fn spawn_boot(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        request: SpawnRequest,
    ) -> Result<u32, ErrorReply> {
        // The kernel starts them as its own user, the operator it runs as.
        let uid = nix::unistd::geteuid().as_raw();
        let asked = (request, Vec::new());
        let id = self.admit(sandboxes, Spawner::Operator(uid), asked, None, None)?;
        if let Some(agent) = self.table.get_mut(id) {
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
                .and_then(|()| program::check_no_volumes(request))
                .map_err(|refused| BadBootEntry {
                    index,
                    name: request.name.clone(),
                    reason: refused.error,
                })?;
        }
        Ok(())
    }

    /// Whether `viewer` may see agent `id` (LIST's rule).
    pub fn sees(&self, viewer: Viewer, id: u32) -> bool {
        self.table.sees(viewer, id)
    }

    /// The agent at the top of `id`'s family: the eldest ancestor it had
    /// when it was spawned (itself, if none). Kept with the agent, so a
    /// family stays one however its middle generations come and go.
    pub fn root_of(&self, id: u32) -> u32 {
        self.table.root_of(id)
    }

    /// The uid of the operator whose tree agent `id` is in, if it is
    /// known.
    pub fn owner_uid(&self, id: u32) -> Option<u32> {
        self.table.get(id).map(|agent| agent.owner_uid)
    }

    /// What the audit log says of agent `id`, while the table knows it.
    pub fn facts(&self, id: u32) -> Option<AgentFacts> {
        let agent = self.table.get(id)?;
        let mut line: Vec<u32> = self.table.ancestors(id).collect();
        line.reverse();
        line.push(id);
        Some(AgentFacts {
            name: agent.name.clone(),
            owner_uid: agent.owner_uid,
            line,
            state: agent.state,
            incarnation: agent.incarnation,
            exit_code: agent.workload.exit_code,
            signal: agent.workload.signal,
        })
    }

    /// Whether agent `id` has ended for good (not between restarts), or
    /// is forgotten.
    pub fn is_over(&self, id: u32) -> bool {
        self.table.get(id).is_none_or(|agent| agent.ended.is_some())
    }

    /// Agent `id`, unless it has ended for good, as messaging sees it.
    pub fn member(&self, id: u32) -> Option<Member<'_>> {
        let agent = self.table.get(id)?;
        agent.ended.is_none().then(|| Member::of(agent))
    }

    /// Every agent that has not ended for good, as messaging sees it.
    pub fn members(&self) -> impl Iterator<Item = Member<'_>> + '_ {
        self.table
            .values()
            .filter(|agent| agent.ended.is_none())
            .map(Member::of)
    }

    /// The live agent named `name`, if any: its id and whether it is a
    /// boot agent.
    pub fn live_named(&self, name: &str) -> Option<(u32, bool)> {
        self.table.live_named(name).map(|a| (a.id, a.boot))
    }

    /// Admits and starts an agent; `waiter` hears when its first incarnation
    /// starts.
    fn admit(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        spawner: Spawner,
        (request, volumes): (SpawnRequest, Vec<VolumePlace>),
        tokens_left: Option<u64>,
        waiter: Option<SpawnWaiter>,
    ) -> Result<u32, ErrorReply> {
        if self.life.is_shutting_down() {
            return Err(shutting_down());
        }
        let mut agent = self.admission.admit(
            &self.table,
            sandboxes,
            spawner,
            request,
            tokens_left,
            waiter,
        )?;
        agent.volumes = volumes;
        let agent = self.table.insert(agent);
        self.life
            .start_incarnation(agent, sandboxes, Instant::now());
        Ok(agent.id)
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
        let id = control::kill_target(&self.table, caller, request)?;
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

    /// PAUSE and RESUME (`verb`): the live agent `target` names, if
    /// `caller` may stop it, with its name and the sandbox of its current
    /// incarnation (`None` between restarts).
    pub fn to_freeze(
        &self,
        caller: Viewer,
        target: &AgentRef,
        verb: &str,
    ) -> Result<(u32, String, Option<SandboxKey>), ErrorReply> {
        let id = control::live_controlled(&self.table, caller, target, verb)?;
        let agent = self.table.get(id).ok_or_else(|| control::no_agent(id))?;
        Ok((id, agent.name.clone(), agent.sandbox))
    }

    /// The permissions of agent `id`, if `caller` may lower them (itself,
    /// or one it may stop); any other is `not_found`.
    pub fn managed(&self, caller: Viewer, id: u32) -> Result<&Permissions, ErrorReply> {
        let id = control::lowered_target(&self.table, caller, id)?;
        self.table
            .get(id)
            .map(|agent| &agent.permissions)
            .ok_or_else(|| control::no_agent(id))
    }

    /// SET_PERMS on agent `id`: its permissions, and every descendant's,
    /// become what `lower` makes of them, for good (restarts keep them).
    /// Returns what agent `id` keeps.
    pub fn lower(
        &mut self,
        caller: Viewer,
        id: u32,
        lower: impl Fn(Permissions) -> Permissions,
    ) -> Result<Permissions, ErrorReply> {
        let id = control::lowered_target(&self.table, caller, id)?;
        let family: Vec<u32> = self
            .table
            .values()
            .filter(|a| a.id == id || self.table.is_descendant(a.id, id))
            .map(|a| a.id)
            .collect();
        for member in family {
            if let Some(agent) = self.table.get_mut(member) {
                agent.permissions = lower(agent.permissions.clone());
            }
        }
        log::info!("agent {id}: permissions lowered, with its descendants'");
        Ok(self
            .table
            .get(id)
            .map(|agent| agent.permissions.clone())
            .unwrap_or_default())
    }

    /// KILL `remove`: forgets the record of an ended agent. Returns its id.
    pub fn remove(&mut self, caller: Viewer, request: &KillRequest) -> Result<u32, ErrorReply> {
        let id = control::controlled(&self.table, caller, &request.target()?)?;
        if let Some(agent) = self.table.get(id) {
            control::check_removable(agent)?;
            log::info!("agent {id} ({}): record removed", agent.name);
        }
        self.table.remove(id);
        Ok(id)
    }

    /// KILL `restart`: stops the live incarnation (as KILL does) and starts
    /// the next once it has ended; an ended agent whose record is kept
    /// starts again now. Either way the same id, the same spec, and one
    /// more restart counted.
    pub fn restart(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        caller: Viewer,
        request: &KillRequest,
    ) -> Result<(u32, Restarted), ErrorReply> {
        let id = control::controlled(&self.table, caller, &request.target()?)?;
        let now = Instant::now();
        let (live, name) = match self.table.get(id) {
            Some(agent) => (agent.is_live(), agent.name.clone()),
            None => return Err(network::not_found(&AgentRef::Id(id))),
        };
        if live {
            log::info!("agent {id}: KILL restart (grace {} ms)", request.grace_ms());
            let grace = Duration::from_millis(request.grace_ms());
            self.stop(sandboxes, replies, id, StopReason::Restart, grace, now);
            return Ok((id, Restarted::AfterStop));
        }
        if self.life.is_shutting_down() {
            return Err(shutting_down());
        }
        self.admission.check_room(&self.table, &name)?;
        let door = open_door(sandboxes, id)?;
        log::info!("agent {id}: KILL restart of an ended agent");
        if let Some(agent) = self.table.get_mut(id) {
            agent.door = Some(door);
            self.life.start_again(agent, sandboxes, now);
        }
        Ok((id, Restarted::FromEnded))
    }

    /// Asks live agent `id` to stop, because `why`: SIGTERM, and SIGKILL
    /// after `grace`.
    fn stop(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        id: u32,
        why: StopReason,
        grace: Duration,
        now: Instant,
    ) {
        let Some(agent) = self.table.get_mut(id) else {
            return;
        };
        let mut fx = Effects {
            sandboxes,
            replies,
            counts: &mut self.counts,
            notices: &mut self.notices,
            now,
        };
        self.life.stop(agent, &mut fx, why, grace);
        self.note();
    }

    /// Takes in what happened to an incarnation's sandbox.
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        event: SandboxEvent<Incarnation>,
        now: Instant,
    ) {
        let mut fx = Effects {
            sandboxes,
            replies,
            counts: &mut self.counts,
            notices: &mut self.notices,
            now,
        };
        self.life.on_sandbox(&mut self.table, &mut fx, event);
        self.note();
    }

    /// How long until the earliest deadline.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.life.next_deadline(now)
    }

    /// Handles the deadlines that are due.
    pub fn on_deadlines(&mut self, sandboxes: &mut impl Sandboxes<Incarnation>, now: Instant) {
        self.life.on_deadlines(&mut self.table, sandboxes, now);
    }

    /// Stops every agent: SIGTERM now, SIGKILL after the stop grace (or
    /// `grace`, if shorter).
    pub fn begin_shutdown(
        &mut self,
        sandboxes: &mut impl Sandboxes<Incarnation>,
        replies: &mut Vec<Reply>,
        grace: Duration,
    ) {
        let mut fx = Effects {
            sandboxes,
            replies,
            counts: &mut self.counts,
            notices: &mut self.notices,
            now: Instant::now(),
        };
        self.life.begin_shutdown(&mut self.table, &mut fx, grace);
        self.note();
    }

    /// Who may see what happens to agent `id` (see [`crate::events`]).
    pub fn audience(&self, id: u32) -> Option<Audience> {
        self.table.audience(id)
    }

    /// What happened to agents since the events hub last took it in.
    pub fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// Notes in the journal what happened in the step just taken, with
    /// who may see it as things stand now (as LIST would show it).
    fn note(&mut self) {
        for notice in self.notices.drain(..) {
            if let Some(audience) = self.table.audience(notice.data.agent_id) {
                self.journal.push(notice.into_event(audience));
            }
        }
    }

    /// Reads the cgroups of the boot agents and of the next few others.
    pub fn sample_usage(&mut self, sandboxes: &impl Sandboxes<Incarnation>) {
        self.counts.sample(&mut self.table, sandboxes);
    }

    /// CPU used and throttled by every agent: ended incarnations in full,
    /// running ones as last sampled.
    pub fn cpu_totals(&self) -> CpuTotals {
        self.counts.cpu_totals(&self.table)
    }

    /// Boot agents by name with their current (or last) incarnation's
    /// figures: the only agents the metrics name, so the number of series
    /// stays what the configuration says.
    pub fn boot_usage(&self) -> impl Iterator<Item = (&str, CgroupStats)> + '_ {
        usage::boot_usage(&self.table)
    }

    /// LIST: every agent, live or recently ended, for an operator; for an
    /// agent, itself and its descendants, with pids as it sees them.
    pub fn list(
        &self,
        sandboxes: &impl Sandboxes<Incarnation>,
        caller: Viewer,
        now: Instant,
    ) -> Vec<AgentInfo> {
        views::list(&self.table, sandboxes, caller, now)
    }

    /// The log of the agent `target` names, if `caller` may see that agent
    /// (as in LIST): by name, the live agent, else the latest one.
    pub fn log_of(&self, caller: Viewer, target: &AgentRef) -> Option<AgentLog> {
        self.table.seen_by(caller, target).map(views::log_of)
    }

    /// The state of every agent in the table (live, and ended ones not
    /// yet forgotten).
    pub fn states(&self) -> impl Iterator<Item = AgentState> + '_ {
        self.table.values().map(|agent| agent.state)
    }

    /// The connection record of agent `id`'s latest endpoint, if it has
    /// had one: NET `show` reads it, and its runs' connections count in it.
    pub fn net_record(&self, id: u32) -> Option<Arc<Mutex<NetRecord>>> {
        self.table.get(id)?.net_record.clone()
    }

    /// NET `show`: the agent's policy and record.
    pub fn net_show(&self, caller: Viewer, target: &AgentRef) -> Result<NetReply, ErrorReply> {
        let agent = self
            .table
            .seen_by(caller, target)
            .ok_or_else(|| network::not_found(target))?;
        Ok(network::show(agent))
    }

    /// NET `set`: replaces the policy of the agent `target` names with
    /// `network`, which must lie within `bound` (what the caller has) and
    /// within the agent's parent's. An agent cannot change its own.
    /// Returns the reply, and each agent whose policy changed (it and its
    /// descendants) with its new policy, for the work they started.
    pub fn net_set(
        &mut self,
        caller: Viewer,
        bound: &Egress,
        target: &AgentRef,
        network: &Network,
    ) -> Result<(NetReply, Vec<(u32, Policy)>), ErrorReply> {
        network::set(&mut self.table, caller, bound, target, network)
    }
}
