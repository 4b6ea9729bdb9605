//! What operators' connections kept after lowering themselves with
//! SET_PERMS. An operator is every connection of its uid, so lowering one
//! connection holds for that connection only, until it closes: a client
//! drops what it does not need before it runs code it does not trust.

use std::collections::HashMap;

use agentos_proto::payload::Permissions;

use crate::address::ReplyTo;

/// Lowered operator connections, by connection serial.
#[derive(Debug, Default)]
pub struct LoweredConnections {
    kept: HashMap<u64, Permissions>,
}

impl LoweredConnections {
    /// What connection `serial` kept, if it lowered itself.
    pub fn get(&self, serial: u64) -> Option<&Permissions> {
        self.kept.get(&serial)
    }

    /// What the connection a reply goes to kept, if it lowered itself
    /// (none for a reply that goes to no connection: a task's).
    pub fn of(&self, reply_to: ReplyTo) -> Option<&Permissions> {
        reply_to.connection().and_then(|serial| self.get(serial))
    }

    /// Connection `serial` keeps only `permissions` from now on.
    pub fn set(&mut self, serial: u64, permissions: Permissions) {
        self.kept.insert(serial, permissions);
    }

    /// Connection `serial` closed.
    pub fn connection_closed(&mut self, serial: u64) {
        self.kept.remove(&serial);
    }
}
