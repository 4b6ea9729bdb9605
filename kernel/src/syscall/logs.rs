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

use agentos_proto::payload::{to_json, AgentRef, LogsReply, LogsRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::runs::Root;
use super::{actor, Kernel, Outcome, Request};
use crate::address::{Answer, ReplyTo};
use crate::agents::log_reader::{self, Chunk};
use crate::agents::AgentLog;
use crate::agents::Viewer;
use crate::identity::Identity;

/// How often the waiting followers' logs are looked at, all together.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// Follows one owner (an agent with its whole family, or an operator's
/// connection) may have waiting at once.
pub const MAX_FOLLOWS_PER_OWNER: usize = 16;
/// Follows waiting at once, from everyone.
pub const MAX_FOLLOWS: usize = 1024;
/// Of those, kept for operators: agents cannot take them all.
const OPERATOR_FOLLOWS: usize = 64;
/// Log text one look at the followers answers with, about: a thousand
/// followers of a log that has just grown are answered over several looks,
/// not in one burst of memory.
const FOLLOW_BYTES_PER_LOOK: usize = 4 << 20;

/// The follows waiting for their agents to write.
#[derive(Debug, Default)]
pub struct LogFollowers {
    waiting: Vec<LogFollower>,
    /// When their logs are next looked at.
    next_look: Option<Instant>,
}

/// Whose follows count together: an agent's with its whole family's and
/// its runs' (it may make children at will), an operator's per connection,
/// an operator's run's its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FollowOwner {
    Tree(u32),
    Operator(Identity),
    Run(Identity),
}

impl LogFollowers {
    /// Whether `owner` may have one more follow waiting; `busy` if not.
    fn has_room_for(&self, owner: FollowOwner) -> Result<(), ErrorReply> {
        let own = self.waiting.iter().filter(|f| f.owner == owner).count();
        let (taken, room) = match owner {
            FollowOwner::Tree(_) | FollowOwner::Run(_) => (
                self.waiting
                    .iter()
                    .filter(|f| !matches!(f.owner, FollowOwner::Operator(_)))
                    .count(),
                MAX_FOLLOWS - OPERATOR_FOLLOWS,
            ),
            FollowOwner::Operator(_) => (self.waiting.len(), MAX_FOLLOWS),
        };
        if own < MAX_FOLLOWS_PER_OWNER && taken < room {
            return Ok(());
        }
        Err(ErrorReply::new(
            ErrorCode::Busy,
            format!(
                "{} LOGS follows are waiting ({own} of them yours; at most \
                 {MAX_FOLLOWS_PER_OWNER} for an agent and its family, or for an operator's \
                 connection); retry when one has been answered",
                self.waiting.len()
            ),
        ))
    }
}

/// A follow waiting for its agent to write.
#[derive(Debug)]
struct LogFollower {
    reply_to: ReplyTo,
    owner: FollowOwner,
    viewer: Viewer,
    agent: u32,
    after: u64,
    deadline: Instant,
}

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    match logs(kernel, request) {
        Ok(Some(reply)) => Outcome::Reply(to_json(&reply)),
        Ok(None) => Outcome::Later,
        Err(err) => Outcome::Reply(err.to_json()),
    }
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
    };
    let log = find(kernel, viewer, &parsed.target()?)?;
    let after = match (parsed.after, parsed.follow) {
        (Some(after), _) => after,
        (None, true) => log_reader::size(&log.path),
        (None, false) => {
            let tail = log_reader::tail(&log.path, parsed.lines(), log.live);
            return answer(&log, tail).map(Some);
        }
    };
    let read = log_reader::read_after(&log.path, after, log.live);
    if !(parsed.follow && log.live && read.as_ref().is_ok_and(Chunk::is_empty)) {
        return answer(&log, read).map(Some);
    }
    kernel.log_followers.has_room_for(owner)?;
    let now = Instant::now();
    let followers = &mut kernel.log_followers;
    followers.waiting.push(LogFollower {
        reply_to: request.reply_to,
        owner,
        viewer,
        agent: log.id,
        after,
        deadline: now + Duration::from_millis(parsed.wait_ms()),
    });
    followers.next_look.get_or_insert(now + FOLLOW_POLL);
    Ok(None)
}

/// The agent's log, if the caller may see the agent.
fn find(kernel: &Kernel, viewer: Viewer, target: &AgentRef) -> Result<AgentLog, ErrorReply> {
    kernel.agents.log_of(viewer, target).ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::NotFound,
            match target {
                AgentRef::Id(id) => format!("no agent with id {id}"),
                AgentRef::Name(name) => format!("no agent named {name:?}"),
            },
        )
    })
}

fn answer(log: &AgentLog, read: std::io::Result<Chunk>) -> Result<LogsReply, ErrorReply> {
    let chunk = read.map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot read the log of agent {}: {err}", log.id),
        )
    })?;
    Ok(LogsReply {
        success: true,
        id: log.id,
        name: log.name.clone(),
        state: log.state,
        text: String::from_utf8_lossy(&chunk.bytes).into_owned(),
        ended: !log.live && chunk.offset >= chunk.size,
        offset: chunk.offset,
        truncated: chunk.truncated,
    })
}

impl Kernel {
    /// Looks at the waiting followers' logs when their time has come (cheap
    /// otherwise: it runs on every turn of the reactor) and answers those
    /// whose agent wrote, ended or was forgotten, or whose wait is over;
    /// with `all`, every follower at once (at shutdown). One look answers
    /// with about `FOLLOW_BYTES_PER_LOOK` of log text at most; the rest
    /// wait for the next.
    pub(super) fn serve_log_followers(&mut self, now: Instant, all: bool) {
        match self.log_followers.next_look {
            Some(due) if all || due <= now => {}
            _ => return,
        }
        let mut budget = FOLLOW_BYTES_PER_LOOK;
        let waiting = std::mem::take(&mut self.log_followers.waiting);
        for follower in waiting {
            let log = match find(self, follower.viewer, &AgentRef::Id(follower.agent)) {
                Ok(log) => log,
                Err(err) => {
                    self.outbox.replies.push((follower.reply_to, err.into()));
                    continue;
                }
            };
            let over = all || !log.live || now >= follower.deadline;
            if !over && budget == 0 {
                self.log_followers.waiting.push(follower);
                continue;
            }
            let read = log_reader::read_after(&log.path, follower.after, log.live);
            // Nothing new yet (or only half a character).
            if !over && read.as_ref().is_ok_and(Chunk::is_empty) {
                self.log_followers.waiting.push(follower);
                continue;
            }
            budget = budget.saturating_sub(read.as_ref().map_or(0, |chunk| chunk.bytes.len()));
            let reply = match answer(&log, read) {
                Ok(reply) => Answer::json(&reply),
                Err(err) => err.into(),
            };
            self.outbox.replies.push((follower.reply_to, reply));
        }
        self.log_followers.next_look =
            (!self.log_followers.waiting.is_empty()).then(|| now + FOLLOW_POLL);
    }

    /// When the followers' logs must next be looked at.
    pub(super) fn next_log_look(&self, now: Instant) -> Option<Duration> {
        self.log_followers
            .next_look
            .map(|due| due.saturating_duration_since(now))
    }

    /// Followers whose connection closed wait for no one.
    pub(super) fn drop_log_followers_of(&mut self, connection: u64) {
        self.log_followers
            .waiting
            .retain(|f| f.reply_to.connection() != Some(connection));
    }
}
