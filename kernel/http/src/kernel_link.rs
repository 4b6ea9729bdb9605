//! A face's way to agentosd: one protocol connection per call, driven on
//! the face's own runtime thread.
//!
//! A connection per call keeps calls independent (a slow EXEC does not
//! hold up a LIST) and costs a socket connect, which is cheap next to any
//! kernel operation. EXEC sessions belong to the caller's principal, not
//! to a connection, so they last across calls. The exchange is
//! non-blocking I/O on the runtime, not a blocking call on a pool thread:
//! the kernel's reply wakes the thread that answers the client, with no
//! hop between threads on the way out or back.
//!
//! A link made [`KernelLink::for_delegate`] narrows each of its
//! connections to that delegate principal (DELEGATE) before the call, in
//! the same write: whatever the call creates is the delegate's, and
//! another delegate's calls find none of it.
//!
//! A call's connection closes when the call ends or is given up: the
//! kernel ends a closed connection's runs, so a cancelled `exec` stops in
//! the kernel too.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_proto::payload::{DelegateName, DelegateReply, DelegateRequest};
use agentos_proto::{
    encode_frame, Client, ClientError, ErrorCode, ErrorReply, FrameDecoder, Opcode, MAX_REPLY_BYTES,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a quick request (LIST, SPAWN, KILL, HELLO) may take before
/// the call fails: these answer at once unless the kernel is stuck.
const QUICK_REPLY_LIMIT: Duration = Duration::from_secs(30);

/// Why a kernel request has no reply to use.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Nothing answered at the socket: the message names the path tried
    /// and how the face is given another, since the model or person
    /// reading it can fix only what it names.
    #[error("cannot connect to the AgentOS kernel at {}: {error}. {hint}", socket.display())]
    Unreachable {
        /// The socket path tried.
        socket: PathBuf,
        /// Why the connect failed.
        error: io::Error,
        /// How the face is pointed at another socket.
        hint: &'static str,
    },
    /// The kernel refused: its message, and its code to tell refusals
    /// apart by.
    #[error("{0}")]
    Refused(ErrorReply),
    /// The exchange with the kernel failed once connected.
    #[error(transparent)]
    Exchange(ClientError),
    /// A quick request had no reply within this long.
    #[error("the kernel did not answer within {} s", .0.as_secs())]
    NoReply(Duration),
    /// The client cancelled the call first.
    #[error("the call was cancelled")]
    Cancelled,
    /// The reply is not JSON.
    #[error("malformed reply from the kernel: {0}")]
    Malformed(serde_json::Error),
    /// The reply is JSON, but not what the request answers with.
    #[error("unexpected reply from the kernel: {0}")]
    Unexpected(serde_json::Error),
    /// The request could not be written as JSON.
    #[error("{0}")]
    Unwritable(serde_json::Error),
}

impl KernelError {
    /// The kernel's code, if this is its refusal; None for a failure that
    /// is not one, such as not reaching the kernel.
    pub fn refusal_code(&self) -> Option<ErrorCode> {
        match self {
            KernelError::Refused(reply) => Some(reply.code),
            _ => None,
        }
    }
}

impl From<ClientError> for KernelError {
    fn from(err: ClientError) -> KernelError {
        match err {
            ClientError::Remote(reply) => KernelError::Refused(reply),
            err => KernelError::Exchange(err),
        }
    }
}

/// How long the server waits for a kernel reply.
#[derive(Debug, Clone, Copy)]
pub enum Wait {
    /// At most [`QUICK_REPLY_LIMIT`].
    Quick,
    /// As long as the kernel takes: the kernel enforces the operation's
    /// own limit (an EXEC run's timeout, a THINK's model deadline), and a
    /// shorter limit here would cut a run that is still within its own.
    AsLongAsTheKernel,
}

/// Where the kernel listens, and whom the face's calls speak for.
#[derive(Debug, Clone)]
pub struct KernelLink {
    socket: PathBuf,
    /// Said after "cannot connect to the AgentOS kernel at PATH": how
    /// this face is given another socket.
    hint: &'static str,
    /// Each connection narrows itself to this delegate first.
    delegate: Option<DelegateName>,
}

impl KernelLink {
    /// A link to the kernel at `socket`, speaking for the face's own user;
    /// `hint` says how the face is pointed at another socket.
    pub fn new(socket: PathBuf, hint: &'static str) -> KernelLink {
        KernelLink {
            socket,
            hint,
            delegate: None,
        }
    }

    /// The same kernel, each call narrowed to `delegate`.
    pub fn for_delegate(&self, delegate: DelegateName) -> KernelLink {
        KernelLink {
            delegate: Some(delegate),
            ..self.clone()
        }
    }

