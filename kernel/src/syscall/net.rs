//! NET (0x17): an agent's network — `show` its policy and connection
//! record, or `set` a new policy while it runs. Whom a caller may see is
//! LIST's rule; what it may set is within what it has itself.

use agentos_proto::payload::{AuditCategory, NetOp, NetRequest};
use agentos_proto::ErrorReply;

use super::audit::note;
use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::Kernel;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let answer = NetRequest::parse(request.payload).and_then(|net| {
        let actor = actor(kernel, request)?;
        let viewer = actor.viewer();
        let target = net.target()?;
        let reply = match (net.op, &net.network) {
            (NetOp::Set, Some(network)) => {
                let bound = actor.network().clone();
                let (reply, changed) = kernel.agents.net_set(viewer, &bound, &target, network)?;
                // What those agents started narrows with them: their runs'
                // grants, the endpoints of their runs and sessions, and
                // the runs still queued, which are held to it when they
                // start (a task's and a prompt loop's runs among them).
                for (agent, policy) in changed {
                    let owners = kernel.runs.narrow_for_agent(agent, &policy);
                    kernel.exec.policies_replaced(owners);
                    let security = AuditCategory::Security;
                    note(
                        kernel,
                        request,
                        security,
                        "NETWORK_POLICY_CHANGED",
                        Some(agent),
                        network,
                    );
                }
                reply
            }
            _ => kernel.agents.net_show(viewer, &target)?,
        };
        Ok::<_, ErrorReply>(Answer::json(&reply))
    });
    Outcome::Reply(answer.unwrap_or_else(Answer::from))
}
