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

use crate::error::{ErrorCode, ErrorReply};
use crate::frame::{encode_frame_into, DecodeError, FrameDecoder, MAX_REPLY_BYTES};
use crate::opcode::Opcode;
use crate::payload::{
    AgentInfo, HelloReply, KillReply, KillRequest, PauseReply, PauseRequest, SpawnReply,
    SpawnRequest, ThinkReply, ThinkRequest,
};
use crate::socket_path::resolve_socket_path;

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
    /// An earlier exchange failed part-way (a timeout, a reset), so replies
    /// on this connection can no longer be matched to requests.
    #[error("the connection failed earlier and cannot be used; connect again")]
    Broken,
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
    /// Set by any failure in the middle of an exchange: after a timeout or
    /// a partial write, the next bytes read need not belong to the next
    /// reply, so the connection is not used again.
    broken: bool,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(Client::from_stream(stream))
    }

    /// Wraps an already connected stream (one inherited from a parent, or
    /// one end of a socket pair).
    pub fn from_stream(stream: UnixStream) -> Client {
        Client {
            stream,
            decoder: FrameDecoder::new(MAX_REPLY_BYTES),
            scratch: Vec::new(),
            agent_id: None,
            broken: false,
        }
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
        if self.broken {
            return Err(ClientError::Broken);
        }
        self.scratch.clear();
        encode_frame_into(
            &mut self.scratch,
            opcode,
            self.agent_id.unwrap_or(0),
            payload,
        );
        if let Err(err) = self.stream.write_all(&self.scratch) {
            self.broken = true;
            // The kernel may have refused this connection (not an operator,
            // too many connections) and closed it before we wrote, or
            // refused this request's payload as too large from its header
            // alone: its reason is then waiting to be read, and says more
            // than EPIPE.
            if matches!(
                err.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) {
                if let Some(refusal) = self.read_refusal() {
                    return Err(ClientError::Remote(refusal));
                }
            }
            return Err(err.into());
        }
        Ok(())
    }

    /// Receives the next reply.
    pub fn recv(&mut self) -> Result<Reply, ClientError> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        let reply = self.read_frame();
        if reply.is_err() {
            self.broken = true;
        }
        reply
    }

    fn read_frame(&mut self) -> Result<Reply, ClientError> {
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
            match self.stream.read(self.decoder.read_buf()) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.decoder.advance(n),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// The kernel's parting words on a connection it closed: an error reply
    /// under opcode EXIT, or `payload_too_large` (under the request's
    /// opcode). Anything else (such as a reply to an earlier pipelined
    /// request) is not a refusal.
    fn read_refusal(&mut self) -> Option<ErrorReply> {
        let reply = self.read_frame().ok()?;
        let refusal = error_reply(&reply.payload)?;
        if reply.opcode != Opcode::EXIT && refusal.code != ErrorCode::PayloadTooLarge {
            return None;
        }
        Some(refusal)
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

    /// SPAWN: starts an agent; returns once it runs.
    pub fn spawn(&mut self, request: &SpawnRequest) -> Result<SpawnReply, ClientError> {
        let payload = serde_json::to_vec(request)?;
        self.call_json(Opcode::SPAWN, &payload)
    }

    /// THINK: asks the kernel's LLM; returns once the model has answered.
    pub fn think(&mut self, request: &ThinkRequest) -> Result<ThinkReply, ClientError> {
        let payload = serde_json::to_vec(request)?;
        self.call_json(Opcode::THINK, &payload)
    }

    /// KILL: stops a live agent.
    pub fn kill(&mut self, request: &KillRequest) -> Result<KillReply, ClientError> {
        let payload = serde_json::to_vec(request)?;
        self.call_json(Opcode::KILL, &payload)
    }

    /// PAUSE: freezes a live agent; the reply comes once it stands still.
    pub fn pause(&mut self, request: &PauseRequest) -> Result<PauseReply, ClientError> {
        let payload = serde_json::to_vec(request)?;
        self.call_json(Opcode::PAUSE, &payload)
    }

    /// RESUME: lets a paused agent go on.
    pub fn resume(&mut self, request: &PauseRequest) -> Result<PauseReply, ClientError> {
        let payload = serde_json::to_vec(request)?;
        self.call_json(Opcode::RESUME, &payload)
    }

    /// EXIT: says goodbye and waits for the kernel to close the connection.
    pub fn exit(mut self) -> Result<(), ClientError> {
        let reply = self.call(Opcode::EXIT, b"")?;
        if let Some(err) = error_reply(&reply.payload) {
            return Err(ClientError::Remote(err));
        }
        if reply.opcode != Opcode::EXIT || reply.payload != b"goodbye" {
            return Err(ClientError::UnexpectedOpcode {
                expected: Opcode::EXIT,
                got: reply.opcode,
            });
        }
        match self.read_frame() {
            Err(ClientError::Closed) => Ok(()),
            Err(ClientError::Io(err)) if err.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            Err(err) => Err(err),
            Ok(extra) => Err(ClientError::UnexpectedOpcode {
                expected: Opcode::EXIT,
                got: extra.opcode,
            }),
        }
    }
}

/// The payload as an error reply, if it is one: any JSON object with
/// `"success": false`, whatever else it lacks.
fn error_reply(payload: &[u8]) -> Option<ErrorReply> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    if value.get("success")? != &serde_json::Value::Bool(false) {
        return None;
    }
    let code = value
        .get("code")
        .and_then(|code| serde_json::from_value(code.clone()).ok())
        .unwrap_or(ErrorCode::Other);
    let error = value
        .get("error")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("the kernel reported a failure without a message");
    Some(ErrorReply::new(code, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_frame;

    #[test]
    fn a_timed_out_exchange_breaks_the_connection_for_good() {
        let (client_end, mut kernel_end) = UnixStream::pair().unwrap();
        let mut client = Client::from_stream(client_end);
        client.set_timeout(Some(Duration::from_millis(50))).unwrap();
        assert!(matches!(client.hello(), Err(ClientError::Io(_))));
        // The late HELLO reply must never be taken for the NOOP's.
        kernel_end
            .write_all(&encode_frame(Opcode::HELLO, 1, b"{}"))
            .unwrap();
        assert!(matches!(client.noop(b"x"), Err(ClientError::Broken)));
    }

    #[test]
    fn a_payload_refused_from_its_header_is_the_kernels_reason_not_epipe() {
        let (client_end, mut kernel_end) = UnixStream::pair().unwrap();
        let mut client = Client::from_stream(client_end);
        // The kernel reads the header only, answers and closes, as it does
        // for a payload over max_request_bytes.
        let kernel = std::thread::spawn(move || {
            let mut header = [0u8; crate::frame::HEADER_LEN];
            kernel_end.read_exact(&mut header).unwrap();
            kernel_end
                .write_all(&encode_frame(
                    Opcode::EXEC,
                    1,
                    br#"{"success":false,"code":"payload_too_large","error":"too big"}"#,
                ))
                .unwrap();
        });
        match client.call(Opcode::EXEC, &vec![b'#'; 8 << 20]) {
            Err(ClientError::Remote(err)) => {
                assert_eq!(err.code, ErrorCode::PayloadTooLarge);
                assert_eq!(err.error, "too big");
            }
            other => panic!("expected the kernel's refusal, got {other:?}"),
        }
        kernel.join().unwrap();
    }

    #[test]
    fn any_success_false_is_a_remote_error() {
        let (client_end, mut kernel_end) = UnixStream::pair().unwrap();
        let mut client = Client::from_stream(client_end);
        kernel_end
            .write_all(&encode_frame(
                Opcode::HELLO,
                1,
                br#"{"success":false,"code":"brand_new"}"#,
            ))
            .unwrap();
        match client.hello() {
            Err(ClientError::Remote(err)) => assert_eq!(err.code, ErrorCode::Other),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exit_waits_for_the_close() {
        let (client_end, mut kernel_end) = UnixStream::pair().unwrap();
        let client = Client::from_stream(client_end);
        let kernel = std::thread::spawn(move || {
            let mut header = [0u8; crate::frame::HEADER_LEN];
            kernel_end.read_exact(&mut header).unwrap();
            kernel_end
                .write_all(&encode_frame(Opcode::EXIT, 1, b"goodbye"))
                .unwrap();
        });
        client.exit().unwrap();
        kernel.join().unwrap();
    }
}
