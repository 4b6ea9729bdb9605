//! What must hold before an agent runs, whether SPAWN starts it or a
//! restart starts an ended one again: the kernel is not shutting down,
//! there is room, its name is not a live agent's, and it has a socket.

use agentos_proto::{ErrorCode, ErrorReply};

use super::{Agents, Incarnation};
use crate::identity::Identity;
use crate::sandbox::runtime::{DoorKey, Sandboxes};

impl Agents {
    /// Refuses new work once shutdown has begun.
    pub(super) fn refuse_if_shutting_down(&self) -> Result<(), ErrorReply> {
        if self.shutting_down {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                "the kernel is shutting down",
            ));
        }
        Ok(())
    }

    /// Room for one more live agent, and `name` free among the live ones.
    pub(super) fn check_room_for(&self, name: &str) -> Result<(), ErrorReply> {
        let live = self.table.values().filter(|a| a.is_live()).count();
        if live >= self.max_agents {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("{live} agents are running, the configured maximum; kill one first"),
            ));
        }
        if let Some(existing) = self.table.values().find(|a| a.is_live() && a.name == name) {
            return Err(ErrorReply::new(
                ErrorCode::AlreadyExists,
                format!(
                    "agent {name:?} already exists (id {}, {}); kill it or choose another name",
                    existing.id,
                    existing.state.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// Agent `id`'s own socket: what it, and its children, connect to.
    pub(super) fn open_door(
        sandboxes: &mut impl Sandboxes<Incarnation>,
        id: u32,
    ) -> Result<DoorKey, ErrorReply> {
        sandboxes
            .open_door(&id.to_string(), Identity::Agent { id })
            .map_err(|err| {
                ErrorReply::new(
                    ErrorCode::Internal,
                    format!("cannot create the agent's socket: {err}"),
                )
            })
    }
}
