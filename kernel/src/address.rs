//! Where replies go, and what subsystems hand back to the reactor.
//!
//! A reply goes to the request it answers on a connection, or to a task,
//! which outlives any connection and collects its replies itself.
//! Subsystems only ever see these addresses; they never know the reactor
//! exists, and the reactor never looks inside a subsystem. This module
//! depends on nothing in the crate but [`crate::identity`], so every other
//! module may use it without making an import cycle.

use mio::net::UnixStream;

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
            ReplyTo::Task(_) => None,
            ReplyTo::Tool { connection, .. } => *connection,
        }
    }

    /// An address for unit tests of code that only carries it along.
    #[cfg(test)]
    pub fn for_tests() -> ReplyTo {
        ReplyTo::Task(0)
    }
}

/// A finished reply: its address and its payload.
pub type Reply = (ReplyTo, Vec<u8>);

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
