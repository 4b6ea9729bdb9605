//! The MCP client's state machine against the real servers the project's
//! setup installs (npm's server-everything, PyPI's mcp-server-time), and
//! the one that misbehaves on purpose (`mcp_faults.py`), driven over their
//! stdio by a small blocking loop.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentos_kernel::tools::mcp::client::{CallOutcome, ClientEvent, McpClient, ServerState};
use agentos_kernel::tools::mcp::jsonrpc::LineReader;
use serde_json::{json, Value};

use crate::repo;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A server's program, if the project's setup has installed it.
fn installed(relative: &str) -> Option<PathBuf> {
    let path = repo().join(relative);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("!!! NOT TESTED: {relative} is not installed (run scripts/setup)");
        None
    }
}

/// A server and the client talking to it.
struct Session {
    child: Child,
    client: McpClient,
    reader: LineReader,
    lines: mpsc::Receiver<Vec<u8>>,
    events: Vec<ClientEvent>,
}

impl Session {
    fn start(program: &Path, args: &[&str]) -> Session {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 65536];
            while let Ok(n) = stdout.read(&mut chunk) {
                if n == 0 || sender.send(chunk[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        Session {
            child,
            client: McpClient::new("test", TIMEOUT, Instant::now()),
            reader: LineReader::new(16 << 20),
            lines,
            events: Vec::new(),
        }
    }

    /// Runs the conversation until `done` holds of the events so far.
    fn until(&mut self, done: impl Fn(&[ClientEvent]) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        while !done(&self.events) {
            let output = self.client.take_output();
            if !output.is_empty() {
                let stdin = self.child.stdin.as_mut().unwrap();
                stdin.write_all(&output).unwrap();
                stdin.flush().unwrap();
            }
            assert!(Instant::now() < deadline, "no end: {:?}", self.events);
            if let Ok(bytes) = self.lines.recv_timeout(Duration::from_millis(50)) {
                let mut messages = Vec::new();
                self.reader.push(&bytes, &mut messages);
                for message in messages {
                    self.client
                        .on_message(message, Instant::now(), &mut self.events);
                }
            }
        }
    }

    fn ready(&mut self) {
        self.until(|events| {
            events
                .iter()
                .any(|e| matches!(e, ClientEvent::ToolsListed(_) | ClientEvent::Failed(_)))
        });
        assert_eq!(
            self.client.state(),
            &ServerState::Ready,
            "{:?}",
            self.events
        );
    }

    fn call(&mut self, call: u64, tool: &str, arguments: Value) -> CallOutcome {
        self.client
            .call(call, tool, arguments, Instant::now() + TIMEOUT, None)
            .unwrap();
        self.until(|events| {
            events
                .iter()
                .any(|e| matches!(e, ClientEvent::CallEnded { call: c, .. } if *c == call))
        });
        self.events
            .iter()
            .find_map(|e| match e {
                ClientEvent::CallEnded { call: c, outcome } if *c == call => Some(outcome.clone()),
                _ => None,
            })
            .unwrap()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text_of(content: &Value) -> String {
    content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect()
}

#[test]
fn server_everything_lists_its_tools_and_answers_calls_and_errors() {
    let Some(program) = installed("scripts/mcp-servers/node_modules/.bin/mcp-server-everything")
    else {
        return;
    };
    let mut session = Session::start(&program, &[]);
    session.ready();
    let names: Vec<&str> = session
        .client
        .tools()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-sum"),
        "{names:?}"
    );
    let CallOutcome::Done { content, .. } = session.call(1, "echo", json!({"message": "hi"}))
    else {
        panic!("echo failed: {:?}", session.events);
    };
    assert!(text_of(&content).contains("hi"), "{content}");
    let CallOutcome::Done { content, .. } = session.call(2, "get-sum", json!({"a": 2, "b": 3}))
    else {
        panic!("get-sum failed: {:?}", session.events);
    };
    assert!(text_of(&content).contains('5'), "{content}");
    // Arguments that fail the tool's schema: the server's own error
    // surfaces, as a tool error or a JSON-RPC error.
    let message = match session.call(3, "echo", json!({})) {
        CallOutcome::ToolError { message, .. } | CallOutcome::Rejected(message) => message,
        done => panic!("echo without its argument succeeded: {done:?}"),
    };
    assert!(message.contains("message"), "{message}");
}

#[test]
fn mcp_server_time_answers_from_python() {
    let Some(program) = installed(".venv/bin/mcp-server-time") else {
        return;
    };
    let mut session = Session::start(&program, &["--local-timezone", "UTC"]);
    session.ready();
    let CallOutcome::Done { content, .. } =
        session.call(1, "get_current_time", json!({"timezone": "UTC"}))
    else {
        panic!("get_current_time failed: {:?}", session.events);
    };
    let answer: Value = serde_json::from_str(&text_of(&content)).unwrap();
    assert_eq!(answer["timezone"], "UTC", "{answer}");
}

#[test]
fn a_malformed_reply_ends_its_call_at_once_naming_the_fault() {
    let script = repo().join("kernel/tests/mcp_faults.py");
    let mut session = Session::start(
        Path::new("/usr/bin/python3"),
        &[script.to_str().unwrap(), "malformed"],
    );
    session.ready();
    for (call, tool, fault) in [
        (1, "nul", "a raw NUL byte"),
        (2, "deep", "nested deeper than 128 levels"),
    ] {
        let started = Instant::now();
        let CallOutcome::Rejected(message) = session.call(call, tool, json!({})) else {
            panic!("{tool} did not fail: {:?}", session.events);
        };
        assert!(
            message.contains("reply was malformed") && message.contains(fault),
            "{message}"
        );
        assert!(started.elapsed() < Duration::from_secs(3), "{tool}");
    }
    let CallOutcome::Done { content, .. } = session.call(3, "get-sum", json!({"a": 2, "b": 3}))
    else {
        panic!("get-sum failed: {:?}", session.events);
    };
    assert_eq!(text_of(&content), "5");
}
