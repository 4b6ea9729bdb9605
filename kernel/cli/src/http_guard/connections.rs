//! How many connections each client of an HTTP face may hold at once.
//!
//! Every user of the machine can open connections to a loopback port;
//! without a bound per client, one user's idle connections use up the
//! server's descriptors and slow everyone else's requests. A client is
//! a local uid (the owner of the connection's other end), or, when its
//! end is not on this machine, its IP address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Whose connection it is, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    Uid(u32),
    Address(IpAddr),
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Uid(uid) => write!(f, "uid {uid}"),
            Client::Address(address) => write!(f, "{address}"),
        }
    }
}

/// The open connections of each client, up to `per_client`.
#[derive(Debug)]
pub struct ConnectionLimit {
    per_client: usize,
    open: Mutex<HashMap<Client, usize>>,
}

/// One connection counted against its client until dropped.
#[derive(Debug)]
pub struct Held {
    limit: Arc<ConnectionLimit>,
    client: Client,
}

impl ConnectionLimit {
    pub fn new(per_client: usize) -> Arc<ConnectionLimit> {
        Arc::new(ConnectionLimit {
            per_client,
            open: Mutex::new(HashMap::new()),
        })
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    /// Counts one more connection of `client`, unless it holds its share.
    pub fn hold(self: &Arc<Self>, client: Client) -> Option<Held> {
        let mut open = self.open();
        let count = open.entry(client).or_insert(0);
        if *count >= self.per_client {
            return None;
        }
        *count += 1;
        Some(Held {
            limit: self.clone(),
            client,
        })
    }

    fn open(&self) -> MutexGuard<'_, HashMap<Client, usize>> {
        // The map stays consistent whatever panicked while it was held:
        // every change is one increment or decrement.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.limit.open();
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_its_share_and_no_more_and_others_are_untouched() {
        let limit = ConnectionLimit::new(2);
        let flooder = Client::Uid(65534);
        let first = limit.hold(flooder).unwrap();
        let _second = limit.hold(flooder).unwrap();
        assert!(limit.hold(flooder).is_none());
        assert!(limit.hold(Client::Uid(0)).is_some());
        drop(first);
        assert!(
            limit.hold(flooder).is_some(),
            "a closed connection frees its place"
        );
        assert_eq!(
            limit.open().get(&Client::Uid(0)),
            None,
            "none open, none counted"
        );
    }
}