    /// The socket path every request connects to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request and returns the kernel's reply, read as `R`. A
    /// refusal is an `Err` carrying the kernel's own message and code, as
    /// is failing to reach the kernel at all.
    pub async fn request<R: DeserializeOwned>(
        &self,
        opcode: Opcode,
        body: &impl Serialize,
        wait: Wait,
    ) -> Result<R, KernelError> {
        self.request_until(opcode, body, wait, std::future::pending())
            .await
    }

    /// As [`KernelLink::request`], unless `cancelled` resolves first: then
    /// the call fails at once. Either way, once this future ends or is
    /// dropped the request's connection is closed, and the kernel ends the
    /// work that connection asked for (a closed connection's EXEC runs are
    /// killed, its queued THINKs dropped): a call the client gave up on
    /// leaves nothing running.
    pub async fn request_until<R: DeserializeOwned>(
        &self,
        opcode: Opcode,
        body: &impl Serialize,
        wait: Wait,
        cancelled: impl Future<Output = ()>,
    ) -> Result<R, KernelError> {
        let payload = serde_json::to_vec(body).map_err(KernelError::Unwritable)?;
        let exchange = self.exchange(opcode, &payload);
        let replied = async {
            match wait {
                Wait::Quick => tokio::time::timeout(QUICK_REPLY_LIMIT, exchange)
                    .await
                    .unwrap_or(Err(KernelError::NoReply(QUICK_REPLY_LIMIT))),
                Wait::AsLongAsTheKernel => exchange.await,
            }
        };
        // Whichever ends first drops the other; a dropped exchange closes
        // its connection.
        tokio::select! {
            reply = replied => reply_of(&reply?),
            () = cancelled => Err(KernelError::Cancelled),
        }
    }

    /// As [`KernelLink::request`], blocking this thread: for where no
    /// future can run, such as a `Drop`.
    pub fn request_blocking<R: DeserializeOwned>(
        &self,
        opcode: Opcode,
        body: &impl Serialize,
        wait: Wait,
    ) -> Result<R, KernelError> {
        let payload = serde_json::to_vec(body).map_err(KernelError::Unwritable)?;
        let mut client = Client::connect(&self.socket).map_err(|err| self.unreachable(err))?;
        let limit = match wait {
            Wait::Quick => Some(QUICK_REPLY_LIMIT),
            Wait::AsLongAsTheKernel => None,
        };
        client.set_timeout(limit)?;
        if let Some(delegate) = self.delegate {
            let narrowed = client.call(Opcode::DELEGATE, &delegate_payload(delegate)?)?;
            reply_of::<DelegateReply>(&narrowed.payload)?;
        }
        let reply = client.call(opcode, &payload)?;
        reply_of(&reply.payload)
    }

    /// A failed connect, named with this face's hint.
    fn unreachable(&self, err: ClientError) -> KernelError {
        match err {
            ClientError::Connect { path, error } => KernelError::Unreachable {
                socket: path,
                error,
                hint: self.hint,
            },
            err => err.into(),
        }
    }

    /// Sends one request on a new connection, narrowed to the delegate
    /// first if the link has one, and reads its reply frame's payload.
    /// Dropping the future closes the connection.
    async fn exchange(&self, opcode: Opcode, payload: &[u8]) -> Result<Vec<u8>, KernelError> {
        let mut stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|error| KernelError::Unreachable {
                    socket: self.socket.clone(),
                    error,
                    hint: self.hint,
                })?;
        let mut frames = Vec::with_capacity(2 * agentos_proto::HEADER_LEN + payload.len() + 64);
        if let Some(delegate) = self.delegate {
            frames.extend(encode_frame(
                Opcode::DELEGATE,
                0,
                &delegate_payload(delegate)?,
            ));
        }
        frames.extend(encode_frame(opcode, 0, payload));
        // A write the kernel cut short (it refused the connection, or the
        // payload as too large from its header alone) still has the
        // kernel's reason waiting to be read, which says more than EPIPE.
        let written = stream.write_all(&frames).await;
        let mut decoder = FrameDecoder::new(MAX_REPLY_BYTES);
        let mut narrowed = self.delegate.is_none();
        loop {
            if let Some(frame) = decoder.next_frame().map_err(ClientError::Decode)? {
                if narrowed {
                    return Ok(frame.payload.to_vec());
                }
                // The kernel refused the delegate: the call behind it
                // was not made as the delegate, and its reply is not read.
                reply_of::<DelegateReply>(frame.payload)?;
                narrowed = true;
                continue;
            }
            let failure = match stream.read(decoder.read_buf()).await {
                Ok(0) => ClientError::Closed,
                Ok(n) => {
                    decoder.advance(n);
                    continue;
                }
                Err(err) => ClientError::Io(err),
            };
            return Err(match written {
                Err(err) => ClientError::Io(err),
                Ok(()) => failure,
            }
            .into());
        }
    }
}

