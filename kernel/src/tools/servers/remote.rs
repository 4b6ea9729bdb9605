//! A remote server's connection: each incarnation is an [`HttpLink`]
//! (threads that POST the client's messages) and a probing client, wired
//! to the reactor by `Servers` (what the threads deliver comes back
//! through `Servers::on_wake`). A server that fails is connected again
//! after the same backoff a program's supervisor keeps, counted here since
//! no process is supervised.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tools::mcp::client::McpClient;
use crate::tools::mcp::http::{Endpoint, HttpLink};
use crate::tools::process::RESTART;

/// A remote server's connection, across its incarnations.
#[derive(Debug)]
pub(super) struct Remote {
    pub(super) endpoint: Arc<Endpoint>,
    /// The current incarnation's threads.
    pub(super) link: Option<HttpLink>,
    /// When it is connected again, after a failure.
    pub(super) retry_at: Option<Instant>,
    /// The delay before the current incarnation (`None`: there was none).
    delay: Option<Duration>,
    /// When the current incarnation began.
    pub(super) since: Instant,
}

impl Remote {
    pub(super) fn new(endpoint: Endpoint) -> Remote {
        Remote {
            endpoint: Arc::new(endpoint),
            link: None,
            retry_at: None,
            delay: None,
            since: Instant::now(),
        }
    }

    /// It stops for good: its link, to end its session, and the protocol
    /// version it was spoken to in.
    pub(super) fn retire(
        &mut self,
        client: Option<&McpClient>,
    ) -> Option<(HttpLink, Option<String>)> {
        self.retry_at = None;
        let version = client
            .and_then(McpClient::protocol_version)
            .map(str::to_owned);
        self.link.take().map(|link| (link, version))
    }

    /// It failed: its threads are let go, and it is connected again after
    /// the backoff.
    pub(super) fn failed(&mut self, stopped: bool) {
        self.link = None;
        if stopped {
            self.retry_at = None;
            return;
        }
        let delay = RESTART.delay(self.delay, self.since.elapsed());
        self.delay = Some(delay);
        self.retry_at = Some(Instant::now() + delay);
    }
}
