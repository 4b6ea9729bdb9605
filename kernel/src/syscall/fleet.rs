//! FLEET (0x1A): the fleet this node has joined. Operators only: a node's
//! address and load are the fleet's business, not an agent's. Answered by
//! the fleet thread: the reactor never waits on the database.

use agentos_proto::payload::{DrainReply, FleetOp, FleetRequest, NodesReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::fleet::nodes;
use crate::kernel::{Actor, Kernel};

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
    let sent = asked.and_then(|asked| {
        let link = kernel.fleet.link()?;
        let node = link.node().to_owned();
        link.ask(request.reply_to, move |client| {
            match (asked.op, asked.node) {
                (FleetOp::Nodes, _) => Ok(Answer::json(&NodesReply {
                    success: true,
                    node,
                    nodes: nodes::list(client)?,
                })),
                (op, named) => {
                    let named = named.unwrap_or_default();
                    let draining = op == FleetOp::Drain;
                    if !nodes::set_draining(client, &named, draining)? {
                        return Ok(Answer::from(ErrorReply::new(
                            ErrorCode::NotFound,
                            format!("the fleet has no node {named:?} (FLEET nodes lists them)"),
                        )));
                    }
                    Ok(Answer::json(&DrainReply {
                        success: true,
                        node: named,
                        draining,
                    }))
                }
            }
        })
        .map_err(ErrorReply::from)
    });
    match sent {
        Ok(()) => Outcome::Later,
        Err(refusal) => Outcome::Reply(Answer::from(refusal)),
    }
}
