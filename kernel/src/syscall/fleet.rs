//! FLEET (0x1A): the fleet this node has joined. Operators only: a node's
//! address and load are the fleet's business, not an agent's.

use agentos_proto::payload::{FleetOp, FleetRequest, NodesReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::fleet::nodes;
use crate::kernel::{Actor, Kernel};

/// Asked of the fleet thread from a worker: the reactor never waits on the
/// database.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let asked = FleetRequest::parse(request.payload).and_then(|asked| {
        if matches!(
            actor(kernel, request)?,
            Actor::Operator { lowered: None, .. }
        ) {
            Ok(asked)
        } else {
            Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "FLEET is for operators",
            ))
        }
    });
    let link = asked.and_then(|asked| Ok((asked, kernel.fleet.link()?.clone())));
    let (asked, link) = match link {
        Ok(both) => both,
        Err(refusal) => return Outcome::Reply(Answer::from(refusal)),
    };
    Outcome::Deferred(Box::new(move || {
        let answer = match asked.op {
            FleetOp::Nodes => link.call(nodes::list).map(|nodes| NodesReply {
                success: true,
                node: link.node().to_owned(),
                nodes,
            }),
        };
        match answer {
            Ok(reply) => Answer::json(&reply),
            Err(err) => Answer::from(ErrorReply::from(err)),
        }
        .into_json()
    }))
}
