//! Syscalls: one handler per opcode, each a small function from a typed
//! request (parsed and validated by `agentos-proto`) to a typed reply.
//!
//! Handlers run on the reactor thread and must not block. Work that might
//! block is returned as [`Outcome::Deferred`] and runs on a worker; work
//! that finishes on a later event (SPAWN waits for its workload to start)
//! is [`Outcome::Later`], and its reply is delivered through [`Io`]. Either
//! way the reactor writes replies in request order.

mod exit;
mod hello;
mod kill;
mod list;
mod spawn;
mod think;
mod unavailable;

use std::io;
use std::path::Path;
use std::time::Duration;

use agentos_proto::payload::to_json;
use agentos_proto::{ErrorCode, ErrorReply, Opcode};
use mio::net::UnixStream;
use mio::{Registry, Waker};
use serde::Serialize;
use std::sync::Arc;

use crate::agents::Agents;
use crate::config::Config;
use crate::identity::Identity;
use crate::llm::Llm;
use crate::reactor::ReplyTo;
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
    /// The kernel will deliver the reply itself, through [`Io::replies`],
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

/// What the kernel may touch of the reactor while handling a request or an
/// event: the registry for its own event sources, and two outboxes the
/// reactor empties afterwards.
#[derive(Debug)]
pub struct Io<'a> {
    /// For registering the kernel's event sources.
    pub registry: &'a Registry,
    /// Replies to [`Outcome::Later`] requests that are now complete.
    pub replies: &'a mut Vec<(ReplyTo, Vec<u8>)>,
    /// Connections accepted on agents' own sockets, with their identity.
    pub adopted: &'a mut Vec<(UnixStream, Identity)>,
}

/// The kernel state syscalls act on. Owned by the reactor thread.
#[derive(Debug)]
pub struct Kernel {
    config: Config,
    deferred: Vec<Opcode>,
    agents: Agents,
    llm: Llm,
}

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The caller's identity, derived from its socket.
    pub identity: Identity,
}

impl Kernel {
    /// Kernel state for `config`; agent sockets and sandbox roots go under
    /// a directory beside the kernel's `socket`.
    pub fn new(config: Config, waker: Arc<Waker>, socket: &Path) -> io::Result<Kernel> {
        let deferred = config.deferred_opcodes();
        let agents = Agents::new(&config, waker.clone(), socket)?;
        let llm = Llm::new(
            &config.llm,
            waker,
            &config.agents.log_dir(),
            agents.confinement(),
        );
        Ok(Kernel {
            config,
            deferred,
            agents,
            llm,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The agents.
    pub fn agents(&mut self) -> &mut Agents {
        &mut self.agents
    }

    /// The agents, to look at.
    pub fn agents_ref(&self) -> &Agents {
        &self.agents
    }

    /// THINK.
    pub fn llm(&mut self) -> &mut Llm {
        &mut self.llm
    }

    /// THINK, to look at.
    pub fn llm_ref(&self) -> &Llm {
        &self.llm
    }

    /// Runs the syscall for one request. `reply_to` is where a
    /// [`Outcome::Later`] reply must go.
    pub fn dispatch(
        &mut self,
        io: &mut Io<'_>,
        caller: &Caller,
        reply_to: ReplyTo,
        opcode: Opcode,
        payload: &[u8],
    ) -> Outcome {
        let outcome = match opcode {
            Opcode::NOOP => Outcome::Echo,
            Opcode::HELLO => {
                answer(hello::parse(payload).map(|req| hello::handle(self, caller, req)))
            }
            Opcode::LIST => answer(list::parse(payload).map(|req| list::handle(self, caller, req))),
            Opcode::SPAWN => spawn::handle(self, io, caller, reply_to, payload),
            Opcode::KILL => Outcome::Reply(kill::handle(self, io, caller, payload)),
            Opcode::EXIT => exit::handle(),
            Opcode::THINK => think::handle(self, io, caller, reply_to, payload),
            Opcode::EXEC | Opcode::TASK => {
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
