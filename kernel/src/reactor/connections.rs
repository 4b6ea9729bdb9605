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
        if let Err(err) = registry.register(&mut stream, Token(index), Interest::READABLE) {
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
    pub fn key_at(&self, index: usize) -> Option<ConnKey> {
        self.slots.get(index).map(|conn| ConnKey {
            index,
            serial: conn.serial,
        })
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
