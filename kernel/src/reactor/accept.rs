//! Admitting connections: accepting on the kernel socket, identifying the
//! peer (operators only: nothing inside a sandbox is one), and keeping
//! within the connection caps. Refusals get one error frame and are logged
//! at most once a second.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use agentos_primitives::log_throttle::LogThrottle;
use agentos_proto::{encode_frame, ErrorCode, ErrorReply, Opcode};
use mio::net::{UnixListener, UnixStream};

use super::capacity::Capacity;
use crate::address::{Adopted, Adoptee};
use crate::identity::{
    peer_cgroups, peer_cred, peer_groups, peer_pid_namespaces, Authority, Identity, PeerCred,
};
use crate::kernel::{agent_calling, Kernel};

/// After accept fails (out of file descriptors), try again this soon.
const RETRY: Duration = Duration::from_millis(100);

/// The door of the kernel socket: who a peer is, whether it may come in,
/// and how many connections are in.
#[derive(Debug)]
pub struct Door {
    authority: Authority,
    capacity: Capacity,
    refusals: LogThrottle,
    /// Accepting failed and a retry is scheduled.
    retry_pending: bool,
}

/// A connection let in: its stream, its peer's credentials, and who it is.
#[derive(Debug)]
pub struct Entrant {
    /// The connection.
    pub stream: UnixStream,
    /// Its peer's credentials.
    pub peer: PeerCred,
    /// Its peer's supplementary groups when it connected.
    pub groups: Vec<u32>,
    /// Who it is.
    pub identity: Identity,
}

/// What one accept on the kernel socket came to.
#[derive(Debug)]
pub enum Accept {
    /// A connection to install.
    In(Entrant),
    /// A connection refused or dropped: accept the next.
    TurnedAway,
    /// No connection is waiting.
    Done,
    /// Accepting failed (out of file descriptors): with edge-triggered
    /// readiness no new event comes for connections already waiting, so
    /// accept again this much later.
    RetryAfter(Duration),
    /// Accepting failed, and a retry is already scheduled.
    RetryPending,
}

impl Door {
    /// A door that identifies peers with `authority` and admits within
    /// `capacity`.
    pub fn new(authority: Authority, capacity: Capacity) -> Door {
        Door {
            authority,
            capacity,
            // A client can trigger a refusal at will: the log must not
            // become its megaphone.
            refusals: LogThrottle::once_per(Duration::from_secs(1)),
            retry_pending: false,
        }
    }

    /// Connections in now, against the caps.
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// Accepts one connection waiting on `listener`, and says whether it
    /// comes in (`kernel` knows the sandboxes and counts refusals). An
    /// entrant counts against the caps from here on, until
    /// [`Door::left`].
    pub fn accept(&mut self, listener: &UnixListener, kernel: &mut Kernel) -> Accept {
        match listener.accept() {
            Ok((stream, _)) => match self.admit(stream, kernel) {
                Some(entrant) => Accept::In(entrant),
                None => Accept::TurnedAway,
            },
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Accept::Done,
            Err(err)
                if err.kind() == io::ErrorKind::Interrupted
                    || err.kind() == io::ErrorKind::ConnectionAborted =>
            {
                Accept::TurnedAway
            }
            Err(_) if self.retry_pending => Accept::RetryPending,
            Err(err) => {
                log::warn!(
                    "cannot accept: {err} ({} connections open); retrying every {RETRY:?}",
                    self.capacity.total(),
                );
                self.retry_pending = true;
                Accept::RetryAfter(RETRY)
            }
        }
    }

    /// The scheduled retry is due.
    pub fn retry_due(&mut self) {
        self.retry_pending = false;
    }

    /// A connection the kernel made or accepted itself, if it fits.
    pub fn adopt(&mut self, adopted: Adopted, kernel: &mut Kernel) -> Option<Entrant> {
        let Adopted { mut stream, peer } = adopted;
        let identity = match peer {
            Adoptee::Known(identity) => identity,
            Adoptee::Run(run) => self.authority.run_connection(run),
        };
        let peer = peer_cred(&stream).ok()?;
        let groups = peer_groups(&stream).unwrap_or_default();
        self.has_room(&mut stream, &peer, identity, kernel)
            .then_some(Entrant {
                stream,
                peer,
                groups,
                identity,
            })
    }

