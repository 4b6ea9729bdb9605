//! LOGS (0x16): an agent's log. Without `after`, its last lines; with
//! `after`, what it wrote since; with `follow`, the reply waits until it
//! writes more, ends, or `wait_ms` passes. Each reply says where to go on
//! from (`offset`), and `ended` once the agent is gone and its log is read
//! to the end, so a follower is a loop of requests, each with one reply.
//!
//! An agent sees the logs of itself and its descendants, as in LIST, and an
//! EXEC run those of the agents it spawned; any other agent is
//! `not_found`, exactly as one that does not exist.

use std::time::{Duration, Instant};

use agentos_proto::payload::{LogsReply, LogsRequest};
use agentos_proto::ErrorReply;

use super::request::{actor, delegate_refused, reply_later, Outcome, Request};
use crate::agents::log_reader::{self, Chunk};
use crate::identity::Identity;
use crate::kernel::{log_seen_by, logs_reply, FollowOwner, Kernel, LogFollower, Root};

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    reply_later(logs(kernel, request))
}

/// The reply, or `None` when the request waits as a follower.
fn logs(kernel: &mut Kernel, request: &Request<'_>) -> Result<Option<LogsReply>, ErrorReply> {
    let parsed = LogsRequest::parse(request.payload)?;
    let actor = actor(kernel, request)?;
    let viewer = actor.viewer();
    let identity = request.caller.identity;
    let owner = match (actor.root(), identity) {
        (Root::Agent(agent), _) => FollowOwner::Tree(kernel.agents.root_of(agent)),
        (Root::Operator(_), Identity::Run { .. }) => FollowOwner::Run(identity),
        (Root::Operator(_), _) => FollowOwner::Operator(identity),
        (Root::Delegate(..), _) => return Err(delegate_refused("LOGS")),
    };
    let log = log_seen_by(&kernel.agents, viewer, &parsed.target()?)?;
    let after = match (parsed.after, parsed.follow) {
        (Some(after), _) => after,
        (None, true) => log_reader::size(&log.path),
        (None, false) => {
            let tail = log_reader::tail(&log.path, parsed.lines(), log.live);
            return logs_reply(&log, tail).map(Some);
        }
    };
    let read = log_reader::read_after(&log.path, after, log.live);
    if !(parsed.follow && log.live && read.as_ref().is_ok_and(Chunk::is_empty)) {
        return logs_reply(&log, read).map(Some);
    }
    kernel.log_followers.has_room_for(owner)?;
    let now = Instant::now();
    let follower = LogFollower {
        reply_to: request.reply_to,
        owner,
        viewer,
        agent: log.id,
        after,
        deadline: now + Duration::from_millis(parsed.wait_ms()),
    };
    kernel.log_followers.follow(follower, now);
    Ok(None)
}
