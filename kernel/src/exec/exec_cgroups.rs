//! The cgroups EXEC's runs get, as the reactor holds them: the thread that
//! makes each run's own ahead of need (`cgroups`; none on a host without
//! cgroups), the spare ones kept inside each agent's cgroup for its runs
//! (so what they use adds up against the agent's limits), and the limits a
//! run gets when it asks for none.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use agentos_proto::payload::Limits;
use agentos_proto::{ErrorCode, ErrorReply};

use super::cgroups::{Made, RunCgroups};
use super::limits::{self, RunDefaults};
use super::run_cgroup::{AgentRunCgroups, ChargedTo, RunCgroup, AGENT_SPARES};
use crate::cgroup::{CgroupError, CgroupLimits, Cgroups};

/// Runs' cgroups: made, kept for agents, recycled.
#[derive(Debug)]
pub struct ExecCgroups {
    /// Makes and removes runs' own cgroups (none without cgroups).
    thread: Option<RunCgroups>,
    /// Cgroups inside agents' own for their runs, by agent.
    agents: HashMap<u32, AgentRunCgroups>,
    /// A run's limits when it asks for none.
    defaults: RunDefaults,
}

impl ExecCgroups {
    /// With `cgroups`, each run gets a cgroup of its own, made in the
    /// background, which wakes `waker`; without, runs go without.
    pub fn start(
        cgroups: Option<Arc<Cgroups>>,
        defaults: RunDefaults,
        waker: Arc<mio::Waker>,
    ) -> io::Result<ExecCgroups> {
        let thread = match cgroups {
            Some(cgroups) => Some(RunCgroups::start(cgroups, defaults.cgroup_limits(), waker)?),
            None => None,
        };
        Ok(ExecCgroups {
            thread,
            agents: HashMap::new(),
            defaults,
        })
    }

    /// The thread that makes runs' cgroups, if there is one.
    pub fn thread(&self) -> Option<&RunCgroups> {
        self.thread.as_ref()
    }

    /// A run's cgroup limits: what `asked` asks for, else the defaults —
    /// never more than its caller's `own`.
    pub fn limits(&self, own: &Limits, asked: Option<&Limits>) -> Result<CgroupLimits, ErrorReply> {
        limits::run_limits(own, asked, self.defaults)
    }

    /// A requested run's limits, as [`ExecCgroups::limits`]; limits of its
    /// own are refused where runs get no cgroups.
    pub fn for_request(
        &self,
        own: &Limits,
        asked: Option<&Limits>,
    ) -> Result<CgroupLimits, ErrorReply> {
        if asked.is_some() && self.thread.is_none() {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "EXEC field `limits`: this host gives the kernel no cgroups, so a run cannot \
                 have limits of its own",
            ));
        }
        self.limits(own, asked)
    }

    /// Whether a request charged to an agent (`to`) has a cgroup inside the
    /// agent's ready for it (one that is not charged needs none).
    pub fn has_for(&self, to: Option<&ChargedTo>) -> bool {
        to.is_none_or(|to| {
            self.agents
                .get(&to.agent)
                .is_some_and(|made| made.cgroup == to.cgroup && !made.spare.is_empty())
        })
    }

    /// A spare cgroup inside the agent's, for a run charged to it.
    pub fn take_for(&mut self, to: &ChargedTo) -> Option<RunCgroup> {
        self.agents
            .get_mut(&to.agent)
            .filter(|made| made.cgroup == to.cgroup)
            .and_then(|made| made.spare.pop())
    }

    /// Asks the thread for a cgroup inside each agent's whose queued runs
    /// (`wanted`, their charges) need one and has none spare (or coming).
    pub fn ask_for_agents<'a>(&mut self, wanted: impl Iterator<Item = &'a ChargedTo>) {
        let Some(thread) = &self.thread else {
            return;
        };
        for to in wanted {
            let agent = self
                .agents
                .entry(to.agent)
                .or_insert_with(|| AgentRunCgroups {
                    cgroup: to.cgroup.clone(),
                    spare: Vec::new(),
                    asked: 0,
                });
            if agent.cgroup != to.cgroup {
                // The agent has restarted in a new cgroup: the old one's
                // spares go with it.
                for run in agent.spare.drain(..) {
                    thread.remove(run);
                }
                agent.cgroup = to.cgroup.clone();
                agent.asked = 0;
            }
            if agent.spare.is_empty() && agent.asked == 0 {
                agent.asked += 1;
                thread.make_inside(to.clone());
            }
        }
    }

    /// The cgroups the thread has made since the last call.
    pub fn made(&self) -> Vec<Made> {
        self.thread
            .as_ref()
            .map(|thread| thread.made().collect())
            .unwrap_or_default()
    }

    /// A cgroup made inside an agent's (or returned after a run of its):
    /// kept for its next runs while the agent's cgroup is the same, else
    /// removed. If none could be made, the reply the agent's waiting runs
    /// get now, rather than ask again and again until their deadlines.
    pub fn made_for_agent(
        &mut self,
        to: &ChargedTo,
        result: Result<RunCgroup, CgroupError>,
    ) -> Result<(), ErrorReply> {
        let Some(thread) = &self.thread else {
            return Ok(());
        };
        let agent = self
            .agents
            .get_mut(&to.agent)
            .filter(|made| made.cgroup == to.cgroup);
        match (agent, result) {
            (Some(agent), Ok(run)) => {
                agent.asked = agent.asked.saturating_sub(1);
                if agent.spare.len() < AGENT_SPARES {
                    agent.spare.push(run);
                } else {
                    thread.remove(run);
                }
                Ok(())
            }
            (None, Ok(run)) => {
                thread.remove(run);
                Ok(())
            }
            (agent, Err(err)) => {
                log::error!(
                    "agent {}: no cgroup inside its own for a run: {err}",
                    to.agent
                );
                if let Some(agent) = agent {
                    agent.asked = agent.asked.saturating_sub(1);
                }
                Err(ErrorReply::new(
                    ErrorCode::Internal,
                    format!("no cgroup could be made for the run inside its agent's: {err}"),
                ))
            }
        }
    }

    /// An agent's cgroup is going: the cgroups made inside it for its runs
    /// go first.
    pub fn forget_agent(&mut self, agent: u32) {
        let Some(made) = self.agents.remove(&agent) else {
            return;
        };
        if let Some(thread) = &self.thread {
            made.spare.into_iter().for_each(|run| thread.remove(run));
        }
    }

    /// Hands back cgroups whose runs are over.
    pub fn recycle(&self, cgroups: impl IntoIterator<Item = RunCgroup>) {
        if let Some(thread) = &self.thread {
            cgroups.into_iter().for_each(|c| thread.recycle(c));
        }
    }

    /// Last step of shutdown (may block briefly): `left`, and the spares
    /// kept for agents, are removed with whatever is left in them, and the
    /// thread stops.
    pub fn finish(&mut self, left: impl IntoIterator<Item = RunCgroup>) {
        let Some(mut thread) = self.thread.take() else {
            return;
        };
        left.into_iter().for_each(|c| thread.recycle(c));
        for (_, agent) in self.agents.drain() {
            agent.spare.into_iter().for_each(|c| thread.recycle(c));
        }
        thread.finish();
    }
}
