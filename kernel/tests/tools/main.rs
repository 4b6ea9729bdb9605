//! Tools end to end: TOOL and `import tools` against a real agentosd running
//! real MCP servers (npm's server-everything and server-filesystem, PyPI's
//! mcp-server-time, installed by the project's setup) and one that
//! misbehaves on purpose (`mcp_faults.py`), and the kernel's MCP client on
//! its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod forms;
mod mcp_client;
mod remote;
mod servers;
mod unserved;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::call_json;
use serde_json::{json, Value};

const EXEC: u8 = 0x02;
const TOOL: u8 = 0x05;
/// How long servers may take to be ready (node starts in about a second).
const READY_WITHIN: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A `[mcp.servers.<name>]` table for the misbehaving server.
fn faulty(name: &str, args: &str, extra: &str) -> String {
    let script = repo().join("kernel/tests/mcp_faults.py");
    format!(
        "[mcp.servers.{name}]\ncommand = \"/usr/bin/python3\"\n\
         args = [\"{}\", {args}]\n{extra}\n",
        script.display()
    )
}

fn tool(stream: &mut UnixStream, request: Value) -> Value {
    call_json(stream, Opcode::TOOL, request.to_string().as_bytes())
}

fn exec(stream: &mut UnixStream, code: &str) -> Value {
    let request = json!({"code": code, "timeout_ms": 60_000});
    call_json(stream, Opcode::EXEC, request.to_string().as_bytes())
}

/// Waits until every server of `settled` is `ready` or `failed`; returns
/// the TOOL list reply.
fn settled(stream: &mut UnixStream, servers: &[&str]) -> Value {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let list = tool(stream, json!({"op": "list"}));
        let done =
            servers.iter().all(|name| {
                list["servers"].as_array().unwrap().iter().any(|s| {
                    s["name"] == *name && (s["state"] == "ready" || s["state"] == "failed")
                })
            });
        if done {
            return list;
        }
        assert!(Instant::now() < deadline, "servers not settled: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn server<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no server {name}: {list}"))
}

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}.{}",
                t["server"].as_str().unwrap(),
                t["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Lines of a run's stdout.
fn lines(run: &Value) -> Vec<String> {
    assert_eq!(run["success"], true, "{run}");
    run["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}
