//! Who may message whom. Everything happens inside one operator's tree
//! (an operator uid, the agents it started, and theirs): another uid's
//! agents and connections are not there at all, so they are `not_found`,
//! never a hint that they exist.
//!
//! - An operator's connection may message every agent and connection of
//!   its uid's tree.
//! - An agent may message its operator's connections, its parent and its
//!   children (and its own EXEC runs); with `permissions.ipc`, every agent
//!   and connection of its tree.
//! - An EXEC run is hostile code: it may message only what a sandboxed
//!   child of its caller without `ipc` could — the operator's connections
//!   and the agent it runs for — and nothing may reach it but that agent
//!   and the tree's operator.

use agentos_proto::payload::SenderKind;

use crate::agents::Member;

/// A mailbox's owner. Agent ids and connection ids come from separate
/// ranges, so one number on the wire names one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Address {
    /// An agent, by id (its mailbox lasts through its restarts).
    Agent(u32),
    /// An operator's or an EXEC run's connection, by its id.
    Connection(u32),
}

impl Address {
    /// The id on the wire.
    pub fn id(self) -> u32 {
        match self {
            Address::Agent(id) | Address::Connection(id) => id,
        }
    }
}

/// Who is messaging, as the kernel knows it (never as a request claims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    /// Its own mailbox.
    pub address: Address,
    /// The uid of the operator whose tree it is in.
    pub uid: u32,
    /// What it is.
    pub role: Role,
}

/// What kind of principal a sender is, with what its reach depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An operator's connection (`serial` is the reactor's).
    Operator {
        /// Its connection.
        serial: u64,
    },
    /// An agent: its reach is its family's, or its tree's with `ipc`.
    Agent {
        /// Whether it has `permissions.ipc`.
        ipc: bool,
    },
    /// An EXEC run's connection.
    Run {
        /// Its connection.
        serial: u64,
        /// The agent it runs for, if an agent asked for it.
        of_agent: Option<u32>,
    },
}

impl Role {
    /// The kind a received message names.
    pub fn kind(self) -> SenderKind {
        match self {
            Role::Operator { .. } => SenderKind::Operator,
            Role::Agent { .. } => SenderKind::Agent,
            Role::Run { .. } => SenderKind::Run,
        }
    }
}

/// A connection that has taken part in messaging, and so has a mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The uid of the operator whose tree it is in.
    pub uid: u32,
    /// An operator's, or a run's (for the agent it runs for, if any).
    pub role: Role,
}

/// Whether `sender` may message agent `target` (of the same tree).
/// `member` is the sender's own record, for an agent.
pub fn may_reach_agent(sender: &Sender, own: Option<&Member<'_>>, target: &Member<'_>) -> bool {
    if target.owner_uid != sender.uid {
        return false;
    }
    match sender.role {
        Role::Operator { .. } => true,
        Role::Agent { ipc } => {
            let me = sender.address.id();
            ipc || target.id == me
                || target.parent == Some(me)
                || own.is_some_and(|own| own.parent == Some(target.id))
        }
        Role::Run { of_agent, .. } => of_agent == Some(target.id),
    }
}

/// Whether `sender` may message the connection `target` (whose id is
/// `target_id`).
pub fn may_reach_connection(sender: &Sender, target_id: u32, target: &Endpoint) -> bool {
    if target.uid != sender.uid {
        return false;
    }
    if sender.address == Address::Connection(target_id) {
        return true;
    }
    match (target.role, sender.role) {
        // The tree's operator: everyone in the tree may write to it.
        (Role::Operator { .. }, _) => true,
        (Role::Run { .. }, Role::Operator { .. }) => true,
        (Role::Run { of_agent, .. }, Role::Agent { ipc }) => {
            ipc || of_agent == Some(sender.address.id())
        }
        (Role::Run { .. }, Role::Run { .. }) | (Role::Agent { .. }, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u32, parent: Option<u32>, owner_uid: u32) -> Member<'static> {
        Member {
            id,
            name: "a",
            parent,
            owner_uid,
            ipc: false,
        }
    }

    fn agent(id: u32, ipc: bool) -> Sender {
        Sender {
            address: Address::Agent(id),
            uid: 1000,
            role: Role::Agent { ipc },
        }
    }

    #[test]
    fn an_agent_reaches_its_family_and_with_ipc_its_whole_tree() {
        let parent = member(1, None, 1000);
        let me = member(2, Some(1), 1000);
        let child = member(3, Some(2), 1000);
        let cousin = member(4, None, 1000);
        let stranger = member(5, None, 1001);
        let plain = agent(2, false);
        assert!(may_reach_agent(&plain, Some(&me), &parent));
        assert!(may_reach_agent(&plain, Some(&me), &child));
        assert!(!may_reach_agent(&plain, Some(&me), &cousin));
        let widened = agent(2, true);
        assert!(may_reach_agent(&widened, Some(&me), &cousin));
        assert!(!may_reach_agent(&widened, Some(&me), &stranger));
    }

    #[test]
    fn a_run_reaches_only_its_agent_and_the_operator() {
        let run = Sender {
            address: Address::Connection(1_000_005),
            uid: 1000,
            role: Role::Run {
                serial: 9,
                of_agent: Some(2),
            },
        };
        assert!(may_reach_agent(&run, None, &member(2, None, 1000)));
        assert!(!may_reach_agent(&run, None, &member(3, Some(2), 1000)));
        let operator = Endpoint {
            uid: 1000,
            role: Role::Operator { serial: 1 },
        };
        assert!(may_reach_connection(&run, 1_000_000, &operator));
        let other_run = Endpoint {
            uid: 1000,
            role: Role::Run {
                serial: 3,
                of_agent: Some(2),
            },
        };
        assert!(!may_reach_connection(&run, 1_000_007, &other_run));
        assert!(may_reach_connection(
            &agent(2, false),
            1_000_007,
            &other_run
        ));
        assert!(!may_reach_connection(
            &agent(4, false),
            1_000_007,
            &other_run
        ));
        let foreign = Endpoint {
            uid: 0,
            role: Role::Operator { serial: 2 },
        };
        assert!(!may_reach_connection(&run, 1_000_001, &foreign));
    }
}
