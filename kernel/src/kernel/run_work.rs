//! EXEC runs as principals of their own, and what ends with whom: a run is
//! admitted with what its request asks within its caller's, and when it is
//! over — or an agent ends — the agents, runs, sessions and tasks it
//! started end too.

use agentos_proto::payload::ExecRequest;
use agentos_proto::{ErrorCode, ErrorReply};

use super::actor::{Actor, Permission};
use super::runs::Runs;
use super::sandboxes::agent_sandboxes;
use super::Kernel;
use crate::address::ReplyTo;
use crate::exec::{ChargedTo, RunCaller};
use crate::identity::Principal;
use crate::llm::Asker;
use crate::telemetry::tracer::SpanAgent;

impl Kernel {
    /// Starts an EXEC run for `principal`, answered at `reply_to`. The run
    /// is a principal of its own: what `request` asks for it, within what
    /// `principal` has, recorded under its number, which its own kernel
    /// connection speaks for.
    pub fn start_run(
        &mut self,
        request: ExecRequest,
        principal: Principal,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        let actor = self.task_actor(principal)?;
        actor.require(Permission::Exec)?;
        let caller = self.run_caller(&actor);
        let limits = self.exec.run_limits(&caller, request.limits.as_ref())?;
        let tokens_left = self.llm.tokens_left(actor.budgets());
        let grant = actor.grant_run(
            &request,
            &limits,
            tokens_left,
            self.gateway.default_policy(),
            reply_to,
            self.runs.next_number(),
        )?;
        let mut caller = caller;
        caller.policy = grant.network.policy().cloned();
        if let (Some(_), Some(why)) = (&caller.policy, self.gateway.unavailable()) {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("EXEC field `network`: policies cannot be served: {why}"),
            ));
        }
        let number = self.runs.admit(grant);
        self.exec
            .run(request, caller, number, reply_to, &mut self.outbox.replies)
            .inspect_err(|_| self.runs.refused(number))
    }

    /// What EXEC needs to know of whoever asks for a run: whose work it is
    /// and whose share it counts against, its limits, and the agent cgroup
    /// its memory and processes are charged under.
    pub fn run_caller(&self, actor: &Actor<'_>) -> RunCaller {
        let charged_to = actor.root().agent().and_then(|agent| {
            let sandbox = self.agents.sandbox_of(agent)?;
            let cgroup = self.sandboxes.cgroup_of(sandbox)?;
            Some(ChargedTo {
                agent,
                cgroup: cgroup.to_path_buf(),
            })
        });
        RunCaller {
            agent: self.span_agent(actor),
            principal: actor.principal(),
            share: actor.share(&self.agents),
            limits: actor.limits(),
            charged_to,
            policy: None,
            // What an agent's runs reach counts in the agent's own record.
            net_record: actor
                .root()
                .agent()
                .and_then(|agent| self.agents.net_record(agent)),
        }
    }

    /// The agent whose work `actor`'s request is (its own, or its run's),
    /// as spans name it.
    pub fn span_agent(&self, actor: &Actor<'_>) -> Option<SpanAgent> {
        if !self.tracer.is_on() {
            return None;
        }
        let id = actor.root().agent()?;
        let name = self.agents.grant(id)?.name.to_owned();
        Some(SpanAgent { id, name })
    }

    /// Who is asking THINK, as the fair queue and the token budgets know
    /// it. An agent's weight and quota come from its name and its SPAWN
    /// permissions; an EXEC run's THINKs are its agent's — queued and
    /// charged as the agent's, within the run's own budget too if it has
    /// one — and an operator's (or an operator's run's) are those of
    /// `flow`, the asking connection, with neither limit.
    pub fn asker(&self, actor: &Actor<'_>, flow: u32) -> Result<Asker, ErrorReply> {
        actor.require(Permission::Think)?;
        let agent = actor.root().agent();
        let weight = agent
            .and_then(|id| self.agents.grant(id))
            .map_or(1, |grant| self.llm.weight_of(grant.name));
        Ok(Asker {
            id: agent.unwrap_or(flow),
            weight,
            budgets: actor.budgets().to_vec(),
            agent: self.span_agent(actor),
        })
    }

    /// Run `number` is over (its reply has gone): the agents it spawned are
    /// stopped, and its own runs and sessions end.
    pub(super) fn end_run(&mut self, number: u64) {
        self.llm.forget_budget(Runs::budget_key(number));
        self.agents.stop_started_by(
            &mut agent_sandboxes(&mut self.sandboxes),
            &mut self.outbox.replies,
            number,
        );
        self.end_work_of(
            Principal::Run { number },
            "the EXEC run that asked for it has ended",
        );
    }

    /// Agent `id`'s incarnation has ended, or it is being stopped: its EXEC
    /// runs, sessions and tasks end.
    pub(super) fn end_agent_work(&mut self, id: u32) {
        self.end_work_of(
            Principal::Agent { id },
            "the agent that asked for it has ended",
        );
    }

    /// What `principal` asked for ends with it, because `why`: its EXEC
    /// runs and sessions, and its tasks (an operator's are never ended so).
    fn end_work_of(&mut self, principal: Principal, why: &str) {
        self.exec
            .end_work_of(principal, why, &mut self.outbox.replies);
        if matches!(principal, Principal::Operator { .. }) {
            return;
        }
        for stop in self
            .tasks
            .end_owner(principal, why, &mut self.outbox.replies)
        {
            self.stop_task(stop);
        }
        self.close_ended_task_sessions();
        if let Principal::Run { .. } = principal {
            self.tasks.forget_owner(principal);
        }
    }
}
