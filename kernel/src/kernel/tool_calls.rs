//! TOOL calls answered later, by the kernel's number for each: a call to
//! an MCP server, or a built-in answered through another subsystem
//! (`llm.think` through THINK). Their replies come back addressed to the
//! call ([`ReplyTo::Tool`]) and are handed on to the caller as TOOL
//! replies, each counted once against the EXEC run that made it.

use std::collections::HashMap;

use crate::address::ReplyTo;

/// Who is waiting for a TOOL call's reply.
#[derive(Clone, Copy, Debug)]
pub struct ToolCaller {
    /// Where the TOOL reply goes.
    pub reply_to: ReplyTo,
    /// The EXEC run that made the call, whose reply counts it.
    pub run: Option<u64>,
}

/// The calls waiting for their replies.
#[derive(Debug, Default)]
pub struct ToolCalls {
    waiting: HashMap<u64, ToolCaller>,
    next: u64,
}

impl ToolCalls {
    /// Records a call for `caller`; its reply is to come to the address
    /// this returns.
    pub fn open(&mut self, caller: ToolCaller) -> ReplyTo {
        self.next += 1;
        self.waiting.insert(self.next, caller);
        ReplyTo::Tool {
            call: self.next,
            connection: caller.reply_to.connection(),
        }
    }

    /// The caller of the call a reply is addressed to, which the reply
    /// answers; `None` if that caller has gone (or the address is not a
    /// call's).
    pub fn answer(&mut self, to: ReplyTo) -> Option<ToolCaller> {
        match to {
            ReplyTo::Tool { call, .. } => self.waiting.remove(&call),
            ReplyTo::Request { .. } | ReplyTo::Task(_) | ReplyTo::Nobody => None,
        }
    }

    /// Forgets a call that was refused before it went anywhere.
    pub fn refused(&mut self, via: ReplyTo) {
        self.answer(via);
    }

    /// Forgets the calls of a connection that closed.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiting
            .retain(|_, caller| caller.reply_to.connection() != Some(serial));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    fn on(serial: u64) -> ToolCaller {
        ToolCaller {
            reply_to: ReplyTo::Request {
                conn: ConnKey { index: 0, serial },
                seq: 1,
            },
            run: Some(9),
        }
    }

    #[test]
    fn a_call_is_answered_once_and_a_closed_connections_calls_never() {
        let mut calls = ToolCalls::default();
        let first = calls.open(on(1));
        let second = calls.open(on(2));
        assert_ne!(first, second);
        assert_eq!(first.connection(), Some(1));
        let caller = calls.answer(first).unwrap();
        assert_eq!(caller.reply_to, on(1).reply_to);
        assert_eq!(caller.run, Some(9));
        assert!(calls.answer(first).is_none());
        calls.connection_closed(2);
        assert!(calls.answer(second).is_none());
        assert!(calls.answer(ReplyTo::Task(1)).is_none());
    }
}
