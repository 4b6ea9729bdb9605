//! A remote server's connection: each incarnation is an [`HttpLink`]
//! (threads that POST the client's messages) and a probing client, wired
//! to the reactor by `Servers` (what the threads deliver comes back
//! through `Servers::on_wake`). A server that fails is connected again
//! after the same backoff a program's supervisor keeps, counted here since
//! no process is supervised.

use std::io;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;

use crate::tools::mcp::client::{Era, McpClient};
use crate::tools::mcp::http::{Delivered, HttpLink, ServerLocation};
use crate::tools::process::RESTART;

/// A remote server's connection, across its incarnations.
#[derive(Debug)]
pub(super) struct Remote {
    endpoint: Arc<ServerLocation>,
    /// The current incarnation's threads.
    link: Option<HttpLink>,
    /// When it is connected again, after a failure.
    pub(super) retry_at: Option<Instant>,
    /// The delay before the current incarnation (`None`: there was none).
    delay: Option<Duration>,
    /// When the current incarnation began.
    since: Instant,
}

impl Remote {
    pub(super) fn new(endpoint: ServerLocation) -> Remote {
        Remote {
            endpoint: Arc::new(endpoint),
            link: None,
            retry_at: None,
            delay: None,
            since: Instant::now(),
        }
    }

    /// Starts the threads of a new incarnation, `(server, incarnation)`;
    /// what they deliver goes to `delivered`, and `waker` wakes the
    /// reactor.
    pub(super) fn open(
        &mut self,
        agent: &ureq::Agent,
        incarnation: (usize, u64),
        delivered: &Sender<Delivered>,
        waker: &Arc<Waker>,
        now: Instant,
    ) -> io::Result<()> {
        self.retry_at = None;
        self.since = now;
        let link = HttpLink::open(agent, self.endpoint.clone(), incarnation, delivered, waker)?;
        self.link = Some(link);
        Ok(())
    }

    /// Hands what `client` has for the server to the threads.
    pub(super) fn post(&self, client: &mut McpClient) {
        let Some(link) = &self.link else {
            return;
        };
        // Over HTTP, 2026-07-28 cancels a request by closing its stream and
        // takes no message of the client's but requests.
        let modern = client.era() == &Era::Modern;
        // Requests go out side by side, each on a thread of its own; a
        // notification or response goes out before the request that
        // followed it, on the same thread (a server of the earlier era may
        // refuse `tools/list` until `notifications/initialized` is in).
        let mut sequence = Vec::new();
        for message in client.take_messages() {
            let is_request = message.request.is_some();
            if modern && !is_request {
                continue;
            }
            sequence.push(message);
            if is_request {
                link.post(std::mem::take(&mut sequence));
            }
        }
        if !sequence.is_empty() {
            link.post(sequence);
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