    /// An entrant was not installed after all, or its connection closed:
    /// its room is free again.
    pub fn left(&mut self, identity: Identity) {
        self.capacity.closed(identity);
    }

    /// A new connection on the kernel socket: an operator, or refused.
    fn admit(&mut self, mut stream: UnixStream, kernel: &mut Kernel) -> Option<Entrant> {
        let peer = match peer_cred(&stream) {
            Ok(peer) => peer,
            Err(err) => {
                log::info!("dropping a connection whose credentials cannot be read: {err}");
                return None;
            }
        };
        // uid 0 in a sandbox's user namespace is the daemon's own uid out
        // here: whatever the credentials say, nothing inside a sandbox is
        // an operator. (Agents reach the kernel through their own sockets.)
        match peer_pid_namespaces(&stream, &peer) {
            // (Its PID namespaces, its own first, then its ancestors'.)
            Ok(Some(chain)) if kernel.sandboxes.is_inside_a_sandbox(&chain) => {
                if let Some(suppressed) = self.refusals.allow(Instant::now()) {
                    log::warn!(
                        "refusing pid {}: it lives in a sandbox, and this socket serves \
                         operators ({suppressed} more refusals not logged)",
                        peer.pid
                    );
                }
                kernel
                    .reactor_counts
                    .refused(ErrorCode::PermissionDenied.as_str());
                refuse(
                    &mut stream,
                    ErrorCode::PermissionDenied,
                    "this socket serves operators; an agent talks to the kernel through its \
                     own socket, $AGENTOS_SOCKET",
                );
                return None;
            }
            Ok(_) => {}
            Err(err) => {
                log::info!("dropping a connection whose peer is gone: {err}");
                return None;
            }
        }
        let groups = peer_groups(&stream).unwrap_or_default();
        let identity = match self.authority.identify(&peer, || groups.clone()) {
            // An operator's process in a live agent's cgroup is that agent
            // (one spawned unsandboxed, calling on this socket): this only
            // narrows what the connection may do.
            Ok(Identity::Operator { .. })
                if let Some(id) = agent_calling(&kernel.agents, &kernel.sandboxes, || {
                    peer_cgroups(&stream, &peer).ok()
                }) =>
            {
                Identity::Agent { id }
            }
            Ok(identity) => identity,
            Err(reason) => {
                if let Some(suppressed) = self.refusals.allow(Instant::now()) {
                    log::warn!(
                        "refusing pid {} uid {}: {reason} ({suppressed} more refusals not logged)",
                        peer.pid,
                        peer.uid
                    );
                }
                kernel
                    .reactor_counts
                    .refused(ErrorCode::PermissionDenied.as_str());
                refuse(
                    &mut stream,
                    ErrorCode::PermissionDenied,
                    &reason.to_string(),
                );
                return None;
            }
        };
        self.has_room(&mut stream, &peer, identity, kernel)
            .then_some(Entrant {
                stream,
                peer,
                groups,
                identity,
            })
    }

    /// Whether another connection for `identity` fits, counting it if it
    /// does; if not, tells the peer `busy`.
    fn has_room(
        &mut self,
        stream: &mut UnixStream,
        peer: &PeerCred,
        identity: Identity,
        kernel: &mut Kernel,
    ) -> bool {
        let Err(reason) = self.capacity.check(identity) else {
            self.capacity.opened(identity);
            return true;
        };
        if let Some(suppressed) = self.refusals.allow(Instant::now()) {
            log::warn!(
                "refusing a connection from pid {}: {reason} ({suppressed} more refusals not \
                 logged)",
                peer.pid,
            );
        }
        kernel.reactor_counts.refused(ErrorCode::Busy.as_str());
        refuse(stream, ErrorCode::Busy, &reason.to_string());
        false
    }
}

/// Tells a connection it cannot be served, then drops it. Best effort: the
/// frame is small and the socket fresh, so it fits in the socket buffer.
fn refuse(stream: &mut UnixStream, code: ErrorCode, reason: &str) {
    let reply = ErrorReply::new(code, reason).to_json();
    let _ = stream.write(&encode_frame(Opcode::EXIT, 0, &reply));
}
