//! Syscalls: one handler per opcode, each a small function from a typed
//! request (parsed and validated by `agentos-proto`) to a typed reply.
//!
//! Handlers run on the reactor thread and must not block. Work that might
//! block is returned as [`Outcome::Deferred`] and runs on a worker; the
//! reactor still writes its reply in request order.

mod exit;
mod hello;
mod list;
mod unavailable;

use std::time::Duration;

use agentos_proto::payload::to_json;
use agentos_proto::{ErrorCode, ErrorReply, Opcode};
use serde::Serialize;

use crate::config::Config;
use crate::identity::Identity;
use crate::workers::Job;

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
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Echo => f.write_str("Echo"),
            Outcome::Reply(p) => write!(f, "Reply({} bytes)", p.len()),
            Outcome::ReplyAndClose(p) => write!(f, "ReplyAndClose({} bytes)", p.len()),
            Outcome::Deferred(_) => f.write_str("Deferred"),
        }
    }
}

/// The kernel state syscalls act on. Owned by the reactor thread.
#[derive(Debug)]
pub struct Kernel {
    config: Config,
    deferred: Vec<Opcode>,
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The caller's identity, derived from `SO_PEERCRED`.
    pub identity: Identity,
}

impl Kernel {
    /// Kernel state for `config`.
    pub fn new(config: Config) -> Kernel {
        let deferred = config.deferred_opcodes();
        Kernel { config, deferred }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Runs the syscall for one request.
    pub fn dispatch(&mut self, caller: &Caller, opcode: Opcode, payload: &[u8]) -> Outcome {
        let outcome = match opcode {
            Opcode::NOOP => Outcome::Echo,
            Opcode::HELLO => {
                answer(hello::parse(payload).map(|req| hello::handle(self, caller, req)))
            }
            Opcode::LIST => answer(list::parse(payload).map(|req| list::handle(self, req))),
            Opcode::EXIT => exit::handle(),
            Opcode::THINK | Opcode::EXEC | Opcode::SPAWN | Opcode::KILL | Opcode::TASK => {
                Outcome::Reply(unavailable::handle(opcode, payload).to_json())
            }
            unknown => Outcome::Reply(
                ErrorReply::new(
                    ErrorCode::UnknownOpcode,
                    format!(
                        "opcode {unknown} is not one this kernel serves; \
                         see the protocol's opcode table"
                    ),
                )
                .to_json(),
            ),
        };
        if self.deferred.contains(&opcode) {
            self.defer(outcome, payload)
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

/// Turns a handler's typed result into reply bytes.
fn answer<R: Serialize>(result: Result<R, ErrorReply>) -> Outcome {
    match result {
        Ok(reply) => Outcome::Reply(to_json(&reply)),
        Err(err) => Outcome::Reply(err.to_json()),
    }
}
