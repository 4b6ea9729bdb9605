//! The server's way to agentosd: one protocol connection per tool call,
//! driven on the server's own runtime thread.
//!
//! A connection per call keeps calls independent (a slow EXEC does not
//! hold up a LIST) and costs a socket connect, which is cheap next to any
//! kernel operation. EXEC sessions belong to the caller's uid, not to a
//! connection, so they last across calls. The exchange is non-blocking
//! I/O on the runtime, not a blocking call on a pool thread: the kernel's
//! reply wakes the thread that answers the client, with no hop between
//! threads on the way out or back.
//!
//! A call's connection closes when the call ends or is given up: the
//! kernel ends a closed connection's runs, so a cancelled `exec` stops in
//! the kernel too.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_proto::{encode_frame, Client, ClientError, FrameDecoder, Opcode, MAX_REPLY_BYTES};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long a quick request (LIST, SPAWN, KILL, HELLO) may take before
/// the call fails: these answer at once unless the kernel is stuck.
const QUICK_REPLY_LIMIT: Duration = Duration::from_secs(30);

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

/// Where the kernel listens.
#[derive(Debug, Clone)]
pub struct KernelLink {
    socket: PathBuf,
}

impl KernelLink {
    pub fn new(socket: PathBuf) -> KernelLink {
        KernelLink { socket }
    }

    /// Sends one request and returns the kernel's JSON reply. A refusal
    /// is an `Err` carrying the kernel's own message and code, as is
    /// failing to reach the kernel at all.
    pub async fn request(&self, opcode: Opcode, body: &Value, wait: Wait) -> Result<Value, String> {
        self.request_until(opcode, body, wait, std::future::pending())
            .await
    }

    /// As [`KernelLink::request`], unless `cancelled` resolves first: then
    /// the call fails at once. Either way, once this future ends or is
    /// dropped the request's connection is closed, and the kernel ends the
    /// work that connection asked for (a closed connection's EXEC runs are
    /// killed, its queued THINKs dropped): a call the client gave up on
    /// leaves nothing running.
    pub async fn request_until(
        &self,
        opcode: Opcode,
        body: &Value,
        wait: Wait,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Value, String> {
        let payload = request_payload(body)?;
        let exchange = exchange(&self.socket, opcode, &payload);
        let replied = async {
            match wait {
                Wait::Quick => tokio::time::timeout(QUICK_REPLY_LIMIT, exchange)
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "the kernel did not answer within {} s",
                            QUICK_REPLY_LIMIT.as_secs()
                        ))
                    }),
                Wait::AsLongAsTheKernel => exchange.await,
            }
        };
        // Whichever ends first drops the other; a dropped exchange closes
        // its connection.
        tokio::select! {
            reply = replied => reply_value(&reply?),
            () = cancelled => Err("the call was cancelled".to_owned()),
        }
    }

    /// As [`KernelLink::request`], blocking this thread: for where no
    /// future can run, such as a `Drop`.
    pub fn request_blocking(
        &self,
        opcode: Opcode,
        body: &Value,
        wait: Wait,
    ) -> Result<Value, String> {
        let payload = request_payload(body)?;
        let client = Client::connect(&self.socket).map_err(|err| err.to_string())?;
        call_on(client, opcode, &payload, wait)
    }
}

/// The kernel's error code in a refusal as [`call_on`] words it
/// (`message (code)`); None for a failure that is not a refusal, such as
/// not reaching the kernel.
pub fn refusal_code(error: &str) -> Option<&str> {
    let (_, code) = error.strip_suffix(')')?.rsplit_once(" (")?;
    let is_code = !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    is_code.then_some(code)
}

/// Whether `error`, from a request, is the kernel's refusal with `code`
/// (`not_found`, `bad_request`, ...).
pub fn refused_with(error: &str, code: &str) -> bool {
    refusal_code(error) == Some(code)
}

/// A request's payload: requests that take no arguments (LIST, HELLO)
/// want an empty payload, not the text `null`.
fn request_payload(body: &Value) -> Result<Vec<u8>, String> {
    match body {
        Value::Null => Ok(Vec::new()),
        _ => serde_json::to_vec(body).map_err(|err| err.to_string()),
    }
}

/// Sends one request on a new connection to `socket` and reads its reply
/// frame's payload. Dropping the future closes the connection.
async fn exchange(socket: &Path, opcode: Opcode, payload: &[u8]) -> Result<Vec<u8>, String> {
    let mut stream = UnixStream::connect(socket).await.map_err(|error| {
        ClientError::Connect {
            path: socket.to_path_buf(),
            error,
        }
        .to_string()
    })?;
    // A write the kernel cut short (it refused the connection, or the
    // payload as too large from its header alone) still has the kernel's
    // reason waiting to be read, which says more than EPIPE.
    let written = stream.write_all(&encode_frame(opcode, 0, payload)).await;
    let mut decoder = FrameDecoder::new(MAX_REPLY_BYTES);
    loop {
        if let Some(frame) = decoder
            .next_frame()
            .map_err(|err| ClientError::Decode(err).to_string())?
        {
            return Ok(frame.payload.to_vec());
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
        .to_string());
    }
}

/// Sends one request on `client` and reads the reply, blocking.
fn call_on(
    mut client: Client,
    opcode: Opcode,
    payload: &[u8],
    wait: Wait,
) -> Result<Value, String> {
    let limit = match wait {
        Wait::Quick => Some(QUICK_REPLY_LIMIT),
        Wait::AsLongAsTheKernel => None,
    };
    client.set_timeout(limit).map_err(|err| err.to_string())?;
    let reply = client
        .call(opcode, payload)
        .map_err(|err| err.to_string())?;
    reply_value(&reply.payload)
}

/// A reply's JSON, or the kernel's refusal as `message (code)`.
fn reply_value(payload: &[u8]) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(payload)
        .map_err(|err| format!("malformed reply from the kernel: {err}"))?;
    // A refusal carries an error code; an EXEC run that failed does not
    // (it ran, and its exit code and output are the answer).
    if let Some(code) = value.get("code").and_then(Value::as_str) {
        let message = value["error"].as_str().unwrap_or("the kernel refused");
        return Err(format!("{message} ({code})"));
    }
    // The connection ends with the call; a polite EXIT would cost another
    // round trip for nothing the kernel needs.
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_told_by_its_code_alone() {
        let refused = "no task t-1 (of yours) (not_found)";
        assert!(refused_with(refused, "not_found"));
        assert!(!refused_with(refused, "found"));
        assert!(!refused_with("no task t-1 (not_found", "not_found"));
        assert!(!refused_with(
            "i/o error talking to the kernel: reset",
            "not_found"
        ));
    }
}
