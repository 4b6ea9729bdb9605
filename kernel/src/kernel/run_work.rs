//! EXEC runs as principals of their own, and what ends with whom: what
//! EXEC, THINK and spans know of whoever asks, and when a run is over — or
//! an agent ends — the agents, runs, sessions and tasks it started end too.

use agentos_egress::Gateway;
use agentos_proto::{ErrorCode, ErrorReply};

use super::actor::{Actor, Permission};
use super::runs::{Root, Runs};
use super::sandboxes::{agent_sandboxes, SandboxOwner};
use super::task_work;
use crate::address::Reply;
use crate::agents::Agents;
use crate::exec::{ChargedTo, Exec, RunCaller};
use crate::fleet::owners::quota_owner;
use crate::identity::Principal;
use crate::llm::{Asker, Llm};
use crate::sandbox::runtime::Runtime;
use crate::tasks::Tasks;
use crate::telemetry::tracer::SpanAgent;

/// What EXEC needs to know of whoever asks for a run: whose work it is
/// and whose share it counts against, its limits, and the agent cgroup
/// its memory and processes are charged under. `agent` is the agent its
/// spans name, if they are traced.
pub fn run_caller(
    actor: &Actor<'_>,
    agents: &Agents,
    sandboxes: &Runtime<SandboxOwner>,
    agent: Option<SpanAgent>,
) -> RunCaller {
    let charged_to = actor.root().agent().and_then(|agent| {
        let sandbox = agents.sandbox_of(agent)?;
        let cgroup = sandboxes.cgroup_of(sandbox)?;
        Some(ChargedTo {
            agent,
            cgroup: cgroup.to_path_buf(),
        })
    });
    RunCaller {
        agent,
        principal: actor.principal(),
        share: actor.share(agents),
        limits: actor.limits(),
        charged_to,
        policy: None,
        // What an agent's runs reach counts in the agent's own record.
        net_record: actor
            .root()
            .agent()
            .and_then(|agent| agents.net_record(agent)),
    }
}

/// A run's caller may have it reach only what the egress proxy can
/// serve: a policy given where policies cannot be served is refused.
pub fn check_policy_served(caller: &RunCaller, gateway: &Gateway) -> Result<(), ErrorReply> {
    match (&caller.policy, gateway.unavailable()) {
        (Some(_), Some(why)) => Err(ErrorReply::new(
            ErrorCode::Unavailable,
            format!("EXEC field `network`: policies cannot be served: {why}"),
        )),
        _ => Ok(()),
    }
}

/// The agent whose work `actor`'s request is (its own, or its run's),
/// as spans name it.
pub fn span_agent(actor: &Actor<'_>, agents: &Agents) -> Option<SpanAgent> {
    let id = actor.root().agent()?;
    let name = agents.grant(id)?.name.to_owned();
    Some(SpanAgent { id, name })
}

/// Who is asking THINK, as the fair queue and the token budgets know
/// it. An agent's weight and quota come from its name and its SPAWN
/// permissions; an EXEC run's THINKs are its agent's — queued and
/// charged as the agent's, within the run's own budget too if it has
/// one — and an operator's (or an operator's run's) are those of
/// `flow`, the asking connection, held to the `[llm.quota]` of the
/// operator or delegate at the root. `agent` is the agent its spans
/// name, if they are traced.
pub fn asker(
    actor: &Actor<'_>,
    flow: u32,
    agents: &Agents,
    llm: &Llm,
    agent: Option<SpanAgent>,
) -> Result<Asker, ErrorReply> {
    actor.require(Permission::Think)?;
    let id = actor.root().agent();
    let weight = id
        .and_then(|id| agents.grant(id))
        .map_or(1, |grant| llm.weight_of(grant.name));
    let quota = match actor.root() {
        _ if !llm.has_quota() => None,
        Root::Operator(uid) => quota_owner(Principal::Operator { uid }),
        Root::Delegate(uid, name) => quota_owner(Principal::Delegate { uid, name }),
        Root::Agent(_) => None,
    };
    Ok(Asker {
        id: id.unwrap_or(flow),
        weight,
        budgets: actor.budgets().to_vec(),
        agent,
        quota,
    })
}

/// Run `number` is over (its reply has gone): the agents it spawned are
/// stopped, and its own runs and sessions end.
pub fn end_run(
    number: u64,
    agents: &mut Agents,
    sandboxes: &mut Runtime<SandboxOwner>,
    exec: &mut Exec,
    tasks: &mut Tasks,
    llm: &mut Llm,
    replies: &mut Vec<Reply>,
) {
    llm.forget_budget(Runs::budget_key(number));
    agents.stop_started_by(&mut agent_sandboxes(sandboxes), replies, number);
    end_work_of(
        Principal::Run { number },
        "the EXEC run that asked for it has ended",
        exec,
        tasks,
        llm,
        replies,
    );
}

/// Agent `id`'s incarnation has ended, or it is being stopped: its EXEC
/// runs, sessions and tasks end.
pub fn end_agent_work(
    id: u32,
    exec: &mut Exec,
    tasks: &mut Tasks,
    llm: &mut Llm,
    replies: &mut Vec<Reply>,
) {
    end_work_of(
        Principal::Agent { id },
        "the agent that asked for it has ended",
        exec,
        tasks,
        llm,
        replies,
    );
}

/// What `principal` asked for ends with it, because `why`: its EXEC
/// runs and sessions, and its tasks (an operator's or a delegate's are
/// never ended so).
fn end_work_of(
    principal: Principal,
    why: &str,
    exec: &mut Exec,
    tasks: &mut Tasks,
    llm: &mut Llm,
    replies: &mut Vec<Reply>,
) {
    exec.end_work_of(principal, why, replies);
    if principal.outlives_kernels() {
        return;
    }
    for stop in tasks.end_owner(principal, why, replies) {
        task_work::stop(stop, exec, llm, replies);
    }
    task_work::close_ended_sessions(tasks, exec, replies);
    if let Principal::Run { .. } = principal {
        tasks.forget_owner(principal);
    }
}
