//! The EXEC runs in progress, each a principal of its own: what its EXEC
//! request gave it (within its caller's), whose run it is, and where its
//! reply goes — once that reply has gone, the run is over.

use std::collections::HashMap;

use agentos_egress::policy::Policy;
use agentos_egress::Egress;
use agentos_proto::payload::{DelegateName, Limits, Permissions, PrincipalInfo};

use crate::address::{Reply, ReplyTo};
use crate::agents::{Agents, Grant};
use crate::identity::Principal;
use crate::permissions::Budget;

/// The operator or agent at the end of a run's chain of callers (for a run
/// of a run of agent 7: agent 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    /// An operator, by uid.
    Operator(u32),
    /// An agent, by id.
    Agent(u32),
    /// A delegate, by its operator's uid and its name.
    Delegate(u32, DelegateName),
}

impl Root {
    /// The agent, if it is one.
    pub fn agent(self) -> Option<u32> {
        match self {
            Root::Agent(id) => Some(id),
            Root::Operator(_) | Root::Delegate(..) => None,
        }
    }
}

/// The token budget a run's own `llm_tokens` sets is kept under this key
/// and the run's number, clear of every agent's id.
const RUN_BUDGETS: u32 = 1 << 31;

/// What an EXEC run was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunGrant {
    /// Whose run it is.
    pub of: Principal,
    /// The operator or agent at the end of the chain of callers.
    pub root: Root,
    /// What its connection may do.
    pub permissions: Permissions,
    /// Its limits in force.
    pub limits: Limits,
    /// What it may reach.
    pub network: Egress,
    /// The token budgets it draws on: its own, if it has one, then its
    /// caller's.
    pub budgets: Vec<Budget>,
    /// Where its reply goes: once that reply has gone, the run is over.
    pub reply_to: ReplyTo,
}

impl RunGrant {
    /// What it may give an agent it spawns: never more than it has.
    pub fn as_parent(&self) -> Grant {
        Grant {
            network: self.network.clone(),
            limits: self.limits,
            permissions: self.permissions.clone(),
        }
    }
}

/// The runs in progress, by number.
#[derive(Debug, Default)]
pub struct Runs {
    grants: HashMap<u64, RunGrant>,
    by_reply: HashMap<ReplyTo, u64>,
    next: u64,
}

impl Runs {
    /// The number the next run gets.
    pub fn next_number(&self) -> u64 {
        self.next + 1
    }

    /// Admits a run under the number [`next_number`](Self::next_number)
    /// gave; returns it.
    pub fn admit(&mut self, grant: RunGrant) -> u64 {
        self.next += 1;
        let number = self.next;
        self.by_reply.insert(grant.reply_to, number);
        self.grants.insert(number, grant);
        number
    }

    /// The key run `number`'s own token budget is kept under.
    pub fn budget_key(number: u64) -> u32 {
        RUN_BUDGETS | (number as u32 & !RUN_BUDGETS)
    }

    /// What run `number` was given, while it lasts.
    pub fn get(&self, number: u64) -> Option<&RunGrant> {
        self.grants.get(&number)
    }

    /// Forgets a run that was refused before it began.
    pub fn refused(&mut self, number: u64) {
        if let Some(grant) = self.grants.remove(&number) {
            self.by_reply.remove(&grant.reply_to);
        }
    }

    /// The runs whose replies are among `replies`: each is over.
    pub fn answered_by(&mut self, replies: &[Reply]) -> Vec<u64> {
        if self.is_empty() {
            return Vec::new();
        }
        replies
            .iter()
            .filter_map(|(to, _)| self.answered(to).map(|(number, _)| number))
            .collect()
    }

    /// The run whose reply goes to `reply_to`, if one does: that reply
    /// ends it.
    pub fn answered(&mut self, reply_to: &ReplyTo) -> Option<(u64, RunGrant)> {
        let number = self.by_reply.remove(reply_to)?;
        self.grants.remove(&number).map(|grant| (number, grant))
    }

    /// Agent `id`'s policy is now `policy`: the runs at whose root it is
    /// get theirs narrowed to lie within it. Returns each principal whose
    /// work it is (the agent, and those runs) with its policy now, for the
    /// endpoints and queued runs of their work (a run with loopback only
    /// has an empty policy: it may give nothing through the proxy).
    pub fn narrow_for_agent(&mut self, id: u32, policy: &Policy) -> Vec<(Principal, Policy)> {
        let mut owners = vec![(Principal::Agent { id }, policy.clone())];
        for (number, grant) in &mut self.grants {
            if grant.root != Root::Agent(id) {
                continue;
            }
            let now = match &grant.network {
                Egress::Policy(own) => own.clone().narrowed_to(policy),
                // A run never has the host's network; either way nothing
                // of it may reach more than its agent now does.
                Egress::Loopback | Egress::Host => Policy::default(),
            };
            if grant.network.policy().is_some() {
                grant.network = Egress::Policy(now.clone());
            }
            owners.push((Principal::Run { number: *number }, now));
        }
        owners
    }

    /// SET_PERMS by run `number` on itself: its permissions become what
    /// `lower` makes of them, for the rest of the run.
    pub fn lower(
        &mut self,
        number: u64,
        lower: impl Fn(Permissions) -> Permissions,
    ) -> Option<Permissions> {
        let grant = self.grants.get_mut(&number)?;
        grant.permissions = lower(grant.permissions.clone());
        Some(grant.permissions.clone())
    }

    /// How many runs are in progress.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Whether any run is in progress (so replies need looking at).
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// `principal` as HELLO says it: a run as a run of its caller's.
    pub fn describe(&self, principal: Principal, agents: &Agents) -> PrincipalInfo {
        match principal {
            Principal::Operator { uid } => PrincipalInfo::Operator { uid },
            Principal::Delegate { uid, name } => PrincipalInfo::Delegate {
                name,
                of: Box::new(PrincipalInfo::Operator { uid }),
            },
            Principal::Agent { id } => PrincipalInfo::Agent {
                id,
                name: agents.grant(id).map(|grant| grant.name.to_owned()),
            },
            // A run that is over is no one's any more.
            Principal::Run { number } => PrincipalInfo::Run {
                of: self
                    .grants
                    .get(&number)
                    .map(|grant| Box::new(self.describe(grant.of, agents))),
            },
        }
    }
}
