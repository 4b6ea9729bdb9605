//! The open connections, by slot: each under a key that tells it from the
//! connections its slot held before, and those of each EXEC run in
//! progress (its own, and any copy its code made of it) kept together, as
//! they close when the run ends.

use std::collections::HashMap;

use mio::{Interest, Registry, Token};
use slab::Slab;

use super::accept::Entrant;
use super::connection::{Connection, ConnectionLimits};
use crate::address::ConnKey;
use crate::syscall::Caller;

/// The open connections.
#[derive(Debug, Default)]
pub struct Connections {
    slots: Slab<Connection>,
    /// The open connections of each EXEC run in progress.
    by_run: HashMap<u64, Vec<ConnKey>>,
    next_serial: u64,
}

/// The bits of a connection's token that hold its slot; those above, up
/// to the kernel's own tokens (from 2^40), hold the low bits of its serial.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;
const SERIAL_MASK: usize = (1 << 16) - 1;

/// The token connection `key` is registered under: its slot and serial,
/// so that an event for a connection that closed is never taken for the
/// one that took its slot next.
pub fn token_of(key: ConnKey) -> Token {
    Token(key.index | ((key.serial as usize & SERIAL_MASK) << SLOT_BITS))
}

impl Connections {
    /// Registers `entrant`'s stream with `registry` under its slot and
    /// keeps it; its key, or `None` if it cannot be registered (logged).
    pub fn install(
        &mut self,
        entrant: Entrant,
        registry: &Registry,
        limits: &ConnectionLimits,
    ) -> Option<ConnKey> {
        let Entrant {
            mut stream,
            peer,
            groups,
            identity,
        } = entrant;
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.slots.vacant_entry();
        let index = entry.key();
        if index > SLOT_MASK {
            log::error!("cannot register a new connection: {index} slots are in use");
            return None;
        }
        let key = ConnKey { index, serial };
        if let Err(err) = registry.register(&mut stream, token_of(key), Interest::READABLE) {
            log::error!("cannot register a new connection: {err}");
            return None;
        }
        log::debug!(
            "conn {serial}: accepted pid {} uid {} gid {} as {identity:?}",
            peer.pid,
            peer.uid,
            peer.gid,
        );
        let caller = Caller {
            identity,
            uid: peer.uid,
        };
        entry.insert(Connection::new(
            stream,
            serial,
            caller,
            (peer, groups),
            limits,
        ));
        let key = ConnKey { index, serial };
        if let Some(run) = caller.run() {
            self.by_run.entry(run).or_default().push(key);
        }
        Some(key)
    }

    /// The connection `key` names, if it is still open.
    pub fn get_mut(&mut self, key: ConnKey) -> Option<&mut Connection> {
        self.slots
            .get_mut(key.index)
            .filter(|conn| conn.serial == key.serial)
    }

    /// The key of the connection open in slot `index`, if one is.
    /// The open connection an event's `token` is for: `None` once that
    /// connection has closed, even when a newer one took its slot in the
    /// same turn of the event loop (the event is the old one's).
    pub fn key_of(&self, token: Token) -> Option<ConnKey> {
        let index = token.0 & SLOT_MASK;
        let conn = self.slots.get(index)?;
        let key = ConnKey {
            index,
            serial: conn.serial,
        };
        (token_of(key) == token).then_some(key)
    }

    /// Takes the connection `key` names out, if it is still open.
    pub fn remove(&mut self, key: ConnKey) -> Option<Connection> {
        self.get_mut(key)?;
        let conn = self.slots.remove(key.index);
        if let Some(run) = conn.caller.run() {
            if let Some(keys) = self.by_run.get_mut(&run) {
                keys.retain(|k| *k != key);
                if keys.is_empty() {
                    self.by_run.remove(&run);
                }
            }
        }
        Some(conn)
    }

    /// The connections still open of EXEC run `run`, which is over (closing
    /// them is the caller's).
    pub fn of_ended_run(&mut self, run: u64) -> Vec<ConnKey> {
        self.by_run.remove(&run).unwrap_or_default()
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every open connection, with its key.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ConnKey, &mut Connection)> {
        self.slots.iter_mut().map(|(index, conn)| {
            let key = ConnKey {
                index,
                serial: conn.serial,
            };
            (key, conn)
        })
    }

    /// With none open, gives back the memory of their slots: they are the
    /// last of a crowd.
    pub fn shrink_if_empty(&mut self) {
        if self.slots.is_empty() {
            self.slots.shrink_to_fit();
        }
    }

    /// Drops every connection.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.by_run.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_taken_by_a_newer_connection_has_another_token() {
        let old = ConnKey {
            index: 3,
            serial: 7,
        };
        let new = ConnKey {
            index: 3,
            serial: 8,
        };
        assert_ne!(token_of(old), token_of(new));
        assert_eq!(token_of(new).0 & SLOT_MASK, 3);
        // Below the kernel's own tokens, whatever the serial.
        let last = ConnKey {
            index: SLOT_MASK,
            serial: u64::MAX,
        };
        assert!(token_of(last).0 < 1 << 40);
    }
}
