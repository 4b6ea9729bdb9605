//! How many connections each client of an HTTP face may hold at once.
//!
//! Every user of the machine can open connections to a loopback port;
//! without a bound per client, one user's idle connections use up the
//! server's descriptors and slow everyone else's requests. A client is
//! a local uid (the owner of the connection's other end), or, when its
//! end is not on this machine, its IP address.
//!
//! Connections through the kernel's egress proxy are the kernel's user's,
//! so a sandbox can fill that user's share. A connection that has carried
//! a request with the token is the user's own; one that has not is only
//! someone who can connect. So a client at its limit gets a new place by
//! closing its oldest connection that has shown no token, and is refused
//! only when every one of its connections has.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Whose connection it is, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    Uid(u32),
    Address(IpAddr),
}

/// The open connections of each client, up to `per_client`.
#[derive(Debug)]
pub struct ConnectionLimit {
    per_client: usize,
    next_id: AtomicU64,
    /// Each client's connections, oldest first.
    open: Mutex<HashMap<Client, Vec<Arc<Place>>>>,
}

/// One connection's place in its client's share.
#[derive(Debug)]
pub struct Place {
    id: u64,
    /// It has carried a request with the token.
    proven: AtomicBool,
    /// Cancelled when a newer connection of the client takes the place.
    evicted: CancellationToken,
}

impl Place {
    /// The connection has carried a request with the token: it is not
    /// closed for a newcomer.
    pub fn prove(&self) {
        self.proven.store(true, Ordering::Relaxed);
    }

    /// Resolves once a newer connection of the same client took this
    /// place; the connection is then to be closed.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await;
    }
}

/// A connection counted against its client until dropped.
#[derive(Debug)]
pub struct Held {
    limit: Arc<ConnectionLimit>,
    client: Client,
    place: Arc<Place>,
}

impl Held {
    pub fn place(&self) -> Arc<Place> {
        self.place.clone()
    }
}

impl ConnectionLimit {
    pub fn new(per_client: usize) -> Arc<ConnectionLimit> {
        Arc::new(ConnectionLimit {
            per_client,
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    /// A place for one more connection of `client`: a free one, or the
    /// place of its oldest connection that has not proven itself (which
    /// is told to close); `None` when every connection it holds has.
    pub fn hold(self: &Arc<Self>, client: Client) -> Option<Held> {
        let mut open = self.open();
        let places = open.entry(client).or_default();
        if places.len() >= self.per_client {
            let unproven = places
                .iter()
                .position(|place| !place.proven.load(Ordering::Relaxed))?;
            places.remove(unproven).evicted.cancel();
        }
        let place = Arc::new(Place {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            proven: AtomicBool::new(false),
            evicted: CancellationToken::new(),
        });
        places.push(place.clone());
        Some(Held {
            limit: self.clone(),
            client,
            place,
        })
    }

    fn open(&self) -> MutexGuard<'_, HashMap<Client, Vec<Arc<Place>>>> {
        // The map stays consistent whatever panicked while it was held:
        // every change is one push or one removal.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.limit.open();
        if let Some(places) = open.get_mut(&self.client) {
            // An evicted place is gone already.
            places.retain(|place| place.id != self.place.id);
            if places.is_empty() {
                open.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_count(limit: &ConnectionLimit, client: Client) -> usize {
        limit.open().get(&client).map_or(0, Vec::len)
    }

    #[test]
    fn a_client_holds_its_share_and_no_more_and_others_are_untouched() {
        let limit = ConnectionLimit::new(2);
        let flooder = Client::Uid(65534);
        let first = limit.hold(flooder).unwrap();
        let second = limit.hold(flooder).unwrap();
        first.place().prove();
        second.place().prove();
        assert!(limit.hold(flooder).is_none(), "both places proven: refused");
        assert!(limit.hold(Client::Uid(0)).is_some());
        drop(first);
        assert!(
            limit.hold(flooder).is_some(),
            "a closed connection frees its place"
        );
        assert_eq!(
            open_count(&limit, Client::Uid(0)),
            0,
            "none open, none counted"
        );
    }

    #[test]
    fn at_its_limit_a_clients_oldest_unproven_connection_makes_way() {
        let limit = ConnectionLimit::new(3);
        let user = Client::Uid(0);
        let proven = limit.hold(user).unwrap();
        proven.place().prove();
        let idle_old = limit.hold(user).unwrap();
        let idle_new = limit.hold(user).unwrap();
        let newcomer = limit.hold(user).expect("an unproven place is taken");
        assert!(idle_old.place().evicted.is_cancelled());
        assert!(!idle_new.place().evicted.is_cancelled());
        assert!(!proven.place().evicted.is_cancelled());
        assert_eq!(open_count(&limit, user), 3);
        // The evicted connection closing does not free another's place.
        drop(idle_old);
        assert_eq!(open_count(&limit, user), 3);
        drop((newcomer, idle_new, proven));
        assert_eq!(open_count(&limit, user), 0);
    }
}