/// DELEGATE's payload for `delegate`.
fn delegate_payload(delegate: DelegateName) -> Result<Vec<u8>, KernelError> {
    serde_json::to_vec(&DelegateRequest { delegate }).map_err(KernelError::Unwritable)
}

/// A reply read as `R`, or the kernel's refusal.
fn reply_of<R: DeserializeOwned>(payload: &[u8]) -> Result<R, KernelError> {
    match serde_json::from_slice::<Refusal>(payload) {
        Ok(refusal) => {
            if let Some(refusal) = refusal.into_reply() {
                return Err(KernelError::Refused(refusal));
            }
        }
        Err(err) if err.is_syntax() || err.is_eof() => return Err(KernelError::Malformed(err)),
        // No object with a code in words (LIST's array, say): no
        // refusal.
        Err(_) => {}
    }
    // The connection ends with the call; a polite EXIT would cost another
    // round trip for nothing the kernel needs.
    serde_json::from_slice(payload).map_err(KernelError::Unexpected)
}

/// What makes a reply, or a task's result, a refusal: an error code. An
/// EXEC run that failed has none (it ran, and its exit code and output
/// are the answer).
#[derive(Debug, Deserialize)]
pub struct Refusal {
    /// A code this build does not know is `Other`, as the blocking
    /// client reads it.
    code: Option<ErrorCode>,
    error: Option<String>,
}

impl Refusal {
    /// The refusal in a task's result, if it is one.
    pub fn in_result(result: &Value) -> Option<ErrorReply> {
        Refusal::deserialize(result).ok()?.into_reply()
    }

    fn into_reply(self) -> Option<ErrorReply> {
        let message = self.error.as_deref().unwrap_or("the kernel refused");
        Some(ErrorReply::new(self.code?, message))
    }
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{ExecReply, HelloReply, HelloRequest};

    use super::*;

    const SOCKET_HINT: &str = "Give the face --socket PATH";

    #[test]
    fn a_refusal_keeps_its_code_and_reads_as_the_kernel_worded_it() {
        let reply = br#"{"success":false,"error":"no task t-1 (of yours)","code":"not_found"}"#;
        let refused = reply_of::<ExecReply>(reply).unwrap_err();
        assert_eq!(refused.refusal_code(), Some(ErrorCode::NotFound));
        assert_eq!(refused.to_string(), "no task t-1 (of yours) (not_found)");
        let unworded = reply_of::<ExecReply>(br#"{"code":"busy"}"#).unwrap_err();
        assert_eq!(unworded.to_string(), "the kernel refused (busy)");
        let unknown = reply_of::<ExecReply>(br#"{"code":"new_code","error":"x"}"#).unwrap_err();
        assert_eq!(unknown.refusal_code(), Some(ErrorCode::Other));
    }

    #[test]
    fn a_failed_run_and_a_failed_exchange_are_no_refusals() {
        let failed = ExecReply {
            success: false,
            exit_code: Some(1),
            error: Some("boom".to_owned()),
            ..ExecReply::default()
        };
        let ran = reply_of::<ExecReply>(&serde_json::to_vec(&failed).unwrap());
        assert_eq!(ran.expect("a run's reply").exit_code, Some(1));
        let reset = KernelError::from(ClientError::Closed);
        assert_eq!(reset.refusal_code(), None);
        assert_eq!(reset.to_string(), "the kernel closed the connection");
        let refused = KernelError::from(ClientError::Remote(ErrorReply::new(
            ErrorCode::PayloadTooLarge,
            "too big",
        )));
        assert_eq!(refused.refusal_code(), Some(ErrorCode::PayloadTooLarge));
    }

    #[test]
    fn a_blocking_call_with_no_kernel_names_the_socket_and_how_to_set_it() {
        let kernel = KernelLink::new(PathBuf::from("/nonexistent/agentos.sock"), SOCKET_HINT);
        let missing = kernel
            .request_blocking::<HelloReply>(Opcode::HELLO, &HelloRequest {}, Wait::Quick)
            .unwrap_err();
        assert!(
            matches!(missing, KernelError::Unreachable { .. }),
            "{missing:?}"
        );
        assert_eq!(missing.refusal_code(), None);
        let said = missing.to_string();
        assert!(
            said.starts_with("cannot connect to the AgentOS kernel at /nonexistent/agentos.sock: "),
            "{said}"
        );
        assert!(said.ends_with(SOCKET_HINT), "{said}");
    }
}
