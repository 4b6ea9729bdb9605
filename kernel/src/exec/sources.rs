//! EXEC's descriptors as the reactor sees them: each watched descriptor
//! has a token from EXEC's span, and the token says what it stands for
//! ([`ExecSource`]) — a host's channel, a run child's socket, or one of its
//! output pipes.

use std::io;
use std::os::fd::RawFd;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use slab::Slab;

use super::output::Stream;
use crate::fd;

/// How many tokens EXEC's sources may take, from its base: the first
/// half the run children's, the second the session processes'.
pub const TOKEN_SPAN: usize = 1 << 40;

/// Where the session processes' tokens start, from EXEC's base.
pub const PROCS_TOKENS: usize = TOKEN_SPAN / 2;

/// What one of EXEC's tokens stands for.
#[derive(Clone, Copy, Debug)]
pub enum ExecSource {
    /// A host's channel, by the host's key.
    Channel(usize),
    /// A run child's socket, by the child's key.
    Socket(usize),
    /// One of a run child's output pipes.
    Output(usize, Stream),
}

/// The descriptors EXEC watches, by token, each standing for an `S`
/// (the run children's are [`ExecSource`]s).
#[derive(Debug)]
pub struct Sources<S = ExecSource> {
    registry: Registry,
    base: usize,
    sources: Slab<S>,
}

impl<S: Copy> Sources<S> {
    /// None yet; tokens are handed out from `base`, and descriptors
    /// registered with `registry`.
    pub fn new(registry: &Registry, base: usize) -> io::Result<Sources<S>> {
        Ok(Sources {
            registry: registry.try_clone()?,
            base,
            sources: Slab::new(),
        })
    }

    /// What a token stands for, while it is watched.
    pub fn get(&self, token: Token) -> Option<S> {
        let key = token.0.checked_sub(self.base)?;
        self.sources.get(key).copied()
    }

    /// Watches `fd` for `interest`, as `source`.
    pub fn register(&mut self, fd: RawFd, source: S, interest: Interest) -> io::Result<Token> {
        let entry = self.sources.vacant_entry();
        let token = Token(self.base + entry.key());
        fd::watch(&self.registry, fd, token, interest)?;
        entry.insert(source);
        Ok(token)
    }

    /// Watches `fd`, registered already under `token`, for `interest`
    /// instead.
    pub fn reregister(&self, fd: RawFd, token: Token, interest: Interest) -> io::Result<()> {
        self.registry
            .reregister(&mut SourceFd(&fd), token, interest)
    }

    /// Stops watching `fd`, and its token goes.
    pub fn forget(&mut self, fd: RawFd, token: Token) {
        self.deregister(fd);
        self.release(token);
    }

    /// The token goes (its descriptor is closed, or deregistered apart).
    pub fn release(&mut self, token: Token) {
        if let Some(key) = token.0.checked_sub(self.base) {
            self.sources.try_remove(key);
        }
    }

    /// Stops watching `fd`, an open descriptor.
    pub fn deregister(&self, fd: RawFd) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
    }
}
