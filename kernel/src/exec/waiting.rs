//! What waits for a run child: a request ([`Waiting`]) from a caller
//! ([`RunCaller`]), in its owner's queue or in its session's; a session
//! ([`Session`]), a run child kept with its interpreter and `/workspace`
//! whose queued orders go to it one at a time; and what a restore carries
//! from a session's old child to the fresh one it gives the session
//! ([`Carried`]).

use std::collections::{HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agentos_egress::policy::Policy;
use agentos_egress::record::Record;
use agentos_proto::payload::{ExecRequest, Language, Limits, Network, RunPermissions, VolumeMount};
use agentos_proto::ErrorReply;

use super::order::Order;
use super::queues::Share;
use super::run_cgroup::ChargedTo;
use super::session_meta::SessionMeta;
use crate::address::{Reply, ReplyTo};
use crate::cgroup::CgroupLimits;
use crate::identity::Principal;
use crate::sandbox::attach::VolumePlace;
use crate::telemetry::tracer::{OpenSpan, SpanAgent};

/// Who asks for a run.
#[derive(Clone, Debug)]
pub struct RunCaller {
    /// Whose work it is: the owner of the sessions it reaches.
    pub principal: Principal,
    /// Whose share of EXEC it counts against.
    pub share: Share,
    /// Its own limits, which bound the run's (an operator has none).
    pub limits: Limits,
    /// The agent cgroup its runs are charged under, if it is an agent's
    /// (or an agent's run's) work.
    pub charged_to: Option<ChargedTo>,
    /// The network policy its run gets, if it gets one (the run's grant's).
    pub policy: Option<Policy>,
    /// The connection record of the agent whose work it is, if it has one:
    /// its runs' connections count there too.
    pub net_record: Option<Arc<Mutex<Record>>>,
    /// The agent whose work it is, for the span.
    pub agent: Option<SpanAgent>,
}

/// A template a run child is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateUse {
    /// Built, to start from.
    Use(String),
    /// To be built by the run.
    Build(String),
}

impl TemplateUse {
    /// The template's name.
    pub fn name(&self) -> &str {
        match self {
            TemplateUse::Use(name) | TemplateUse::Build(name) => name,
        }
    }
}

/// A volume a run or an agent is to have mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeUse {
    /// The name its starter gave it, which it knows it by.
    pub name: String,
    /// Whose volume it is.
    pub key: (Principal, String),
    /// Where it goes.
    pub place: VolumePlace,
}

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
    /// Its session's child works on the session's disk.
    pub on_disk: bool,
    /// It opened its session on a fresh child, which has been given the
    /// session's disk since (a restore among them needs no other child).
    pub given_disk: bool,
    /// The template its child is given: to start from, or to build.
    pub template: Option<TemplateUse>,
    /// The volumes its child is given.
    pub volumes: Vec<VolumeUse>,
    /// The globals its session's fresh interpreter is to load first (a
    /// descriptor of a snapshot's state, read-only).
    pub load_state: Option<OwnedFd>,
}

impl Waiting {
    /// Whether its child is to be given disks before it starts.
    pub fn needs_disks(&self) -> bool {
        self.on_disk || self.template.is_some() || !self.volumes.is_empty()
    }

    /// `request` from `caller`, queued `now` with these `limits` and
    /// `timeout` (its deadline), in the session it names, if it names one.
    pub fn new(
        request: ExecRequest,
        caller: RunCaller,
        reply_to: ReplyTo,
        limits: CgroupLimits,
        timeout: Duration,
        now: Instant,
    ) -> Waiting {
        let session = request.session.clone().map(|name| (caller.principal, name));
        // `open` is a run of no code that answers as the session.
        let order = match request.opens {
            Some(_) => Order::Open,
            None => Order::Run,
        };
        Waiting {
            request,
            reply_to,
            owner: caller.principal,
            share: caller.share,
            run: None,
            charged_to: caller.charged_to,
            limits,
            timeout,
            deadline: now + timeout,
            session,
            order,
            carried: None,
            queued_at: now,
            policy: caller.policy,
            net_record: caller.net_record,
            span: None,
            on_disk: false,
            given_disk: false,
            template: None,
            volumes: Vec::new(),
            load_state: None,
        }
    }

