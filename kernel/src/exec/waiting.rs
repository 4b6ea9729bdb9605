//! What waits for a run child: a request ([`Waiting`]), in its owner's
//! queue or in its session's; a session ([`Session`]), a run child kept
//! with its interpreter and `/workspace` whose queued orders go to it one
//! at a time; and what a restore carries from a session's old child to the
//! fresh one it gives the session ([`Carried`]).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{ExecRequest, Network, RunPermissions};

use super::order::Order;
use super::queues::Share;
use super::run_cgroup::ChargedTo;
use crate::address::ReplyTo;
use crate::cgroup::CgroupLimits;
use crate::identity::Principal;
use crate::network::policy::Policy;
use crate::network::record::Record;
use crate::telemetry::tracer::OpenSpan;

/// A session by its owner (an agent, an operator's uid, or a run) and name.
pub type SessionKey = (Principal, String);

/// A request waiting for a run child.
#[derive(Debug)]
pub struct Waiting {
    /// The request (for a snapshot or restore, one naming its session).
    pub request: ExecRequest,
    /// Where its reply goes.
    pub reply_to: ReplyTo,
    /// Whose work it is (the owner of its session).
    pub owner: Principal,
    /// Whose share of EXEC it counts against.
    pub share: Share,
    /// The run's number, for a run: its own kernel connection speaks for
    /// it.
    pub run: Option<u64>,
    /// The agent cgroup it is charged under, if any.
    pub charged_to: Option<ChargedTo>,
    /// The run's cgroup limits.
    pub limits: CgroupLimits,
    /// Its wall-clock limit.
    pub timeout: Duration,
    /// Past this, waiting counts against the run's timeout: it is
    /// answered `timeout` rather than left waiting.
    pub deadline: Instant,
    /// The session it runs in, if any.
    pub session: Option<SessionKey>,
    /// What it asks for.
    pub order: Order,
    /// For a restore whose turn has come: the session it carries over.
    pub carried: Option<Carried>,
    /// When it was queued.
    pub queued_at: Instant,
    /// The network policy of a run that has one, as it was granted when
    /// the run was admitted (held to its owner's again when it starts).
    pub policy: Option<Policy>,
    /// The connection record of the agent whose work it is, which its
    /// endpoint's attempts count in too.
    pub net_record: Option<Arc<Mutex<Record>>>,
    /// The run's span, with tracing on.
    pub span: Option<OpenSpan>,
}

impl Waiting {
    /// Whether it may go past its owner's cap: a run's own run, while that
    /// run (which waits for it, in a place of its own) has none going.
    pub fn is_lent(&self, lending: &HashSet<u64>) -> bool {
        matches!(self.owner, Principal::Run { number } if !lending.contains(&number))
    }
}

/// What a run asked for its own kernel connection: a session's runs must
/// all ask the same, for what one run leaves running in the interpreter
/// (a thread) lives on into the next and could use its connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAsk {
    permissions: Option<RunPermissions>,
    network: Option<Network>,
}

impl RunAsk {
    /// What `request` asks.
    pub fn of(request: &ExecRequest) -> RunAsk {
        RunAsk {
            permissions: request.permissions.clone(),
            network: request.network.clone(),
        }
    }
}

/// A session: a run child kept with its interpreter and /workspace.
#[derive(Debug)]
pub struct Session {
    /// Its run child.
    pub child: usize,
    /// When it was opened.
    pub created_at: SystemTime,
    /// When a run of it last started, as the clock says.
    pub last_used_at: SystemTime,
    /// When it was last used (a run started or ended), for its idle timer.
    pub last_used: Instant,
    /// Runs of it so far (its snapshots and restores aside).
    pub runs: u64,
    /// Requests waiting for its child, oldest first.
    pub queue: VecDeque<Waiting>,
    /// A run of it is going.
    pub busy: bool,
    /// What the run that opened it asked for its connection.
    pub grant: RunAsk,
}

/// What a session carries from its old child to the fresh one a restore
/// gives it.
#[derive(Debug)]
pub struct Carried {
    /// When the session was opened.
    pub created_at: SystemTime,
    /// Its runs so far.
    pub runs: u64,
    /// What waits for it.
    pub queue: VecDeque<Waiting>,
    /// What the run that opened it asked for its connection.
    pub grant: RunAsk,
}
