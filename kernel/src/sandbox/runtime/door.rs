//! A door: the socket one sandboxed caller (an agent) reaches the kernel
//! through. It exists only for that caller: bound into its sandbox at the
//! fixed path every sandbox uses, invisible to everyone else (its
//! directory on the host is 0700). So a connection arriving here comes
//! from that caller, whatever header it sends — the door is the identity,
//! checked against the peer's pid namespace on top.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use mio::net::UnixListener;
use mio::Token;

use crate::address::{Adopted, Adoptee, Outbox};
use crate::identity::{peer_cred, peer_pid_namespaces, Identity};

/// A listening socket for one caller; removed from disk when dropped.
#[derive(Debug)]
pub struct Door {
    /// The listener (registered with the reactor by the runtime).
    pub listener: UnixListener,
    path: PathBuf,
}

impl Door {
    /// Binds `<dir>/<name>.sock`, replacing a leftover file of that name.
    pub fn open(dir: &Path, name: &str) -> io::Result<Door> {
        let path = dir.join(format!("{name}.sock"));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let listener = UnixListener::bind(&path)?;
        // The workload runs as another user inside the sandbox; the 0700
        // directory is what keeps everyone else out on the host.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666))?;
        Ok(Door { listener, path })
    }

    /// Where the socket is on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// An open door and who comes through it.
#[derive(Debug)]
pub struct DoorEntry {
    /// The socket.
    pub door: Door,
    /// Its listener's token.
    pub token: Token,
    /// Who comes through it.
    pub identity: Identity,
    /// The pid namespace its callers must live in (set at each claim).
    pub expected: Option<u64>,
}

impl DoorEntry {
    /// Accepts what is waiting: connections from inside the sandbox the
    /// door serves are handed over as the door's identity, others refused.
    pub fn accept_all(&self, out: &mut Outbox) {
        let entry = self;
        loop {
            match entry.door.listener.accept() {
                Ok((stream, _)) => {
                    if let Some(expected) = entry.expected {
                        let inside = peer_cred(&stream)
                            .and_then(|peer| peer_pid_namespaces(&stream, &peer))
                            .ok()
                            .flatten()
                            .is_some_and(|chain| chain.contains(&expected));
                        if !inside {
                            log::warn!(
                                "{:?}: refusing a connection on its socket from outside its \
                                 sandbox",
                                entry.identity
                            );
                            continue;
                        }
                    }
                    out.adopted.push(Adopted {
                        stream,
                        peer: Adoptee::Known(entry.identity),
                    });
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    log::warn!("{:?}: accept failed: {err}", entry.identity);
                    return;
                }
            }
        }
    }
}
