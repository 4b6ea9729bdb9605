//! HTTP (0x50): a request the kernel makes for its caller (see
//! `http_call`), to what the caller's network allows: its policy; with the
//! host's network, the kernel's configured default policy (`[network]
//! default_allow`, where loopback and private ranges are reached only when
//! an entry names them); with its own loopback only, nothing.

use agentos_egress::policy::Policy;
use agentos_egress::Egress;
use agentos_proto::payload::HttpRequest;
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, Outcome, Request};
use crate::as_caller::AsCaller;
use crate::kernel::{Kernel, Permission};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let started = HttpRequest::parse(request.payload).and_then(|asked| {
        let actor = actor(kernel, request)?;
        actor.require(Permission::Http)?;
        let policy = match actor.network() {
            Egress::Policy(policy) => policy.clone(),
            Egress::Host => host_policy(kernel.gateway.default_policy())?,
            Egress::Loopback => {
                return Err(ErrorReply::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "HTTP: {} reaches its own loopback only; a network policy (SPAWN's, \
                         EXEC's or NET's `network`) says what else it may reach",
                        actor.name()
                    ),
                ))
            }
        };
        let who = AsCaller {
            uid: request.peer.uid,
            gid: request.peer.gid,
            groups: request.groups.to_vec(),
        };
        let principal = actor.principal();
        kernel
            .services
            .http_calls
            .start(principal, who, policy, asked, request.reply_to)
    });
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// What a caller with the host's network may reach through the kernel.
fn host_policy(default: Option<&Policy>) -> Result<Policy, ErrorReply> {
    default.cloned().ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::PermissionDenied,
            "HTTP: the kernel's [network] default_allow is empty, so its requests for callers \
             with the host's network reach nothing; name the hosts they may reach there",
        )
    })
}
