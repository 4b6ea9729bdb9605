//! HELLO (0xFE): protocol version, kernel version, identity and features.

use agentos_proto::payload::{Features, HelloReply, HelloRequest, ProtocolLimits};
use agentos_proto::{MAX_REPLY_BYTES, PROTOCOL_VERSION};

use super::request::{actor, reply, Outcome, Request};
use crate::identity::Principal;
use crate::kernel::Kernel;
use crate::sandbox::runtime::Sandboxes;

/// Reports what really works on this host now: a subsystem that is not
/// configured or is down is `false`.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let session_disks = kernel.exec.disks().store.available();
    reply(HelloRequest::parse(request.payload).map(|_| {
        let config = kernel.config();
        // A caller that is refused (an agent forgotten, a run that is
        // over) learns of no server at all.
        let actor = actor(kernel, request);
        let tool_patterns = match &actor {
            Ok(actor) => actor.tools().map(<[String]>::to_vec),
            Err(_) => Some(Vec::new()),
        };
        let operator = actor.is_ok_and(|actor| {
            matches!(
                actor.principal(),
                Principal::Operator { .. } | Principal::Delegate { .. }
            )
        });
        HelloReply {
            success: true,
            protocol_version: PROTOCOL_VERSION,
            kernel_version: env!("CARGO_PKG_VERSION").to_owned(),
            agent_id: request.caller.identity.id(),
            principal: Some(
                kernel
                    .runs
                    .describe(request.caller.principal(), &kernel.agents),
            ),
            features: Features {
                think: kernel.llm.is_available(),
                exec: kernel.exec.is_available(),
                spawn: true,
                // The built-in tools always work; each server's state is
                // in `tool_servers`.
                tools: true,
                task: true,
                cgroup: kernel.sandboxes.machine().cgroup_version(),
                network_policy: kernel.gateway.unavailable().is_none(),
                pause: kernel.sandboxes.machine().can_freeze(),
                session_disks,
                // Processes run in sessions, which EXEC gives.
                processes: kernel.exec.is_available(),
                fleet: kernel.fleet.is_joined(),
            },
            limits: Some(ProtocolLimits {
                max_request_bytes: config.max_request_bytes,
                max_reply_bytes: MAX_REPLY_BYTES,
                max_in_flight: config.max_in_flight,
            }),
            llm: Some(kernel.llm.info()),
            tool_servers: Some(kernel.tools.info_seen_by(tool_patterns.as_deref())),
            node: (kernel.fleet.link().ok())
                .filter(|_| operator)
                .map(|link| link.node().to_owned()),
        }
    }))
}
