//! LOGS follows: requests that wait for an agent to write more, end, or
//! their wait to pass, looked at together every so often. One owner (an
//! agent with its whole family, an operator's connection, a run) has a
//! bounded number waiting, and operators always have room.

use std::time::{Duration, Instant};

use agentos_proto::payload::{AgentRef, LogsReply};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::{Answer, Reply, ReplyTo};
use crate::agents::log_reader::{self, Chunk};
use crate::agents::{AgentLog, Agents, Viewer};
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
pub enum FollowOwner {
    /// An agent and its family, by the family's root.
    Tree(u32),
    /// An operator's connection.
    Operator(Identity),
    /// An operator's run.
    Run(Identity),
}

impl LogFollowers {
    /// Whether `owner` may have one more follow waiting; `busy` if not.
    pub fn has_room_for(&self, owner: FollowOwner) -> Result<(), ErrorReply> {
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
pub struct LogFollower {
    /// Where its reply goes.
    pub reply_to: ReplyTo,
    /// Whose follows it counts among.
    pub owner: FollowOwner,
    /// How its caller sees the agents.
    pub viewer: Viewer,
    /// The agent followed.
    pub agent: u32,
    /// The offset it has read up to.
    pub after: u64,
    /// When its wait is over.
    pub deadline: Instant,
}

impl LogFollowers {
    /// Adds a follower (after [`has_room_for`](Self::has_room_for)).
    pub fn follow(&mut self, follower: LogFollower, now: Instant) {
        self.waiting.push(follower);
        self.next_look.get_or_insert(now + FOLLOW_POLL);
    }

    /// Looks at the waiting followers' logs when their time has come (cheap
    /// otherwise: it runs on every turn of the reactor) and answers those
    /// whose agent wrote, ended or was forgotten, or whose wait is over;
    /// with `all`, every follower at once (at shutdown). One look answers
    /// with about `FOLLOW_BYTES_PER_LOOK` of log text at most; the rest
    /// wait for the next.
    pub fn serve(&mut self, agents: &Agents, now: Instant, all: bool, replies: &mut Vec<Reply>) {
        match self.next_look {
            Some(due) if all || due <= now => {}
            _ => return,
        }
        let mut budget = FOLLOW_BYTES_PER_LOOK;
        let waiting = std::mem::take(&mut self.waiting);
        for follower in waiting {
            let log = match log_seen_by(agents, follower.viewer, &AgentRef::Id(follower.agent)) {
                Ok(log) => log,
                Err(err) => {
                    replies.push((follower.reply_to, err.into()));
                    continue;
                }
            };
            let over = all || !log.live || now >= follower.deadline;
            if !over && budget == 0 {
                self.waiting.push(follower);
                continue;
            }
            let read = log_reader::read_after(&log.path, follower.after, log.live);
            // Nothing new yet (or only half a character).
            if !over && read.as_ref().is_ok_and(Chunk::is_empty) {
                self.waiting.push(follower);
                continue;
            }
            budget = budget.saturating_sub(read.as_ref().map_or(0, |chunk| chunk.bytes.len()));
            let reply = match logs_reply(&log, read) {
                Ok(reply) => Answer::json(&reply),
                Err(err) => err.into(),
            };
            replies.push((follower.reply_to, reply));
        }
        self.next_look = (!self.waiting.is_empty()).then(|| now + FOLLOW_POLL);
    }

    /// When the followers' logs must next be looked at.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.next_look.map(|due| due.saturating_duration_since(now))
    }

    /// Followers whose connection closed wait for no one.
    pub fn connection_closed(&mut self, connection: u64) {
        self.waiting
            .retain(|f| f.reply_to.connection() != Some(connection));
    }
}

/// The agent's log, if the caller may see the agent.
pub fn log_seen_by(
    agents: &Agents,
    viewer: Viewer,
    target: &AgentRef,
) -> Result<AgentLog, ErrorReply> {
    agents
        .log_of(viewer, target)
        .ok_or_else(|| crate::agents::network::not_found(target))
}

/// The reply for what was read of `log`.
pub fn logs_reply(log: &AgentLog, read: std::io::Result<Chunk>) -> Result<LogsReply, ErrorReply> {
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
