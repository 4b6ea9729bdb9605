//! Where replies go, and what subsystems hand back to the reactor.
//!
//! A reply goes to the request it answers on a connection, or to a task,
//! which outlives any connection and collects its replies itself.
//! Subsystems only ever see these addresses; they never know the reactor
//! exists, and the reactor never looks inside a subsystem. This module
//! depends on nothing in the crate but [`crate::identity`], so every other
//! module may use it without making an import cycle.
//!
//! Replies stay typed ([`Answer`]) while they are inside the kernel: a task
//! reads its EXEC run's or THINK's reply as a value, and the reactor turns
//! each into JSON only as it writes it.

use std::io;

use agentos_proto::payload::{to_json, ExecReply, ThinkReply, ToolReply};
use agentos_proto::ErrorReply;
use mio::net::UnixStream;
use serde::Serialize;

use crate::identity::Identity;

/// Names a connection across slot reuse: a reply for a connection that has
/// closed (and whose slot now holds another) is recognised and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Its slot in the reactor's connection table.
    pub index: usize,
    /// Unique for the daemon's lifetime.
    pub serial: u64,
}

/// Where a reply goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyTo {
    /// The kernel's own work that no one asked for (an idle session
    /// hibernated): its reply goes nowhere.
    Nobody,
    /// The request numbered `seq` on a connection.
    Request {
        /// The connection.
        conn: ConnKey,
        /// The request's place in the connection's reply order.
        seq: u64,
    },
    /// A background task, by id.
    Task(u64),
    /// A built-in tool's call, by the kernel's number for it: the reply is
    /// the subsystem's own (a THINK reply for `llm.think`), turned into a
    /// TOOL reply before it goes on to the caller.
    Tool {
        /// The kernel's number for the call.
        call: u64,
        /// The serial of the connection waiting for it, if one is: work
        /// for a connection that closes is withdrawn.
        connection: Option<u64>,
    },
}

impl ReplyTo {
    /// The serial number of the connection waiting for this reply, if a
    /// connection is.
    pub fn connection(&self) -> Option<u64> {
        match self {
            ReplyTo::Request { conn, .. } => Some(conn.serial),
            ReplyTo::Task(_) | ReplyTo::Nobody => None,
            ReplyTo::Tool { connection, .. } => *connection,
        }
    }

    /// An address for unit tests of code that only carries it along.
    #[cfg(test)]
    pub fn for_tests() -> ReplyTo {
        ReplyTo::Task(0)
    }
}

/// A finished reply: its address and what it says.
pub type Reply = (ReplyTo, Answer);

/// What a reply says, typed while the kernel holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// An EXEC run's reply.
    Exec(Box<ExecReply>),
    /// THINK's reply.
    Think(Box<ThinkReply>),
    /// TOOL `call`'s reply when the tool ran.
    Tool(Box<ToolReply>),
    /// A refusal or failure, of any request.
    Error(ErrorReply),
    /// A reply no part of the kernel reads again, already JSON.
    Json(Vec<u8>),
}

impl Answer {
    /// A reply of any other type, as JSON.
    pub fn json<T: Serialize>(reply: &T) -> Answer {
        Answer::Json(to_json(reply))
    }

    /// Whether it reports success (an EXEC run's says whether its code
    /// succeeded).
    pub fn is_success(&self) -> bool {
        match self {
            Answer::Exec(reply) => reply.success,
            Answer::Think(reply) => reply.success,
            Answer::Tool(_) | Answer::Json(_) => true,
            Answer::Error(_) => false,
        }
    }

    /// The JSON the reactor writes.
    pub fn into_json(self) -> Vec<u8> {
        match self {
            Answer::Exec(reply) => to_json(&reply),
            Answer::Think(reply) => to_json(&reply),
            Answer::Tool(reply) => to_json(&reply),
            Answer::Error(reply) => reply.to_json(),
            Answer::Json(json) => json,
        }
    }

    /// How many bytes its JSON takes, without writing it out.
    pub fn json_len(&self) -> usize {
        let mut counter = ByteCounter(0);
        let counted = match self {
            Answer::Exec(reply) => serde_json::to_writer(&mut counter, reply),
            Answer::Think(reply) => serde_json::to_writer(&mut counter, reply),
            Answer::Tool(reply) => serde_json::to_writer(&mut counter, reply),
            Answer::Error(reply) => serde_json::to_writer(&mut counter, reply),
            Answer::Json(json) => return json.len(),
        };
        match counted {
            Ok(()) => counter.0,
            // What `to_json` writes in its place is small.
            Err(_) => 0,
        }
    }
}

impl From<ErrorReply> for Answer {
    fn from(reply: ErrorReply) -> Answer {
        Answer::Error(reply)
    }
}

impl From<ExecReply> for Answer {
    fn from(reply: ExecReply) -> Answer {
        Answer::Exec(Box::new(reply))
    }
}

impl From<ThinkReply> for Answer {
    fn from(reply: ThinkReply) -> Answer {
        Answer::Think(Box::new(reply))
    }
}

impl From<ToolReply> for Answer {
    fn from(reply: ToolReply) -> Answer {
        Answer::Tool(Box::new(reply))
    }
}

/// Counts what is written to it.
struct ByteCounter(usize);

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection the kernel made or accepted itself, for the reactor to
/// serve: one accepted on an agent's own socket, or an EXEC run's.
#[derive(Debug)]
pub struct Adopted {
    /// The connection.
    pub stream: UnixStream,
    /// Whose calls it carries.
    pub peer: Adoptee,
}

/// Whose calls an adopted connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoptee {
    /// A caller with a known identity (an agent, through its own socket).
    Known(Identity),
    /// The EXEC run of this number: the connection gets an identity of its
    /// own (a run's, never its caller's) as it is admitted.
    Run(u64),
}

/// What the kernel hands back to the reactor after an event: finished
/// replies, and connections it accepted on agents' own sockets.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Replies to requests answered later than they arrived.
    pub replies: Vec<Reply>,
    /// Connections the kernel made or accepted itself.
    pub adopted: Vec<Adopted>,
    /// EXEC runs that are over: their connections close.
    pub runs_over: Vec<u64>,
}

impl Outbox {
    /// Whether there is nothing to hand over.
    pub fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.adopted.is_empty() && self.runs_over.is_empty()
    }
}
