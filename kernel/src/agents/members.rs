//! What names and mailboxes (`crate::messages`) need to know of an
//! agent: whose tree it is in, its family and whether it may message its
//! whole tree.

use super::record::Agent;

/// An agent that has not ended for good, as messaging sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// Its id.
    pub id: u32,
    /// Its SPAWN name, which is reserved for it in its tree.
    pub name: &'a str,
    /// The agent that spawned it, if an agent did.
    pub parent: Option<u32>,
    /// The uid of the operator whose tree it is in.
    pub owner_uid: u32,
    /// Whether it may message every agent of its tree (`permissions.ipc`).
    pub ipc: bool,
}

impl<'a> Member<'a> {
    /// `agent` as messaging sees it.
    pub(super) fn of(agent: &'a Agent) -> Member<'a> {
        Member {
            id: agent.id,
            name: &agent.name,
            parent: agent.parent,
            owner_uid: agent.owner_uid,
            ipc: agent.permissions.ipc,
        }
    }
}
