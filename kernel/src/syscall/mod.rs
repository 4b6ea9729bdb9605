//! Syscalls: one handler per opcode, each owning its syscall — parsing and
//! validating the request (through `agentos-proto`), checking what the
//! caller may do, acting on the [`Kernel`], and building the typed reply.
//! Every handler has one shape: `fn handle(&mut Kernel, &Request) ->
//! Outcome`, and [`dispatch`] picks it.
//!
//! Handlers run on the reactor thread and must not block. Work that might
//! block is returned as [`Outcome::Deferred`] and runs on a worker; work
//! that finishes on a later event (SPAWN waits for its workload to start)
//! is [`Outcome::Later`], and its reply goes to the request's
//! [`ReplyTo`](crate::address::ReplyTo) address through the kernel's outbox. Either way the reactor
//! writes replies in request order.

mod async_poll;
mod audit;
mod delegate;
mod events;
mod exec;
mod exit;
mod files;
mod fleet;
mod fleet_task;
mod hello;
mod host_metrics;
mod http;
mod kill;
mod list;
mod logs;
mod messages;
mod metrics;
mod net;
mod pause;
mod perms;
mod recording;
mod request;
mod spawn;
mod state;
mod task;
mod templates;
mod think;
mod tool;
mod volumes;

use std::time::Duration;

use agentos_proto::{ErrorCode, ErrorReply, Opcode};

use crate::kernel::Kernel;
pub use request::{Caller, Outcome, Request};

/// A syscall handler.
type Handler = fn(&mut Kernel, &Request<'_>) -> Outcome;

/// Runs the syscall for one request.
pub fn dispatch(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let handler: Handler = match request.opcode {
        Opcode::NOOP => noop,
        Opcode::HELLO => hello::handle,
        Opcode::LIST => list::handle,
        Opcode::SPAWN => spawn::handle,
        Opcode::KILL => kill::handle,
        Opcode::EXIT => exit::handle,
        Opcode::THINK => think::handle,
        Opcode::EXEC => exec::handle,
        Opcode::READ => files::read,
        Opcode::WRITE => files::write,
        Opcode::TOOL => tool::handle,
        Opcode::TASK => task::handle,
        Opcode::PAUSE | Opcode::RESUME => pause::handle,
        Opcode::LOGS => logs::handle,
        Opcode::NET => net::handle,
        Opcode::METRICS => metrics::handle,
        Opcode::DELEGATE => delegate::handle,
        Opcode::FLEET => fleet::handle,
        Opcode::REGISTER => messages::register,
        Opcode::SEND => messages::send,
        Opcode::RECV => messages::recv,
        Opcode::BROADCAST => messages::broadcast,
        Opcode::STORE => state::store,
        Opcode::FETCH => state::fetch,
        Opcode::DELETE => state::delete,
        Opcode::KEYS => state::keys,
        Opcode::GET_PERMS => perms::get,
        Opcode::SET_PERMS => perms::set,
        Opcode::HTTP => http::handle,
        Opcode::ASYNC_POLL => async_poll::poll,
        Opcode::RECORD_START => recording::start,
        Opcode::RECORD_STOP => recording::stop,
        Opcode::RECORD_STATUS => recording::status,
        Opcode::REPLAY_START => recording::replay,
        Opcode::REPLAY_STATUS => recording::replay_status,
        Opcode::GET_AUDIT_LOG => audit::get,
        Opcode::SET_AUDIT_CONFIG => audit::set,
        Opcode::SUBSCRIBE => events::subscribe,
        Opcode::UNSUBSCRIBE => events::unsubscribe,
        Opcode::POLL => events::poll,
        Opcode::EMIT => events::emit,
        Opcode::SYSTEM_METRICS => host_metrics::system,
        Opcode::AGENT_METRICS => host_metrics::agent,
        Opcode::ALL_AGENT_METRICS => host_metrics::all_agents,
        Opcode::CGROUP_METRICS => host_metrics::cgroup,
        _ => unknown,
    };
    if kernel.services.recordings.any() {
        let agents = &kernel.agents;
        let sees = |viewer, id| agents.sees(viewer, id);
        kernel.services.recordings.record(
            request.caller.principal(),
            request.opcode,
            request.payload,
            &sees,
        );
    }
    let outcome = match delegate::beyond_a_delegate(kernel, request) {
        Some(refusal) => Outcome::Reply(refusal.into()),
        None => handler(kernel, request),
    };
    audit::refusal(kernel, request, &outcome);
    if kernel.deferred.contains(&request.opcode) {
        defer(kernel, outcome, request.payload)
    } else {
        outcome
    }
}

/// Moves an already computed reply onto a worker (diagnostics only), so
/// tests can drive the completion path without a slow subsystem.
fn defer(kernel: &Kernel, outcome: Outcome, payload: &[u8]) -> Outcome {
    let reply = match outcome {
        Outcome::Echo => payload.to_vec(),
        Outcome::Reply(reply) => reply.into_json(),
        other => return other,
    };
    let delay = Duration::from_millis(kernel.config().debug.defer_delay_ms);
    Outcome::Deferred(Box::new(move || {
        std::thread::sleep(delay);
        reply
    }))
}

/// NOOP (0x00): the payload comes back as it is.
fn noop(_kernel: &mut Kernel, _request: &Request<'_>) -> Outcome {
    Outcome::Echo
}

/// An opcode no handler serves.
fn unknown(_kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    Outcome::Reply(
        ErrorReply::new(
            ErrorCode::UnknownOpcode,
            format!(
                "opcode {} is not one this kernel serves; see the protocol's opcode table",
                request.opcode
            ),
        )
        .into(),
    )
}
