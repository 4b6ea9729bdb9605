//! A server's pipes on the reactor: registered when it (re)starts, read a
//! chunk a turn into its client, and written as far as the pipe takes.

use std::io::{self, Read, Write};
use std::time::Instant;

use mio::unix::pipe;
use mio::{Interest, Token};

use super::{ending_of, Pipes, Servers, MAX_MESSAGE, READ_CHUNK};
use crate::address::Reply;
use crate::tools::mcp::client::{Era, McpClient, Transport};
use crate::tools::mcp::jsonrpc::LineReader;
use crate::tools::process::StartedServer;

impl Servers {
    /// A (re)started server's pipes: registered, and a new client speaks
    /// first.
    pub(super) fn adopt(
        &mut self,
        launched: StartedServer,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let index = launched.server;
        self.servers[index].awaiting_end = false;
        if self.servers[index].stopped {
            // Started just as the kernel began to stop: its pipes close
            // here, and its supervisor ends it.
            return;
        }
        // An incarnation whose end was never seen (something it started still holds
        // its output): its calls fail now, not never.
        if self.servers[index].client.is_some() {
            self.restart(
                index,
                "it was started again before its output closed".into(),
                replies,
            );
        }
        self.servers[index].incarnation = launched.incarnation;
        let stdin = pipe::Sender::from(launched.stdin);
        let mut stdout = pipe::Receiver::from(launched.stdout);
        let registered = stdin
            .set_nonblocking(true)
            .and_then(|()| stdout.set_nonblocking(true))
            .and_then(|()| {
                self.registry
                    .register(&mut stdout, self.stdout_token(index), Interest::READABLE)
            });
        let server = &mut self.servers[index];
        if let Err(err) = registered {
            log::error!("MCP server {}: cannot watch its pipes: {err}", server.name);
            self.restart(
                index,
                format!("its pipes cannot be watched: {err}"),
                replies,
            );
            return;
        }
        server.client = Some(if server.skip_probe {
            McpClient::new(&server.name, server.timeout, now)
        } else {
            McpClient::probing(&server.name, Transport::Stdio, server.timeout, now)
        });
        server.garbage = 0;
        server.pipes = Some(Pipes {
            stdin,
            stdout,
            reader: LineReader::new(MAX_MESSAGE),
            unsent: Vec::new(),
            watching_stdin: false,
        });
        self.flush(index);
    }

    pub(super) fn stdout_token(&self, index: usize) -> Token {
        Token(self.token_base + 2 * index)
    }

    pub(super) fn stdin_token(&self, index: usize) -> Token {
        Token(self.token_base + 2 * index + 1)
    }

    /// Reads what the server wrote, up to [`READ_CHUNK`] bytes a turn.
    pub(super) fn read(&mut self, index: usize, replies: &mut Vec<Reply>, now: Instant) {
        let mut messages = Vec::new();
        let mut closed = false;
        let token = self.stdout_token(index);
        let Some(pipes) = self.servers[index].pipes.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 16 << 10];
        let mut taken = 0;
        while taken < READ_CHUNK {
            match pipes.stdout.read(&mut chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    taken += n;
                    pipes.reader.push(&chunk[..n], &mut messages);
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
            let _ = self
                .registry
                .reregister(&mut pipes.stdout, token, Interest::READABLE);
        }
        let mut events = Vec::new();
        if let Some(client) = self.servers[index].client.as_mut() {
            for message in messages {
                client.on_message(message, now, &mut events);
            }
        }
        self.handle(index, events, replies);
        self.flush(index);
        if closed {
            let server = &mut self.servers[index];
            let probing = server.client.as_ref().map(McpClient::era) == Some(&Era::Probing);
            if probing && !server.skip_probe {
                log::info!(
                    "MCP server {} ended at server/discover; it is started again with the \
                     initialize handshake",
                    server.name
                );
                server.skip_probe = true;
            }
            let ending = ending_of(&self.servers[index]);
            let known = ending.is_some();
            let why = ending.unwrap_or_else(|| "it exited (its output closed)".to_owned());
            self.restart(index, why, replies);
            self.servers[index].awaiting_end = !known;
        }
    }

    /// Writes what the client has for the server's stdin, as far as the
    /// pipe takes it; watches for room when it does not.
    pub(super) fn flush(&mut self, index: usize) {
        if self.servers[index].remote.is_some() {
            return self.post(index);
        }
        let token = self.stdin_token(index);
        let server = &mut self.servers[index];
        let (Some(client), Some(pipes)) = (server.client.as_mut(), server.pipes.as_mut()) else {
            return;
        };
        pipes.unsent.extend(client.take_output());
        let mut written = 0;
        while written < pipes.unsent.len() {
            match pipes.stdin.write(&pipes.unsent[written..]) {
                Ok(n) => written += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock, or a closed pipe (the read side notices the end).
                Err(_) => break,
            }
        }
        pipes.unsent.drain(..written);
        let want = !pipes.unsent.is_empty();
        if want != pipes.watching_stdin {
            let watched = if want {
                self.registry
                    .register(&mut pipes.stdin, token, Interest::WRITABLE)
            } else {
                self.registry.deregister(&mut pipes.stdin)
            };
            if watched.is_ok() {
                pipes.watching_stdin = want;
            }
        }
    }
}
