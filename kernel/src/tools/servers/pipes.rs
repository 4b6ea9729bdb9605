//! A server's pipes on the reactor: registered when it (re)starts, read a
//! chunk a turn into messages, and written as far as the pipe takes, with
//! the rest kept until it has room.

use std::io::{self, Read, Write};

use mio::unix::pipe;
use mio::{Interest, Registry, Token};

use crate::tools::mcp::jsonrpc::{Incoming, LineReader};
use crate::tools::mcp::MAX_MESSAGE;
use crate::tools::process::StartedServer;

/// Bytes read from a server per readiness event before others get a turn.
const READ_CHUNK: usize = 64 << 10;

/// The tokens of a server's pipes.
#[derive(Clone, Copy, Debug)]
pub struct Tokens {
    /// Its stdout's: readable.
    pub stdout: Token,
    /// Its stdin's: writable, while bytes wait for it.
    pub stdin: Token,
}

/// One incarnation's pipes.
#[derive(Debug)]
pub struct Pipes {
    stdin: pipe::Sender,
    stdout: pipe::Receiver,
    reader: LineReader,
    /// Bytes for its stdin the pipe has not taken yet.
    unsent: Vec<u8>,
    /// Whether stdin is registered for writability.
    watching_stdin: bool,
    tokens: Tokens,
}

/// What one read of a server's stdout brought.
#[derive(Debug)]
pub struct Received {
    /// The messages it completed.
    pub messages: Vec<Incoming>,
    /// Whether its output has closed (or failed).
    pub closed: bool,
}

impl Pipes {
    /// A started incarnation's pipes, non-blocking, its stdout watched.
    pub fn open(launched: StartedServer, registry: &Registry, tokens: Tokens) -> io::Result<Pipes> {
        let stdin = pipe::Sender::from(launched.stdin);
        let mut stdout = pipe::Receiver::from(launched.stdout);
        stdin.set_nonblocking(true)?;
        stdout.set_nonblocking(true)?;
        registry.register(&mut stdout, tokens.stdout, Interest::READABLE)?;
        Ok(Pipes {
            stdin,
            stdout,
            reader: LineReader::new(MAX_MESSAGE),
            unsent: Vec::new(),
            watching_stdin: false,
            tokens,
        })
    }

    /// Bytes waiting for the server's stdin.
    pub fn unsent(&self) -> usize {
        self.unsent.len()
    }

    /// Reads what the server wrote, up to [`READ_CHUNK`] bytes a turn.
    pub fn read(&mut self, registry: &Registry) -> Received {
        let mut messages = Vec::new();
        let mut closed = false;
        let mut chunk = [0u8; 16 << 10];
        let mut taken = 0;
        while taken < READ_CHUNK {
            match self.stdout.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    taken += n;
                    self.reader.push(&chunk[..n], &mut messages);
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        if taken >= READ_CHUNK {
            // More may be waiting: edge-triggered readiness will not say so
            // again, so the reactor is asked to come back.
            let _ = registry.reregister(&mut self.stdout, self.tokens.stdout, Interest::READABLE);
        }
        Received { messages, closed }
    }

    /// Writes `bytes`, after those still waiting, as far as the pipe takes
    /// them; watches for room when it does not.
    pub fn write(&mut self, bytes: Vec<u8>, registry: &Registry) {
        self.unsent.extend(bytes);
        let mut written = 0;
        while written < self.unsent.len() {
            match self.stdin.write(&self.unsent[written..]) {
                Ok(n) => written += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock, or a closed pipe (the read side notices the end).
                Err(_) => break,
            }
        }
        self.unsent.drain(..written);
        let want = !self.unsent.is_empty();
        if want != self.watching_stdin {
            let watched = if want {
                registry.register(&mut self.stdin, self.tokens.stdin, Interest::WRITABLE)
            } else {
                registry.deregister(&mut self.stdin)
            };
            if watched.is_ok() {
                self.watching_stdin = want;
            }
        }
    }

    /// Stops watching the pipes; they close when dropped.
    pub fn close(mut self, registry: &Registry) {
        let _ = registry.deregister(&mut self.stdout);
        if self.watching_stdin {
            let _ = registry.deregister(&mut self.stdin);
        }
    }
}
