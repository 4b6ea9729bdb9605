//! The server's way to agentosd: one blocking protocol connection per tool
//! call, run off the async threads.
//!
//! A connection per call keeps calls independent (a slow EXEC does not
//! hold up a LIST) and costs a socket connect, which is cheap next to any
//! kernel operation. EXEC sessions belong to the caller's uid, not to a
//! connection, so they last across calls.

use std::path::PathBuf;
use std::time::Duration;

use agentos_proto::{Client, Opcode};
use serde_json::Value;

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
        let socket = self.socket.clone();
        // Requests that take no arguments (LIST, HELLO) want an empty
        // payload, not the text `null`.
        let payload = match body {
            Value::Null => Vec::new(),
            _ => serde_json::to_vec(body).map_err(|err| err.to_string())?,
        };
        tokio::task::spawn_blocking(move || request_blocking(&socket, opcode, &payload, wait))
            .await
            .map_err(|err| format!("the kernel request did not finish: {err}"))?
    }
}

fn request_blocking(
    socket: &std::path::Path,
    opcode: Opcode,
    payload: &[u8],
    wait: Wait,
) -> Result<Value, String> {
    let mut client = Client::connect(socket).map_err(|err| err.to_string())?;
    let limit = match wait {
        Wait::Quick => Some(QUICK_REPLY_LIMIT),
        Wait::AsLongAsTheKernel => None,
    };
    client.set_timeout(limit).map_err(|err| err.to_string())?;
    let reply = client
        .call(opcode, payload)
        .map_err(|err| err.to_string())?;
    let value: Value = serde_json::from_slice(&reply.payload)
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

/// The kernel's error code in a refusal as [`KernelLink::request`] words
/// it (`message (code)`); None for a failure that is not a refusal, such
/// as not reaching the kernel.
pub fn refusal_code(error: &str) -> Option<&str> {
    let (_, code) = error.strip_suffix(')')?.rsplit_once(" (")?;
    let is_code = !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    is_code.then_some(code)
}
