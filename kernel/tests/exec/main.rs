//! EXEC end to end against a real agentosd: requests and replies, what a
//! run is kept within, the exec hosts behind it, sessions and snapshots, and
//! who a run is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod async_poll;
mod hosts;
mod limits;
mod network;
mod owners;
mod principals;
mod python_modes;
mod requests;
mod sessions;
mod site_builtins;

use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{agent_info, call_json, until, Daemon};
use serde_json::Value;

fn exec(stream: &mut std::os::unix::net::UnixStream, request: Value) -> Value {
    call_json(stream, Opcode::EXEC, request.to_string().as_bytes())
}

/// A JSON list of strings, sorted.
fn sorted(list: &Value) -> Vec<&str> {
    let mut items: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap())
        .collect();
    items.sort_unstable();
    items
}

/// Python that speaks the protocol on the run's own kernel connection:
/// `call(opcode, payload)` returns the reply as JSON.
const KERNEL_CALL: &str = r#"
import json, os, socket, struct
_kernel = socket.socket(fileno=int(os.environ['AGENTOS_SOCKET_FD']))
def call(op, payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    _kernel.sendall(struct.pack('<IIBQ', 0x41474E54, 0, op, len(data)) + data)
    head = b''
    while len(head) < 17:
        head += _kernel.recv(17 - len(head))
    size = struct.unpack('<Q', head[9:17])[0]
    body = b''
    while len(body) < size:
        body += _kernel.recv(size - len(body))
    return json.loads(body)
"#;

/// A run's code: [`KERNEL_CALL`], then `tries` (a Python dict of names to
/// calls), printed as one JSON object.
fn hostile(tries: &str) -> String {
    format!("{KERNEL_CALL}\nprint(json.dumps({tries}))\n")
}

/// What the run printed, as JSON.
fn printed(reply: &Value) -> Value {
    let stdout = reply["stdout"].as_str().unwrap_or_default();
    serde_json::from_str(stdout).unwrap_or_else(|err| panic!("{err}: {reply}"))
}

/// Waits for an agent a run spawned to be stopped with its run.
fn ends_with_its_run(daemon: &Daemon, child: u64) {
    let mut client = daemon.client();
    until(
        "the run's child ends with the run",
        Duration::from_secs(5),
        || agent_info(&mut client, child)["state"] == "killed",
    );
}
