//! Whose keys: who asks (a [`Holder`]) and the namespaces it reaches
//! (each a [`Space`]), written as text only at the database's edge.

use std::fmt;

use agentos_proto::payload::Scope;

/// Who asks the state store. EXEC runs never do: a run keeps its state
/// in its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// An operator, by uid.
    Operator {
        /// Its uid.
        uid: u32,
    },
    /// An agent, in the tree of operator `owner_uid`.
    Agent {
        /// Its id.
        id: u32,
        /// The uid of the operator whose tree it is in.
        owner_uid: u32,
    },
}

impl Holder {
    /// Whose quota its keys count against: its tree's operator's.
    pub fn owner_uid(self) -> u32 {
        match self {
            Holder::Operator { uid } => uid,
            Holder::Agent { owner_uid, .. } => owner_uid,
        }
    }

    /// Its space for `scope`.
    pub fn space(self, scope: Scope) -> Space {
        match (scope, self) {
            (Scope::Agent, Holder::Operator { uid }) => Space::Operator(uid),
            (Scope::Agent, Holder::Agent { id, .. }) => Space::Agent(id),
            (Scope::Global, _) => Space::Tree(self.owner_uid()),
        }
    }

    /// The spaces a lookup without a scope reads, in order: its own
    /// first, so a shared key never hides its own.
    pub fn spaces(self, scope: Option<Scope>) -> Vec<Space> {
        match scope {
            Some(scope) => vec![self.space(scope)],
            None => vec![self.space(Scope::Agent), self.space(Scope::Global)],
        }
    }
}

/// A namespace of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// An agent's own (`agent` scope): it ends with the agent.
    Agent(u32),
    /// An operator's own (`agent` scope), by uid: it lasts.
    Operator(u32),
    /// An operator's tree's (`global` scope), by the operator's uid.
    Tree(u32),
}

impl Space {
    /// The scope it is.
    pub fn scope(self) -> Scope {
        match self {
            Space::Agent(_) | Space::Operator(_) => Scope::Agent,
            Space::Tree(_) => Scope::Global,
        }
    }
}

/// The prefix of every agent's own space in the database.
pub const AGENT_SPACES: &str = "agent:";

impl fmt::Display for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Space::Agent(id) => write!(f, "{AGENT_SPACES}{id}"),
            Space::Operator(uid) => write!(f, "operator:{uid}"),
            Space::Tree(uid) => write!(f, "tree:{uid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_and_its_operator_share_the_tree_and_nothing_else() {
        let operator = Holder::Operator { uid: 1000 };
        let agent = Holder::Agent {
            id: 7,
            owner_uid: 1000,
        };
        let stranger = Holder::Agent {
            id: 8,
            owner_uid: 1001,
        };
        assert_eq!(operator.space(Scope::Global), agent.space(Scope::Global));
        assert_ne!(operator.space(Scope::Agent), agent.space(Scope::Agent));
        assert_ne!(stranger.space(Scope::Global), agent.space(Scope::Global));
        assert_eq!(
            agent.spaces(None),
            [Space::Agent(7), Space::Tree(1000)],
            "its own first"
        );
        assert_eq!(Space::Agent(7).to_string(), "agent:7");
        assert_eq!(Space::Operator(0).to_string(), "operator:0");
        assert_eq!(Space::Tree(0).to_string(), "tree:0");
    }
}
