//! The tool calls under way at the servers, by the kernel's call number:
//! where each reply goes, which server and caller it is of, and the places
//! each server, and each caller at it, may hold.

use std::collections::HashMap;
use std::time::Instant;

use crate::address::ReplyTo;
use crate::telemetry::tracer::OpenSpan;
use crate::tools::mcp::client::CallId;

/// Calls one server may have under way; more are refused with `busy`, so
/// callers cannot pile up work (and memory) behind a slow server.
const MAX_CALLS_PER_SERVER: usize = 1024;
/// Calls one caller may have under way at one server, so that one caller
/// cannot take a server's every place.
const MAX_CALLS_PER_CALLER: usize = 64;

/// A call under way.
#[derive(Debug)]
pub struct Pending {
    /// Where its reply goes.
    pub reply_to: ReplyTo,
    /// The server it is at (its place in the list).
    pub server: usize,
    /// Who called.
    pub caller: u32,
    /// When it was sent, for the metrics.
    pub started: Instant,
    /// Its `execute_tool {tool}` span and, within it, the MCP request's
    /// `tools/call {tool}`, with tracing on.
    pub spans: Option<(OpenSpan, OpenSpan)>,
}

/// A server, or a caller at it, holds every place it may.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "has {all} calls under way, {own} of them yours (at most {MAX_CALLS_PER_SERVER}, \
     {MAX_CALLS_PER_CALLER} per caller); retry when some have ended"
)]
pub struct Full {
    /// The server's calls under way.
    pub all: usize,
    /// The caller's, of those.
    pub own: usize,
}

/// The calls under way.
#[derive(Debug)]
pub struct Calls {
    under_way: HashMap<CallId, Pending>,
    next: CallId,
}

impl Default for Calls {
    fn default() -> Calls {
        Calls {
            under_way: HashMap::new(),
            next: 1,
        }
    }
}

impl Calls {
    /// The number the next call gets, if server `server` has a place for
    /// one of `caller`'s.
    pub fn room(&self, server: usize, caller: u32) -> Result<CallId, Full> {
        let at_server = || self.under_way.values().filter(|c| c.server == server);
        let all = at_server().count();
        let own = at_server().filter(|c| c.caller == caller).count();
        if all >= MAX_CALLS_PER_SERVER || own >= MAX_CALLS_PER_CALLER {
            return Err(Full { all, own });
        }
        Ok(self.next)
    }

    /// Call `number` (given by [`Calls::room`]) is under way.
    pub fn insert(&mut self, number: CallId, pending: Pending) {
        self.next = self.next.max(number + 1);
        self.under_way.insert(number, pending);
    }

    /// Call `call` has ended (`None`: it had already).
    pub fn remove(&mut self, call: CallId) -> Option<Pending> {
        self.under_way.remove(&call)
    }

    /// The calls whose replies go to connection `serial`.
    pub fn of_connection(&self, serial: u64) -> Vec<CallId> {
        self.under_way
            .iter()
            .filter(|(_, p)| p.reply_to.connection() == Some(serial))
            .map(|(id, _)| *id)
            .collect()
    }
}
