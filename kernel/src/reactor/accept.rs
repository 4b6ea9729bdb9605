//! Admitting connections: accepting on the kernel socket, identifying the
//! peer (operators only: nothing inside a sandbox is one), and keeping
//! within the connection caps. Refusals get one error frame and are logged
//! at most once a second.

use std::io::{self, Write};
use std::time::Instant;

use agentos_proto::{encode_frame, ErrorCode, ErrorReply, Opcode};
use mio::net::UnixStream;
use mio::{Interest, Token};

use super::connection::Connection;
use super::{Deadline, Reactor, ACCEPT_RETRY};
use crate::address::{Adopted, Adoptee, ConnKey};
use crate::identity::{peer_cred, peer_groups, peer_pid_namespaces, Identity, PeerCred};
use crate::syscall::Caller;

impl Reactor {
    pub(super) fn accept_all(&mut self) {
        loop {
            let Some(listener) = self.socket.listener() else {
                return;
            };
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err)
                    if err.kind() == io::ErrorKind::Interrupted
                        || err.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(err) => {
                    // With edge-triggered readiness no new event comes for
                    // connections already waiting, so retry on a timer.
                    if !self.accept_retry_pending {
                        log::warn!(
                            "cannot accept: {err} ({} connections open); retrying every {:?}",
                            self.connections.len(),
                            ACCEPT_RETRY
                        );
                        self.accept_retry_pending = true;
                        self.timers
                            .schedule(Instant::now() + ACCEPT_RETRY, Deadline::AcceptRetry);
                    }
                    return;
                }
            }
        }
    }

    /// A new connection on the kernel socket: an operator, or refused.
    fn admit(&mut self, mut stream: UnixStream) {
        let peer = match peer_cred(&stream) {
            Ok(peer) => peer,
            Err(err) => {
                log::debug!("dropping a connection whose credentials cannot be read: {err}");
                return;
            }
        };
        // uid 0 in a sandbox's user namespace is the daemon's own uid out
        // here: whatever the credentials say, nothing inside a sandbox is
        // an operator. (Agents reach the kernel through their own sockets.)
        match peer_pid_namespaces(&stream, &peer) {
            Ok(Some(chain)) if self.kernel.is_inside_a_sandbox(&chain) => {
                if let Some(suppressed) = self.refusals.allow(Instant::now()) {
                    log::warn!(
                        "refusing pid {}: it lives in a sandbox, and this socket serves \
                         operators ({suppressed} more refusals not logged)",
                        peer.pid
                    );
                }
                self.kernel
                    .reactor_counts
                    .refused(ErrorCode::PermissionDenied.as_str());
                refuse(
                    &mut stream,
                    ErrorCode::PermissionDenied,
                    "this socket serves operators; an agent talks to the kernel through its \
                     own socket, $AGENTOS_SOCKET",
                );
                return;
            }
            Ok(_) => {}
            Err(err) => {
                log::debug!("dropping a connection whose peer is gone: {err}");
                return;
            }
        }
        let identity = match self
            .authority
            .identify(&peer, || peer_groups(&stream).unwrap_or_default())
        {
            Ok(identity) => identity,
            Err(reason) => {
                if let Some(suppressed) = self.refusals.allow(Instant::now()) {
                    log::warn!(
                        "refusing pid {} uid {}: {reason} ({suppressed} more refusals not logged)",
                        peer.pid,
                        peer.uid
                    );
                }
                self.kernel
                    .reactor_counts
                    .refused(ErrorCode::PermissionDenied.as_str());
                refuse(
                    &mut stream,
                    ErrorCode::PermissionDenied,
                    &reason.to_string(),
                );
                return;
            }
        };
        if self.has_room(&mut stream, &peer, identity) {
            self.install(stream, peer, identity);
        }
    }

    /// A connection the kernel made or accepted itself.
    pub(super) fn admit_adopted(&mut self, adopted: Adopted) {
        let Adopted { mut stream, peer } = adopted;
        let identity = match peer {
            Adoptee::Known(identity) => identity,
            Adoptee::Run(run) => self.authority.run_connection(run),
        };
        let Ok(peer) = peer_cred(&stream) else {
            return;
        };
        if self.has_room(&mut stream, &peer, identity) {
            self.install(stream, peer, identity);
        }
    }

    /// Whether another connection for `identity` fits; if not, tells the
    /// peer `busy`.
    fn has_room(&mut self, stream: &mut UnixStream, peer: &PeerCred, identity: Identity) -> bool {
        let Err(reason) = self.capacity.check(identity) else {
            return true;
        };
        if let Some(suppressed) = self.refusals.allow(Instant::now()) {
            log::warn!(
                "refusing a connection from pid {}: {reason} ({suppressed} more refusals not \
                 logged)",
                peer.pid,
            );
        }
        self.kernel.reactor_counts.refused(ErrorCode::Busy.as_str());
        refuse(stream, ErrorCode::Busy, &reason.to_string());
        false
    }

    fn install(&mut self, mut stream: UnixStream, peer: PeerCred, identity: Identity) {
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = self.connections.vacant_entry();
        let index = entry.key();
        if let Err(err) =
            self.poll
                .registry()
                .register(&mut stream, Token(index), Interest::READABLE)
        {
            log::error!("cannot register a new connection: {err}");
            return;
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
        entry.insert(Connection::new(stream, serial, caller, peer, &self.limits));
        if let Some(run) = caller.run() {
            self.run_connections
                .entry(run)
                .or_default()
                .push(ConnKey { index, serial });
        }
        self.capacity.opened(identity);
        self.schedule_sweep(Instant::now());
    }
}

/// Tells a connection it cannot be served, then drops it. Best effort: the
/// frame is small and the socket fresh, so it fits in the socket buffer.
fn refuse(stream: &mut UnixStream, code: ErrorCode, reason: &str) {
    let reply = ErrorReply::new(code, reason).to_json();
    let _ = stream.write(&encode_frame(Opcode::EXIT, 0, &reply));
}