    /// `order` for session `key` (a snapshot or restore) from `caller`:
    /// it runs no code of the caller's, so it has no network of its own.
    pub fn for_session(
        key: &SessionKey,
        caller: RunCaller,
        order: Order,
        reply_to: ReplyTo,
        limits: CgroupLimits,
        timeout: Duration,
        now: Instant,
    ) -> Waiting {
        let request = ExecRequest {
            session: Some(key.1.clone()),
            ..ExecRequest::default()
        };
        let caller = RunCaller {
            policy: None,
            net_record: None,
            ..caller
        };
        Waiting {
            order,
            ..Waiting::new(request, caller, reply_to, limits, timeout, now)
        }
    }

    /// What the kernel's own orders to the session it opens are held to:
    /// its caller (with no network and no limits of its own beyond the
    /// run's), limits and timeout.
    pub fn orders_as(&self) -> (RunCaller, CgroupLimits, Duration) {
        let caller = RunCaller {
            principal: self.owner,
            share: self.share,
            limits: Limits::default(),
            charged_to: self.charged_to.clone(),
            policy: None,
            net_record: None,
            agent: None,
        };
        (caller, self.limits, self.timeout)
    }

    /// Whether it counts against its owner's share while it runs: a run
    /// does, a session's snapshot or restore does not.
    pub fn holds_share(&self) -> bool {
        matches!(self.order, Order::Run | Order::Open)
    }

    /// Whether it is a bash run (which goes to a child with a shell).
    pub fn is_bash(&self) -> bool {
        matches!(self.order, Order::Run) && self.request.language == Language::Bash
    }

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
    volumes: Vec<VolumeMount>,
}

impl RunAsk {
    /// What `request` asks.
    pub fn of(request: &ExecRequest) -> RunAsk {
        RunAsk {
            permissions: request.permissions.clone(),
            network: request.network.clone(),
            volumes: request.volumes.clone(),
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
    /// It was reopened on its disk with a fresh interpreter: its next
    /// run's reply says so.
    pub fresh: bool,
    /// The globals its fresh interpreter loads before its next order.
    pub pending_state: Option<OwnedFd>,
    /// Its files are being read for a snapshot: it stays busy until that
    /// is done.
    pub held: bool,
    /// Its interpreter is frozen (PAUSE): its queued orders wait.
    pub paused: bool,
    /// What the kernel's own orders to it (an idle hibernation) are held
    /// to: the caller, limits and timeout of the order that opened it.
    pub orders_as: Option<(RunCaller, CgroupLimits, Duration)>,
    /// Its environment, labels and lifetime.
    pub meta: SessionMeta,
    /// Which of the interpreters the kernel has opened sessions on it is
    /// (see [`Sessions::insert`](super::sessions::Sessions::insert)).
    pub interpreter: u64,
}

impl Session {
    /// A session opened `now` on `child`: a new one whose first run asked
    /// `grant`, or one a restore `carried` over.
    pub fn open(child: usize, carried: Option<Carried>, grant: RunAsk, now: Instant) -> Session {
        let created = SystemTime::now();
        let carried = carried.unwrap_or_else(|| Carried {
            created_at: created,
            runs: 0,
            queue: VecDeque::new(),
            grant,
            meta: SessionMeta::default(),
        });
        Session {
            child,
            created_at: carried.created_at,
            last_used_at: created,
            last_used: now,
            runs: carried.runs,
            queue: carried.queue,
            grant: carried.grant,
            busy: true,
            fresh: false,
            pending_state: None,
            held: false,
            paused: false,
            orders_as: None,
            meta: carried.meta,
            interpreter: 0,
        }
    }

    /// Its child, and what a restore carries of it to a fresh one.
    pub fn into_carried(self) -> (usize, Carried) {
        let carried = Carried {
            created_at: self.created_at,
            runs: self.runs,
            queue: self.queue,
            grant: self.grant,
            meta: self.meta,
        };
        (self.child, carried)
    }
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
    /// Its environment, labels and lifetime.
    pub meta: SessionMeta,
}

/// Answers each of `queue` with `refusal`: none of them ran.
pub fn refuse_each(
    queue: impl IntoIterator<Item = Waiting>,
    refusal: &ErrorReply,
    replies: &mut Vec<Reply>,
) {
    for waiting in queue {
        replies.push((waiting.reply_to, refusal.clone().into()));
    }
}
