//! LOGS (0x16): an agent's log. Without `after`, its last lines; with
//! `after`, what it wrote since; with `follow`, the reply waits until it
//! writes more, ends, or `wait_ms` passes. Each reply says where to go on
//! from (`offset`), and `ended` once the agent is gone and its log is read
//! to the end, so a follower is a loop of requests, each with one reply.
//!
//! An agent sees the logs of itself and its descendants, as in LIST; any
//! other agent is `not_found`, exactly as one that does not exist.

use std::time::{Duration, Instant};

use agentos_proto::payload::{to_json, AgentRef, LogsReply, LogsRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::{Kernel, Outcome, Request};
use crate::address::ReplyTo;
use crate::agents::log_reader::{self, Chunk};
use crate::agents::AgentLog;
use crate::identity::Identity;

/// How often a waiting follower's log is looked at.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// A follow waiting for its agent to write.
#[derive(Debug)]
pub struct LogFollower {
    reply_to: ReplyTo,
    caller: Identity,
    agent: u32,
    after: u64,
    deadline: Instant,
    next_look: Instant,
}

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let parsed = match LogsRequest::parse(request.payload) {
        Ok(parsed) => parsed,
        Err(err) => return Outcome::Reply(err.to_json()),
    };
    let caller = request.caller.identity;
    let log = match parsed
        .target()
        .and_then(|target| find(kernel, caller, &target))
    {
        Ok(log) => log,
        Err(err) => return Outcome::Reply(err.to_json()),
    };
    let after = match (parsed.after, parsed.follow) {
        (Some(after), _) => after,
        (None, true) => log_reader::size(&log.path),
        (None, false) => {
            return Outcome::Reply(answer(&log, log_reader::tail(&log.path, parsed.lines())))
        }
    };
    let now = Instant::now();
    if parsed.follow && log.live && log_reader::size(&log.path) == after {
        kernel.log_followers.push(LogFollower {
            reply_to: request.reply_to,
            caller,
            agent: log.id,
            after,
            deadline: now + Duration::from_millis(parsed.wait_ms()),
            next_look: now + FOLLOW_POLL,
        });
        return Outcome::Later;
    }
    Outcome::Reply(answer(&log, log_reader::read_after(&log.path, after)))
}

/// The agent's log, if the caller may see the agent.
fn find(kernel: &Kernel, caller: Identity, target: &AgentRef) -> Result<AgentLog, ErrorReply> {
    kernel.agents.log_of(caller, target).ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::NotFound,
            match target {
                AgentRef::Id(id) => format!("no agent with id {id}"),
                AgentRef::Name(name) => format!("no agent named {name:?}"),
            },
        )
    })
}

fn answer(log: &AgentLog, read: std::io::Result<Chunk>) -> Vec<u8> {
    match read {
        Ok(chunk) => to_json(&LogsReply {
            success: true,
            id: log.id,
            name: log.name.clone(),
            state: log.state,
            text: String::from_utf8_lossy(&chunk.bytes).into_owned(),
            ended: !log.live && chunk.offset >= chunk.size,
            offset: chunk.offset,
            truncated: chunk.truncated,
        }),
        Err(err) => ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot read the log of agent {}: {err}", log.id),
        )
        .to_json(),
    }
}

impl Kernel {
    /// Answers the followers whose agent wrote, ended or was forgotten,
    /// or whose wait is over; with `all`, every follower (at shutdown).
    pub(super) fn serve_log_followers(&mut self, now: Instant, all: bool) {
        if self.log_followers.is_empty() {
            return;
        }
        let followers = std::mem::take(&mut self.log_followers);
        for mut follower in followers {
            if !all && follower.next_look > now {
                self.log_followers.push(follower);
                continue;
            }
            let reply = match find(self, follower.caller, &AgentRef::Id(follower.agent)) {
                Err(err) => err.to_json(),
                Ok(log) => {
                    let grown = log_reader::size(&log.path) != follower.after;
                    if !(all || grown || !log.live || now >= follower.deadline) {
                        follower.next_look = now + FOLLOW_POLL;
                        self.log_followers.push(follower);
                        continue;
                    }
                    answer(&log, log_reader::read_after(&log.path, follower.after))
                }
            };
            self.outbox.replies.push((follower.reply_to, reply));
        }
    }

    /// When a follower's log must next be looked at.
    pub(super) fn next_log_look(&self, now: Instant) -> Option<Duration> {
        self.log_followers
            .iter()
            .map(|f| f.next_look.saturating_duration_since(now))
            .min()
    }

    /// Followers whose connection closed wait for no one.
    pub(super) fn drop_log_followers_of(&mut self, connection: u64) {
        self.log_followers
            .retain(|f| f.reply_to.connection() != Some(connection));
    }
}
