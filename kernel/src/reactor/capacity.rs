//! How many connections the kernel serves, and whose: `max_connections` in
//! all; of those, agents together never hold more than their share (the
//! rest is the operators' reserve), and one agent never more than
//! `agents.max_connections`. An agent hoarding connections on its own
//! socket therefore cannot keep an operator — or another agent — out. An
//! EXEC run's own connection counts in the total only: the kernel makes
//! exactly one per run in progress, and runs in progress are bounded by
//! EXEC's own caps.

use std::collections::HashMap;

use crate::config::Config;
use crate::identity::Identity;

/// Why a connection does not fit; the refusal's message says which limit.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    /// The kernel serves `max_connections` already.
    #[error("the kernel is serving its maximum of {max} connections; retry later")]
    Kernel {
        /// `max_connections`.
        max: usize,
    },
    /// The agent holds `agents.max_connections` already.
    #[error(
        "agent {id} already holds {own} connections, its maximum \
         (agents.max_connections); close one first"
    )]
    Agent {
        /// The agent.
        id: u32,
        /// The connections it holds.
        own: usize,
    },
    /// Agents together hold their whole share.
    #[error(
        "agents hold {held} connections, all they may (the rest is kept for operators); \
         retry later"
    )]
    Agents {
        /// The connections agents hold.
        held: usize,
    },
}

/// Connections held, against the limits.
#[derive(Debug)]
pub struct Capacity {
    max_total: usize,
    agents_share: usize,
    per_agent: usize,
    total: usize,
    agents: usize,
    by_agent: HashMap<u32, usize>,
}

impl Capacity {
    /// The limits `config` sets.
    pub fn new(config: &Config) -> Capacity {
        Capacity {
            max_total: config.max_connections,
            agents_share: config.agents_connection_share(),
            per_agent: config.agents.max_connections,
            total: 0,
            agents: 0,
            by_agent: HashMap::new(),
        }
    }

    /// Whether one more connection for `identity` fits; if not, why not.
    pub fn check(&self, identity: Identity) -> Result<(), NoRoom> {
        if self.total >= self.max_total {
            return Err(NoRoom::Kernel {
                max: self.max_total,
            });
        }
        let Some(id) = identity.agent() else {
            return Ok(());
        };
        let own = self.by_agent.get(&id).copied().unwrap_or(0);
        if own >= self.per_agent {
            return Err(NoRoom::Agent { id, own });
        }
        if self.agents >= self.agents_share {
            return Err(NoRoom::Agents { held: self.agents });
        }
        Ok(())
    }

    /// Connections open now.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Agents' connections open now.
    pub fn agents(&self) -> usize {
        self.agents
    }

    /// A connection for `identity` was installed.
    pub fn opened(&mut self, identity: Identity) {
        self.total += 1;
        if let Some(id) = identity.agent() {
            self.agents += 1;
            *self.by_agent.entry(id).or_default() += 1;
        }
    }

    /// A connection for `identity` was closed.
    pub fn closed(&mut self, identity: Identity) {
        self.total = self.total.saturating_sub(1);
        if let Some(id) = identity.agent() {
            self.agents = self.agents.saturating_sub(1);
            if let Some(own) = self.by_agent.get_mut(&id) {
                *own -= 1;
                if *own == 0 {
                    self.by_agent.remove(&id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(max: usize, reserve: usize, per_agent: usize) -> Capacity {
        let mut config = Config {
            max_connections: max,
            reserved_operator_connections: reserve,
            ..Config::default()
        };
        config.agents.max_connections = per_agent;
        Capacity::new(&config)
    }

    const OPERATOR: Identity = Identity::Operator { id: 1_000_000 };
    const A: Identity = Identity::Agent { id: 1 };
    const B: Identity = Identity::Agent { id: 2 };

    /// Opens connections for `who` until refused; returns how many.
    fn fill(capacity: &mut Capacity, who: Identity) -> usize {
        let mut n = 0;
        while capacity.check(who).is_ok() {
            capacity.opened(who);
            n += 1;
        }
        n
    }

    #[test]
    fn one_agent_holds_at_most_its_cap_and_agents_at_most_their_share() {
        let mut c = capacity(160, 64, 64);
        assert_eq!(fill(&mut c, A), 64);
        assert_eq!(fill(&mut c, B), 32);
        assert!(c
            .check(B)
            .unwrap_err()
            .to_string()
            .contains("kept for operators"));
        assert_eq!(fill(&mut c, OPERATOR), 64);
        assert!(c
            .check(OPERATOR)
            .unwrap_err()
            .to_string()
            .contains("maximum of 160"));
    }

    #[test]
    fn closing_gives_the_room_back() {
        let mut c = capacity(160, 64, 2);
        assert_eq!(fill(&mut c, A), 2);
        c.closed(A);
        assert!(c.check(A).is_ok());
        c.closed(A);
        c.closed(A);
        assert!(c.by_agent.is_empty());
        assert_eq!((c.total, c.agents), (0, 0));
    }

    #[test]
    fn the_reserve_is_at_most_half() {
        let mut c = capacity(10, 64, 64);
        assert_eq!(fill(&mut c, A), 5);
        assert_eq!(fill(&mut c, OPERATOR), 5);
    }
}
