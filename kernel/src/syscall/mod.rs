//! Syscalls: one handler per opcode, each owning its syscall — parsing and
//! validating the request (through `agentos-proto`), checking what the
//! caller may do, acting on the kernel, and building the typed reply. Every
//! handler has one shape: `fn handle(&mut Kernel, &Request) -> Outcome`.
//!
//! Handlers run on the reactor thread and must not block. Work that might
//! block is returned as [`Outcome::Deferred`] and runs on a worker; work
//! that finishes on a later event (SPAWN waits for its workload to start)
//! is [`Outcome::Later`], and its reply goes to the request's
//! [`ReplyTo`] address through the kernel's outbox. Either way the reactor
//! writes replies in request order.

mod exec;
mod exit;
mod hello;
mod kernel;
mod kill;
mod list;
mod logs;
mod reload;
mod runs;
mod spawn;
mod task;
mod think;
mod tool;

use std::time::Duration;

use agentos_proto::payload::to_json;
use agentos_proto::{ErrorCode, ErrorReply, Opcode};
use serde::Serialize;

use crate::address::ReplyTo;
use crate::identity::{Identity, Principal};
use crate::workers::Job;
pub use kernel::Kernel;
use runs::Actor;

/// What a syscall decided.
pub enum Outcome {
    /// Reply with the request's own payload (NOOP); the reactor copies it
    /// straight from its read buffer.
    Echo,
    /// Reply with this payload now.
    Reply(Vec<u8>),
    /// Reply with this payload, then close the connection once it and every
    /// earlier reply are delivered.
    ReplyAndClose(Vec<u8>),
    /// Reply with what this job returns, computed on a worker thread.
    Deferred(Job),
    /// The kernel will deliver the reply itself, to the request's address,
    /// when a later event completes the request.
    Later,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Echo => f.write_str("Echo"),
            Outcome::Reply(p) => write!(f, "Reply({} bytes)", p.len()),
            Outcome::ReplyAndClose(p) => write!(f, "ReplyAndClose({} bytes)", p.len()),
            Outcome::Deferred(_) => f.write_str("Deferred"),
            Outcome::Later => f.write_str("Later"),
        }
    }
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The caller's identity, derived from its socket.
    pub identity: Identity,
    /// Its user id, from its socket's credentials (what an operator's
    /// sessions belong to).
    pub uid: u32,
}

impl Caller {
    /// Whom the connection speaks for.
    pub fn principal(&self) -> Principal {
        self.identity.principal(self.uid)
    }

    /// The EXEC run whose own kernel connection this is, if it is one: the
    /// run's reply counts the TOOL calls made on it.
    pub fn run(&self) -> Option<u64> {
        match self.identity {
            Identity::Run { run, .. } => Some(run),
            Identity::Operator { .. } | Identity::Agent { .. } => None,
        }
    }
}

/// One request, as every handler receives it.
#[derive(Debug)]
pub struct Request<'a> {
    /// Who sent it.
    pub caller: Caller,
    /// Where a [`Outcome::Later`] reply must go.
    pub reply_to: ReplyTo,
    /// Its opcode.
    pub opcode: Opcode,
    /// Its payload.
    pub payload: &'a [u8],
}

/// A syscall handler.
type Handler = fn(&mut Kernel, &Request<'_>) -> Outcome;

impl Kernel {
    /// Runs the syscall for one request.
    pub fn dispatch(&mut self, request: &Request<'_>) -> Outcome {
        let handler: Handler = match request.opcode {
            Opcode::NOOP => noop,
            Opcode::HELLO => hello::handle,
            Opcode::LIST => list::handle,
            Opcode::SPAWN => spawn::handle,
            Opcode::KILL => kill::handle,
            Opcode::EXIT => exit::handle,
            Opcode::THINK => think::handle,
            Opcode::EXEC => exec::handle,
            Opcode::TOOL => tool::handle,
            Opcode::TASK => task::handle,
            Opcode::LOGS => logs::handle,
            _ => unknown,
        };
        let outcome = handler(self, request);
        if self.deferred.contains(&request.opcode) {
            self.defer(outcome, request.payload)
        } else {
            outcome
        }
    }

    /// Moves an already computed reply onto a worker (diagnostics only), so
    /// tests can drive the completion path without a slow subsystem.
    fn defer(&self, outcome: Outcome, payload: &[u8]) -> Outcome {
        let reply = match outcome {
            Outcome::Echo => payload.to_vec(),
            Outcome::Reply(reply) => reply,
            other => return other,
        };
        let delay = Duration::from_millis(self.config.debug.defer_delay_ms);
        Outcome::Deferred(Box::new(move || {
            std::thread::sleep(delay);
            reply
        }))
    }
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
        .to_json(),
    )
}

/// Who sent `request`, with what it was given; an agent the kernel does not
/// know (any more), or a run that is over, is refused.
fn actor<'k>(kernel: &'k Kernel, request: &Request<'_>) -> Result<Actor<'k>, ErrorReply> {
    Actor::of(request.caller.principal(), &kernel.agents, &kernel.runs)
}

/// A typed result as reply bytes.
fn reply<R: Serialize>(result: Result<R, ErrorReply>) -> Outcome {
    match result {
        Ok(reply) => Outcome::Reply(to_json(&reply)),
        Err(err) => Outcome::Reply(err.to_json()),
    }
}
