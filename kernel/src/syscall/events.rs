//! SUBSCRIBE (0x60), UNSUBSCRIBE (0x61), POLL (0x62) and EMIT (0x63): the
//! events hub (see `events`), as the Clove SDK's `subscribe`,
//! `unsubscribe`, `poll_events` and `emit_event` call it.
//!
//! A subscription is the connection's, and sees what its caller may see:
//! an operator its own uid's tree, an agent itself and its descendants,
//! an EXEC run the agents it started (what a sandboxed agent of its
//! caller would see). EMIT makes a CUSTOM event whose source is the
//! caller as the kernel knows it, seen as the caller is seen: by its own
//! uid's operators, its ancestors, the run it is.

use agentos_proto::payload::{
    AgentState, EmitReply, EmitRequest, KernelEvent, PollRequest, SubscribeRequest,
    MAX_EVENT_DATA_BYTES,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, delegate_refused, reply, Outcome, Request};
use crate::events::{AgentEventData, Audience, Event, Notice};
use crate::kernel::{Actor, Kernel, Root};

/// SUBSCRIBE.
pub fn subscribe(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    take_in(kernel);
    reply(
        SubscribeRequest::parse("SUBSCRIBE", request.payload).and_then(|asked| {
            let topics = asked.topics()?;
            if topics.is_empty() {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    "SUBSCRIBE field `event_types`: name at least one event type (AGENT_SPAWNED, \
                     AGENT_EXITED, CUSTOM, or a CUSTOM event's own type name)",
                ));
            }
            let serial = connection(request, "SUBSCRIBE")?;
            let watcher = actor(kernel, request)?.principal();
            kernel
                .events
                .subscribe(serial, watcher, topics)
                .map_err(|err| ErrorReply::new(ErrorCode::LimitExceeded, err.to_string()))
        }),
    )
}

/// UNSUBSCRIBE.
pub fn unsubscribe(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    take_in(kernel);
    reply(
        SubscribeRequest::parse("UNSUBSCRIBE", request.payload).and_then(|asked| {
            let serial = connection(request, "UNSUBSCRIBE")?;
            let topics = if asked.is_all() {
                None
            } else {
                Some(asked.topics()?)
            };
            Ok(kernel.events.unsubscribe(serial, topics))
        }),
    )
}

/// POLL.
pub fn poll(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    take_in(kernel);
    reply(PollRequest::parse(request.payload).and_then(|asked| {
        let serial = connection(request, "POLL")?;
        Ok(kernel.events.poll(serial, asked.limit()))
    }))
}

/// EMIT.
pub fn emit(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    take_in(kernel);
    reply(EmitRequest::parse(request.payload).and_then(|asked| {
        let size = serde_json::to_vec(&asked.data).map_or(0, |json| json.len());
        if size > MAX_EVENT_DATA_BYTES {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "EMIT field `data`: {size} bytes as JSON, over {MAX_EVENT_DATA_BYTES}; \
                     keep large values in the state store (STORE) and send their key"
                ),
            ));
        }
        let audience = emitter(kernel, &actor(kernel, request)?)?;
        let source = request.caller.identity.id();
        let custom_type = asked.event_type;
        let event = Event::custom(custom_type.clone(), asked.data, source, audience);
        let delivered_to = kernel.events.publish(event);
        Ok(EmitReply {
            success: true,
            event: agentos_proto::payload::CUSTOM.to_owned(),
            custom_type,
            delivered_to,
        })
    }))
}

/// Tells subscribers that agent `id` was paused or resumed (`kind`) at
/// the request of the caller whose replies carry `by`.
pub(super) fn agent_frozen(kernel: &mut Kernel, id: u32, name: &str, paused: bool, by: u32) {
    take_in(kernel);
    let Some(audience) = kernel.agents.audience(id) else {
        return;
    };
    let (kind, state) = if paused {
        (KernelEvent::AgentPaused, AgentState::Paused)
    } else {
        (KernelEvent::AgentResumed, AgentState::Running)
    };
    let data = AgentEventData {
        agent_id: id,
        name: name.to_owned(),
        state: Some(state),
        by: Some(by),
        ..AgentEventData::default()
    };
    kernel
        .events
        .publish(Notice::now(kind, data).into_event(audience));
}

/// What happened to agents since the last request reaches the
/// subscriptions that existed then, before this request changes them.
fn take_in(kernel: &mut Kernel) {
    kernel.events.take_in(kernel.agents.journal());
    kernel.events.take_in(&mut kernel.tasks.ended);
}

/// The connection the request came on: subscriptions are its.
fn connection(request: &Request<'_>, what: &str) -> Result<u64, ErrorReply> {
    request.reply_to.connection().ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::BadRequest,
            format!("{what} is made on a connection of the kernel's socket, whose events it is"),
        )
    })
}

/// Who may see what the caller emits: what may see the caller.
fn emitter(kernel: &Kernel, actor: &Actor<'_>) -> Result<Audience, ErrorReply> {
    let of_agent = |id: u32| {
        kernel.agents.audience(id).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!("agent {id} is not known"),
            )
        })
    };
    Ok(match *actor {
        Actor::Operator { uid, .. } => Audience {
            uid: Some(uid),
            agents: Vec::new(),
            run: None,
        },
        Actor::Agent { id, .. } => of_agent(id)?,
        // As a sandboxed child of its caller would be seen: by the
        // caller's line and uid, and by the run itself.
        Actor::Run { number, grant } => match grant.root {
            Root::Agent(id) => Audience {
                run: Some(number),
                ..of_agent(id)?
            },
            Root::Operator(uid) => Audience {
                uid: Some(uid),
                agents: Vec::new(),
                run: Some(number),
            },
            Root::Delegate(..) => return Err(delegate_refused("EMIT")),
        },
        Actor::Delegate { .. } => return Err(delegate_refused("EMIT")),
    })
}
