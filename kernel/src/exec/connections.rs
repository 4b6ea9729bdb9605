//! Runs' own connections to the kernel. Each run gets one end of a socket
//! pair, whose calls are the run's (a run principal, never its caller);
//! the kernel's end waits here until the reactor adopts it, tagged with
//! the run's number.

use std::io;
use std::os::fd::OwnedFd;

use crate::address::{Adopted, Adoptee};

/// The kernel's ends of runs' connections, until the reactor takes them.
#[derive(Debug, Default)]
pub struct RunConnections {
    adopted: Vec<Adopted>,
}

impl RunConnections {
    /// Run `number`'s connection: `first`, the one its child was given
    /// when it became ready (it has the other end already), or else a
    /// fresh pair whose other end is returned, to go with the run's order.
    pub fn for_run(&mut self, number: u64, first: Option<mio::net::UnixStream>) -> Option<OwnedFd> {
        if let Some(stream) = first {
            self.adopt(stream, number);
            return None;
        }
        match pair() {
            Ok((ours, theirs)) => {
                self.adopt(ours, number);
                Some(theirs)
            }
            Err(err) => {
                log::warn!("exec run: no kernel connection for it: {err}");
                None
            }
        }
    }

    fn adopt(&mut self, stream: mio::net::UnixStream, number: u64) {
        self.adopted.push(Adopted {
            stream,
            peer: Adoptee::Run(number),
        });
    }

    /// The connections made since the last call.
    pub fn take(&mut self) -> Vec<Adopted> {
        std::mem::take(&mut self.adopted)
    }

    /// Whether connections wait for the reactor.
    pub fn waiting(&self) -> bool {
        !self.adopted.is_empty()
    }
}

/// A connection for a run: the kernel's end, and the run's, which blocks
/// as any socket a program opens does.
pub fn pair() -> io::Result<(mio::net::UnixStream, OwnedFd)> {
    let (ours, theirs) = mio::net::UnixStream::pair()?;
    let theirs = std::os::unix::net::UnixStream::from(theirs);
    theirs.set_nonblocking(false)?;
    Ok((ours, OwnedFd::from(theirs)))
}
