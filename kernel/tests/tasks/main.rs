//! TASK against a real agentosd: background EXEC and THINK work that
//! belongs to its owner, outlives its connection and the kernel process,
//! and is really stopped when cancelled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dispatch;
mod network;
mod owners;
mod prompt;
mod store;

use std::os::unix::net::UnixStream;

use agentos_proto::Opcode;
use agentos_test_support::call_json;
use serde_json::{json, Value};

const TASK: u8 = 0x13;

fn task(stream: &mut UnixStream, request: Value) -> Value {
    call_json(stream, Opcode::TASK, request.to_string().as_bytes())
}

fn dispatch(stream: &mut UnixStream, kind: &str, request: Value) -> String {
    let reply = task(
        stream,
        json!({"op": "dispatch", "kind": kind, "request": request}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let id = reply["task_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("t-"), "{id}");
    id
}

fn wait(stream: &mut UnixStream, id: &str, timeout_ms: u64) -> Value {
    let reply = task(
        stream,
        json!({"op": "wait", "task_id": id, "timeout_ms": timeout_ms}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    reply["task"].clone()
}

fn status(stream: &mut UnixStream, id: &str) -> Value {
    task(stream, json!({"op": "status", "task_id": id}))["task"].clone()
}
