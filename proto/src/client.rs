//! A small blocking client for the kernel socket.
//!
//! ```no_run
//! use agentos_proto::Client;
//! let mut client = Client::connect_default()?;
//! assert_eq!(client.noop(b"Hello!")?, b"Hello!");
//! println!("kernel {}", client.hello()?.kernel_version);
//! # Ok::<(), agentos_proto::ClientError>(())
//! ```

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::payload::{AgentInfo, HelloReply};
use crate::socket_path::resolve_socket_path;
use crate::{encode_frame_into, DecodeError, ErrorReply, FrameDecoder, Opcode, MAX_REPLY_BYTES};

/// What can go wrong talking to the kernel. Each message is complete in
/// itself (it includes the underlying cause), so none is exposed again as
/// `source()`.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error(
        "cannot connect to the AgentOS kernel at {}: {error}. Is agentosd running? \
         Start it with `sudo agentosd` (system socket) or `agentosd --socket {}`, \
         or point AGENTOS_SOCKET at a running kernel's socket",
        path.display(), path.display()
    )]
    Connect {
        /// The socket path tried.
        path: PathBuf,
        /// Why it failed.
        error: io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("i/o error talking to the kernel: {0}")]
    Io(io::Error),
    /// The kernel closed the connection before replying.
    #[error("the kernel closed the connection")]
    Closed,
    /// The reply stream is not valid protocol.
    #[error("malformed reply from the kernel: {0}")]
    Decode(DecodeError),
    /// A reply did not answer the request it should have.
    #[error("reply opcode {got} does not match request opcode {expected}")]
    UnexpectedOpcode {
        /// The request's opcode.
        expected: Opcode,
        /// The reply's opcode.
        got: Opcode,
    },
    /// The kernel answered with `success: false`.
    #[error("{0}")]
    Remote(ErrorReply),
    /// A JSON reply could not be read as the expected type.
    #[error("unexpected reply from the kernel: {0}")]
    Json(serde_json::Error),
}

impl From<io::Error> for ClientError {
    fn from(err: io::Error) -> Self {
        ClientError::Io(err)
    }
}

impl From<DecodeError> for ClientError {
    fn from(err: DecodeError) -> Self {
        ClientError::Decode(err)
    }
}

impl From<serde_json::Error> for ClientError {
    fn from(err: serde_json::Error) -> Self {
        ClientError::Json(err)
    }
}

/// One reply frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The caller's identity as the kernel sees it.
    pub agent_id: u32,
    /// The opcode answered.
    pub opcode: Opcode,
    /// The reply payload.
    pub payload: Vec<u8>,
}

/// A blocking connection to the kernel. Requests may be pipelined with
/// [`send`](Self::send) and [`recv`](Self::recv); replies come back in order.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    decoder: FrameDecoder,
    scratch: Vec<u8>,
    agent_id: Option<u32>,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(Client {
            stream,
            decoder: FrameDecoder::new(MAX_REPLY_BYTES),
            scratch: Vec::new(),
            agent_id: None,
        })
    }

    /// Connects to the socket resolved from the environment (see
    /// [`socket_path`](crate::socket_path)).
    pub fn connect_default() -> Result<Client, ClientError> {
        Client::connect(resolve_socket_path(None))
    }

    /// Bounds how long a read or write may block; `None` waits forever.
    pub fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        Ok(())
    }

    /// The identity the kernel gave this connection, once a reply has arrived.
    pub fn agent_id(&self) -> Option<u32> {
        self.agent_id
    }

    /// Sends one request without waiting for its reply.
    pub fn send(&mut self, opcode: Opcode, payload: &[u8]) -> Result<(), ClientError> {
        self.scratch.clear();
        encode_frame_into(
            &mut self.scratch,
            opcode,
            self.agent_id.unwrap_or(0),
            payload,
        );
        if let Err(err) = self.stream.write_all(&self.scratch) {
            // The kernel may have refused this connection (not an operator,
            // too many connections) and closed it before we wrote: its
            // reason is then waiting to be read, and says more than EPIPE.
            if matches!(
                err.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) {
                if let Some(refusal) = self.recv().ok().and_then(|r| error_reply(&r.payload)) {
                    return Err(ClientError::Remote(refusal));
                }
            }
            return Err(err.into());
        }
        Ok(())
    }

    /// Receives the next reply.
    pub fn recv(&mut self) -> Result<Reply, ClientError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                self.agent_id = Some(frame.header.agent_id);
                let reply = Reply {
                    agent_id: frame.header.agent_id,
                    opcode: frame.header.opcode,
                    payload: frame.payload.to_vec(),
                };
                self.decoder.shrink_if_idle();
                return Ok(reply);
            }
            let n = self.stream.read(self.decoder.read_buf())?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            self.decoder.advance(n);
        }
    }

    /// Sends a request and waits for its reply.
    pub fn call(&mut self, opcode: Opcode, payload: &[u8]) -> Result<Reply, ClientError> {
        self.send(opcode, payload)?;
        self.recv()
    }

    /// Sends a request and reads its JSON reply as `T`. A reply with
    /// `"success": false` becomes [`ClientError::Remote`].
    pub fn call_json<T: DeserializeOwned>(
        &mut self,
        opcode: Opcode,
        payload: &[u8],
    ) -> Result<T, ClientError> {
        let reply = self.call(opcode, payload)?;
        if let Some(err) = error_reply(&reply.payload) {
            return Err(ClientError::Remote(err));
        }
        let value: serde_json::Value = serde_json::from_slice(&reply.payload)?;
        if reply.opcode != opcode {
            return Err(ClientError::UnexpectedOpcode {
                expected: opcode,
                got: reply.opcode,
            });
        }
        Ok(serde_json::from_value(value)?)
    }

    /// NOOP: the kernel echoes `payload`.
    pub fn noop(&mut self, payload: &[u8]) -> Result<Vec<u8>, ClientError> {
        let reply = self.call(Opcode::NOOP, payload)?;
        Ok(reply.payload)
    }

    /// HELLO: protocol version, kernel version, identity and features.
    pub fn hello(&mut self) -> Result<HelloReply, ClientError> {
        self.call_json(Opcode::HELLO, b"")
    }

    /// LIST: every known agent.
    pub fn list(&mut self) -> Result<Vec<AgentInfo>, ClientError> {
        self.call_json(Opcode::LIST, b"")
    }

    /// EXIT: says goodbye and waits for the kernel to close the connection.
    pub fn exit(mut self) -> Result<(), ClientError> {
        let reply = self.call(Opcode::EXIT, b"")?;
        if reply.payload != b"goodbye" {
            return Err(ClientError::UnexpectedOpcode {
                expected: Opcode::EXIT,
                got: reply.opcode,
            });
        }
        Ok(())
    }
}

/// The payload as an error reply, if it is one (`"success": false`).
fn error_reply(payload: &[u8]) -> Option<ErrorReply> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    if value.get("success")? != &serde_json::Value::Bool(false) {
        return None;
    }
    serde_json::from_value(value).ok()
}
