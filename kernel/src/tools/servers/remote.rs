//! Remote servers on the reactor: each incarnation is an [`HttpLink`]
//! (threads that POST the client's messages) and a probing client; what
//! the threads deliver comes back through [`Servers::on_wake`]. A server
//! that fails is connected again after the same backoff a program's
//! supervisor keeps, counted here since no process is supervised.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Servers;
use crate::address::Reply;
use crate::tools::mcp::client::{Era, McpClient, Transport};
use crate::tools::mcp::http::{Delivered, Endpoint, HttpLink, Trouble};
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
    since: Instant,
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

impl Servers {
    /// A new incarnation of remote server `index`: its threads, and a
    /// client that probes at once.
    pub(super) fn connect(&mut self, index: usize, now: Instant) {
        let agent = self
            .agent
            .get_or_insert_with(crate::tools::mcp::http::agent);
        let server = &mut self.servers[index];
        let Some(remote) = server.remote.as_mut() else {
            return;
        };
        remote.retry_at = None;
        remote.since = now;
        server.incarnation += 1;
        let opened = HttpLink::open(
            agent,
            remote.endpoint.clone(),
            (index, server.incarnation),
            &self.delivered.0,
            &self.waker,
        );
        match opened {
            Ok(link) => remote.link = Some(link),
            Err(err) => {
                let why = format!("its HTTP threads cannot be started: {err}");
                log::error!("MCP server {}: {why}", server.name);
                server.error = Some(why);
                remote.failed(server.stopped);
                return;
            }
        }
        server.client = Some(McpClient::probing(
            &server.name,
            Transport::Http,
            server.timeout,
            now,
        ));
        server.garbage = 0;
        self.post(index);
    }

    /// Hands what the client has for remote server `index` to its threads.
    pub(super) fn post(&mut self, index: usize) {
        let server = &mut self.servers[index];
        let (Some(client), Some(link)) = (
            server.client.as_mut(),
            server.remote.as_ref().and_then(|r| r.link.as_ref()),
        ) else {
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

    /// What the remote servers' threads have delivered.
    pub(super) fn on_delivered(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        while let Ok(delivered) = self.delivered.1.try_recv() {
            let Delivered {
                server: index,
                incarnation,
                messages,
                trouble,
            } = delivered;
            let server = &mut self.servers[index];
            // An incarnation given up on, or a server stopped.
            if server.incarnation != incarnation || server.stopped {
                continue;
            }
            let mut events = Vec::new();
            if let Some(client) = server.client.as_mut() {
                for message in messages {
                    client.on_message(message, now, &mut events);
                }
                if let Some(Trouble::Lost { id, why }) = &trouble {
                    client.lost(*id, why, &mut events);
                }
            }
            self.handle(index, events, replies);
            if let Some(Trouble::Down(why)) = trouble {
                // Unless what it answered has already failed it.
                if self.servers[index].client.is_some() {
                    self.restart(index, why, replies);
                }
            }
            self.post(index);
        }
    }

    /// Remote servers whose backoff has passed are connected again.
    pub(super) fn reconnect_due(&mut self, now: Instant) {
        for index in 0..self.servers.len() {
            let server = &self.servers[index];
            let due = server
                .remote
                .as_ref()
                .and_then(|r| r.retry_at)
                .is_some_and(|at| at <= now);
            if due && !server.stopped {
                self.connect(index, now);
            }
        }
    }

    /// The earliest time a remote server is to be connected again.
    pub(super) fn next_reconnect(&self) -> Option<Instant> {
        self.servers
            .iter()
            .filter(|s| !s.stopped)
            .filter_map(|s| s.remote.as_ref()?.retry_at)
            .min()
    }
}
