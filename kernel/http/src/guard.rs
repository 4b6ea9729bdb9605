//! Who may hold a connection, and whose requests are served: a place per
//! client up to its share and, with a token the server made, its own
//! user only.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::connections::{Client, ConnectionLimit, Held};
use crate::peer::{LookupError, SocketTable};

/// A connection's two ends: the client's, and the server's own.
#[derive(Debug, Clone, Copy)]
pub struct Ends {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// The connections of every client, and whose requests are served.
#[derive(Debug)]
pub struct Guard {
    peers: SocketTable,
    limit: Arc<ConnectionLimit>,
    only_uid: Option<u32>,
}

impl Guard {
    /// A guard for the server listening at `listener`, each client
    /// holding up to `per_client` connections, serving `only_uid`'s
    /// requests if it names one.
    pub fn new(listener: SocketAddr, per_client: usize, only_uid: Option<u32>) -> Guard {
        Guard {
            peers: SocketTable::for_listener(listener),
            limit: ConnectionLimit::new(per_client),
            only_uid,
        }
    }

    /// How many connections each client may hold.
    pub fn per_client(&self) -> usize {
        self.limit.per_client()
    }

    /// A place for the connection, unless its client holds its share.
    pub async fn admit(&self, ends: Ends) -> Option<Held> {
        let client = match self.owner(ends).await {
            Ok(uid) => Client::Uid(uid),
            // Not on this machine, or gone already: counted by address.
            Err(_) => Client::Address(ends.peer.ip()),
        };
        self.limit.hold(client)
    }

    /// Why a request on the connection is refused, unless the server
    /// serves any holder of its token, or its own user holds the client's
    /// end of the connection now.
    pub async fn refuse_other_users(&self, ends: Ends) -> Option<String> {
        let uid = self.only_uid?;
        match self.owner(ends).await {
            Ok(owner) if owner == uid => None,
            Ok(owner) => Some(format!(
                "Forbidden: this server's token is uid {uid}'s own, and this connection is uid \
                 {owner}'s; start it with --token-file to share it"
            )),
            Err(err) => Some(format!("Forbidden: {err}")),
        }
    }

    /// The uid at the client's end of the connection, asked of the
    /// kernel now (a blocking read, so off the runtime's thread).
    async fn owner(&self, ends: Ends) -> Result<u32, LookupFailed> {
        let peers = self.peers;
        let lookup = move || peers.owner(ends.peer, ends.local);
        Ok(tokio::task::spawn_blocking(lookup).await??)
    }
}

/// Why the owner of a connection is not known.
#[derive(Debug, thiserror::Error)]
enum LookupFailed {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("looking up the connection's owner: {0}")]
    Task(#[from] tokio::task::JoinError),
}
