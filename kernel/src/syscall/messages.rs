//! SEND (0x20), RECV (0x21), BROADCAST (0x22) and REGISTER (0x23): names
//! and mailboxes (see `messages`), as the Clove SDK's `register_name`,
//! `send_message`, `recv_messages` and `broadcast` call them.
//!
//! The sender is who the socket says: an operator's connection, an agent,
//! or an EXEC run's connection, which messages as a run of its caller and
//! never as the caller.

use agentos_proto::payload::{BroadcastRequest, RecvRequest, RegisterRequest, SendRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, delegate_refused, reply, Outcome, Request};
use crate::identity::Principal;
use crate::kernel::{Actor, Kernel, Root};
use crate::messages::{Address, Role, Sender};

/// REGISTER.
pub fn register(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(RegisterRequest::parse(request.payload).and_then(|asked| {
        let sender = sender(kernel, request)?;
        kernel.messages.register(&kernel.agents, sender, asked)
    }))
}

/// SEND.
pub fn send(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(SendRequest::parse(request.payload).and_then(|asked| {
        let sender = sender(kernel, request)?;
        kernel.messages.send(&kernel.agents, sender, asked)
    }))
}

/// RECV.
pub fn recv(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(RecvRequest::parse(request.payload).and_then(|asked| {
        let sender = sender(kernel, request)?;
        Ok(kernel.messages.recv(&kernel.agents, sender, &asked))
    }))
}

/// BROADCAST.
pub fn broadcast(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply(BroadcastRequest::parse(request.payload).and_then(|asked| {
        let sender = sender(kernel, request)?;
        Ok(kernel.messages.broadcast(&kernel.agents, sender, asked))
    }))
}

/// Who is messaging, from the socket alone.
fn sender(kernel: &Kernel, request: &Request<'_>) -> Result<Sender, ErrorReply> {
    let own_id = request.caller.identity.id();
    let serial = request.reply_to.connection().ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::BadRequest,
            "messages are sent and received on a connection",
        )
    })?;
    let unknown = |id: u32| {
        ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!("agent {id} is not known"),
        )
    };
    Ok(match actor(kernel, request)? {
        Actor::Operator { uid, .. } => Sender {
            address: Address::Connection(own_id),
            uid,
            role: Role::Operator { serial },
        },
        Actor::Agent { id, grant } => Sender {
            address: Address::Agent(id),
            uid: kernel.agents.owner_uid(id).ok_or_else(|| unknown(id))?,
            role: Role::Agent {
                ipc: grant.permissions.ipc,
            },
        },
        Actor::Delegate { .. } => return Err(delegate_refused("messages")),
        Actor::Run { grant, .. } => Sender {
            address: Address::Connection(own_id),
            uid: match grant.root {
                Root::Operator(uid) => uid,
                Root::Agent(id) => kernel.agents.owner_uid(id).ok_or_else(|| unknown(id))?,
                Root::Delegate(..) => return Err(delegate_refused("messages")),
            },
            role: Role::Run {
                serial,
                of_agent: match grant.of {
                    Principal::Agent { id } => Some(id),
                    Principal::Operator { .. }
                    | Principal::Delegate { .. }
                    | Principal::Run { .. } => None,
                },
            },
        },
    })
}
