//! HTTP (0x50): requests the kernel makes for its callers, each held to
//! the caller's network policy (see `client`).
//!
//! Each request runs on a thread of its own that first becomes its caller
//! (`as_caller`): the sockets it opens are the caller's, without
//! capabilities, so nothing on the host — a firewall rule matching the
//! socket's owner, a service that trusts root's connections — takes the
//! kernel's identity for the caller's. The reply comes back through the
//! kernel's outbox once the thread is done; a caller has a few requests in
//! flight at most, and the kernel a bounded number.

mod client;

use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use agentos_egress::policy::Policy;
use agentos_primitives::pool::Outbox;
use agentos_proto::payload::HttpRequest;
use agentos_proto::{ErrorCode, ErrorReply};
use mio::Waker;

pub use client::Upstream;

use crate::address::{Answer, Reply, ReplyTo};
use crate::as_caller::{self, AsCaller};
use crate::identity::Principal;

/// Requests one principal may have in flight.
pub const MAX_PER_CALLER: usize = 4;
/// Requests the kernel has in flight, for every caller together.
pub const MAX_IN_FLIGHT: usize = 64;

/// A request that is done.
#[derive(Debug)]
struct Done {
    principal: Principal,
    reply_to: ReplyTo,
    answer: Answer,
}

/// The requests in flight.
#[derive(Debug)]
pub struct HttpCalls {
    upstream: Arc<Upstream>,
    outbox: Outbox<Done>,
    done: Receiver<Done>,
    in_flight: HashMap<Principal, usize>,
}

impl HttpCalls {
    /// Finished requests wake `waker`.
    pub fn new(upstream: Upstream, waker: Arc<Waker>) -> HttpCalls {
        let (outbox, done) = Outbox::channel(waker);
        HttpCalls {
            upstream: Arc::new(upstream),
            outbox,
            done,
            in_flight: HashMap::new(),
        }
    }

    /// Starts `request` for `principal` (acting as `who`) under `policy`;
    /// its reply goes to `reply_to`. Refused (`busy`) past the bounds.
    pub fn start(
        &mut self,
        principal: Principal,
        who: AsCaller,
        policy: Policy,
        request: HttpRequest,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        let own = self.in_flight.get(&principal).copied().unwrap_or(0);
        if own >= MAX_PER_CALLER {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "HTTP: {MAX_PER_CALLER} requests of this caller are in flight; wait for one"
                ),
            ));
        }
        if self.in_flight.values().sum::<usize>() >= MAX_IN_FLIGHT {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("HTTP: the kernel has {MAX_IN_FLIGHT} requests in flight; try again"),
            ));
        }
        let upstream = Arc::clone(&self.upstream);
        let outbox = self.outbox.clone();
        agentos_primitives::threads::spawn("http-call", move || {
            let answer = match as_caller::become_caller(&who) {
                Ok(()) => client::perform(&upstream, policy, request)
                    .map_or_else(Answer::from, |reply| Answer::json(&reply)),
                Err(err) => as_caller::cannot_act_as(&who, "HTTP", &err).into(),
            };
            // A kernel shutting down no longer reads replies.
            let _ = outbox.send(Done {
                principal,
                reply_to,
                answer,
            });
        })
        .map_err(|err| {
            ErrorReply::new(
                ErrorCode::Internal,
                format!("cannot start a thread for HTTP: {err}"),
            )
        })?;
        *self.in_flight.entry(principal).or_insert(0) += 1;
        Ok(())
    }

    /// Hands the finished requests' replies over.
    pub fn on_wake(&mut self, replies: &mut Vec<Reply>) {
        for done in self.done.try_iter() {
            if let Some(count) = self.in_flight.get_mut(&done.principal) {
                *count -= 1;
                if *count == 0 {
                    self.in_flight.remove(&done.principal);
                }
            }
            replies.push((done.reply_to, done.answer));
        }
    }
}
