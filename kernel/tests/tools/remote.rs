//! Remote servers over Streamable HTTP, and servers of either protocol
//! era: npm's server-everything in its HTTP mode (the earlier era, with a
//! session and event streams), the PyPI SDK's server behind a bearer
//! token (2026-07-28, JSON answers), a stdio server that speaks only
//! 2026-07-28 (`mcp_modern.py`), and URLs where nothing answers.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, call_json, require_root, Daemon};
use serde_json::json;

use crate::{exec, faulty, lines, repo, server, settled, tool, tool_names};

/// The token the PyPI server demands; the kernel must never show it.
const TOKEN: &str = "tok-remote-7c41e09b2d";

/// A helper server, ended with the test.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn installed(relative: &str) -> PathBuf {
    let path = repo().join(relative);
    assert!(
        path.exists(),
        "{} is not installed: run scripts/setup",
        path.display()
    );
    path
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts connections on `port`.
fn listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// server-everything in its Streamable HTTP mode, on a free port, its
/// output to `out`.
fn everything_over_http(out: &std::path::Path) -> (Helper, u16) {
    let script = installed(
        "scripts/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    let port = free_port();
    let child = Command::new("node")
        .arg(script)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("node runs");
    let helper = Helper(child);
    listening(port);
    (helper, port)
}

/// The PyPI SDK's server (`mcp_remote.py`), demanding [`TOKEN`].
fn python_over_http() -> (Helper, u16) {
    let python = installed(".venv/bin/python");
    let mut child = Command::new(python)
        .arg(repo().join("kernel/tests/mcp_remote.py"))
        .arg(TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port = first.trim().parse().expect("it prints its port");
    listening(port);
    (Helper(child), port)
}

#[test]
fn remote_servers_tools_are_listed_and_called_over_tool_and_from_exec_in_either_era() {
    require_root!("EXEC");
    let scratch = tempfile::tempdir().unwrap();
    let everything_out = scratch.path().join("everything.out");
    let (_everything, everything_port) = everything_over_http(&everything_out);
    let (_python, python_port) = python_over_http();
    let config = format!(
        "[mcp.servers.everything]\nurl = \"http://127.0.0.1:{everything_port}/mcp\"\n\
         [mcp.servers.remote]\nurl = \"http://localhost:{python_port}/mcp\"\n\
         headers = {{ Authorization = \"Bearer {TOKEN}\" }}\n"
    );
    let mut daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    let list = settled(&mut stream, &["everything", "remote"]);
    for name in ["everything", "remote"] {
        assert_eq!(server(&list, name)["state"], "ready", "{list}");
    }
    let names = tool_names(&list);
    for expected in [
        "everything.echo",
        "everything.get-sum",
        "remote.echo",
        "remote.era",
    ] {
        assert!(
            names.contains(&expected.to_owned()),
            "{expected}: {names:?}"
        );
    }

    // Over TOOL. server-everything speaks the earlier era (it refuses
    // server/discover without a session); the SDK's server 2026-07-28.
    let echo = tool(
        &mut stream,
        json!({"op": "call", "server": "everything", "tool": "echo", "arguments": {"message": "hi"}}),
    );
    assert_eq!(echo["result"], "Echo: hi", "{echo}");
    let sum = tool(
        &mut stream,
        json!({"op": "call", "server": "everything", "tool": "get-sum", "arguments": {"a": 2, "b": 3}}),
    );
    assert_eq!(sum["result"], "The sum of 2 and 3 is 5.", "{sum}");
    let era = tool(
        &mut stream,
        json!({"op": "call", "server": "remote", "tool": "era"}),
    );
    // The SDK gives a function's return value as `{"result": ...}`.
    assert_eq!(era["result"]["result"], "2026-07-28", "{era}");
    // An argument the tool asks to be mirrored into a header
    // (x-mcp-header): the SDK refuses the call without it.
    let routed = tool(
        &mut stream,
        json!({"op": "call", "server": "remote", "tool": "route", "arguments": {"region": "eu-west", "query": "q"}}),
    );
    assert_eq!(routed["result"]["result"], "eu-west: q", "{routed}");
    let bad_args = tool(
        &mut stream,
        json!({"op": "call", "server": "everything", "tool": "echo", "arguments": {"message": 5}}),
    );
    assert_eq!(bad_args["success"], false, "{bad_args}");

    // From EXEC, both at once.
    let run = exec(
        &mut stream,
        "import tools\nprint(tools.everything.echo(message='from a run'))\n\
         print(tools.remote.echo(message='remote run')['result'])\n\
         print(tools.remote.era()['result'])",
    );
    assert_eq!(
        lines(&run),
        ["Echo: from a run", "Echo: remote run", "2026-07-28"],
        "{run}"
    );
    assert_eq!(run["tool_calls"], 3, "{run}");

    // Stopping, the kernel ends server-everything's session.
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(10)).success());
    let said = std::fs::read_to_string(&everything_out).unwrap();
    assert!(
        said.contains("Received session termination request"),
        "{said}"
    );
}

#[test]
fn a_header_secret_never_reaches_replies_logs_or_the_sandbox() {
    require_root!("EXEC");
    let (_python, port) = python_over_http();
    // The same server with another token, and at a path it does not serve.
    let wrong = "tok-wrong-5e0a91d3";
    let config = format!(
        "[mcp.servers.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
         headers = {{ Authorization = \"Bearer {TOKEN}\" }}\n\
         [mcp.servers.refused]\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
         headers = {{ Authorization = \"Bearer {wrong}\" }}\n\
         [mcp.servers.astray]\nurl = \"http://127.0.0.1:{port}/elsewhere\"\n\
         headers = {{ Authorization = \"Bearer {TOKEN}\" }}\n"
    );
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    let list = settled(&mut stream, &["remote", "refused", "astray"]);
    assert_eq!(server(&list, "remote")["state"], "ready", "{list}");
    let refused = server(&list, "refused");
    assert_eq!(refused["state"], "failed", "{list}");
    assert_eq!(
        refused["error"],
        format!(
            "127.0.0.1:{port} refused the kernel's credentials (HTTP 401); check the \
             server's `headers`"
        ),
        "{list}"
    );
    // Neither server/discover nor initialize is found there: the status
    // is the error.
    let astray = server(&list, "astray");
    assert_eq!(astray["state"], "failed", "{list}");
    assert_eq!(
        astray["error"], "initialize failed: HTTP 404 Not Found: Not Found",
        "{list}"
    );
    // The server got the token (it refuses every request without it) and
    // hands it back: the kernel blots it out, in the header's form and bare.
    let leak = tool(
        &mut stream,
        json!({"op": "call", "server": "remote", "tool": "leak"}),
    );
    assert_eq!(leak["result"]["result"], "you sent [secret]", "{leak}");
    let run = exec(
        &mut stream,
        &format!(
            r#"
import os, glob
secret = {TOKEN:?}
found = [k for k, v in os.environ.items() if secret in v]
for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + glob.glob("/tools/**", recursive=True):
    try:
        if os.path.isfile(path) and secret.encode() in open(path, "rb").read():
            found.append(path)
    except OSError:
        pass
import tools
print(tools.remote.leak()["result"], found)
"#
        ),
    );
    assert_eq!(lines(&run), ["you sent [secret] []"], "{run}");
    let hello = call_json(&mut stream, Opcode::HELLO, b"");
    for reply in [&list, &leak, &run, &hello] {
        assert!(!reply.to_string().contains(TOKEN), "{reply}");
        assert!(!reply.to_string().contains(wrong), "{reply}");
    }
    let log = daemon.log();
    assert!(log.contains("MCP server remote ready"), "{log}");
    assert!(!log.contains(TOKEN), "the token reached the log");
    assert!(!log.contains(wrong), "the wrong token reached the log");
}

#[test]
fn a_server_that_speaks_only_2026_07_28_over_stdio_is_used_without_a_handshake() {
    require_root!("MCP servers confined as the sandbox user, and EXEC");
    let python = installed(".venv/bin/python");
    let config = format!(
        "[mcp.servers.modern]\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python.display(),
        repo().join("kernel/tests/mcp_modern.py").display()
    );
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    let list = settled(&mut stream, &["modern"]);
    assert_eq!(server(&list, "modern")["state"], "ready", "{list}");
    assert_eq!(server(&list, "modern")["tools"], 2, "{list}");
    let add = tool(
        &mut stream,
        json!({"op": "call", "server": "modern", "tool": "add", "arguments": {"a": 40, "b": 2}}),
    );
    assert_eq!(add["result"], json!({"sum": 42}), "{add}");
    let run = exec(
        &mut stream,
        "import tools\nprint(tools.modern.add(a=1, b=2)['sum'])\nprint(tools.modern.era())",
    );
    assert_eq!(lines(&run), ["3", "2026-07-28"], "{run}");
}

#[test]
fn a_dead_or_silent_url_fails_its_server_clearly_while_the_kernel_answers_at_once() {
    // A port nothing listens on, and one that takes connections but never
    // answers (the kernel queues them in the listener's backlog).
    let dead = free_port();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let config = format!(
        "[mcp.servers.dead]\nurl = \"http://127.0.0.1:{dead}/mcp\"\n\
         [mcp.servers.silent]\nurl = \"http://127.0.0.1:{silent_port}/mcp\"\ntimeout_ms = 1500\n"
    );
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    // While the silent server holds its requests, the kernel answers.
    let started = Instant::now();
    let mut rtts = Vec::new();
    while started.elapsed() < Duration::from_millis(1000) {
        let sent = Instant::now();
        support::send(&mut stream, Opcode::NOOP, b"ping");
        assert_eq!(support::recv(&mut stream).1, b"ping");
        rtts.push(sent.elapsed());
        std::thread::sleep(Duration::from_millis(2));
    }
    rtts.sort();
    let p99 = rtts[rtts.len() * 99 / 100];
    // A kernel that waited on the silent server would answer in seconds.
    assert!(p99 < Duration::from_millis(200), "NOOP p99 {p99:?}");
    let sent = Instant::now();
    let hello = call_json(&mut stream, Opcode::HELLO, b"");
    assert!(sent.elapsed() < Duration::from_millis(200), "{hello}");
    let call = tool(
        &mut stream,
        json!({"op": "call", "server": "silent", "tool": "x"}),
    );
    assert_eq!(call["code"], "unavailable", "{call}");

    let list = settled(&mut stream, &["dead", "silent"]);
    let dead_server = server(&list, "dead");
    assert_eq!(dead_server["state"], "failed", "{list}");
    let why = dead_server["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("cannot connect to 127.0.0.1:{dead}")),
        "{list}"
    );
    // The silent one fails at its timeout, named.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = tool(&mut stream, json!({"op": "list"}));
        let silent_server = server(&list, "silent");
        if silent_server["state"] == "failed" {
            let why = silent_server["error"].as_str().unwrap();
            assert_eq!(
                why, "did not answer server/discover within 1500 ms",
                "{list}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // And they are tried again, with backoff: the log says so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.log().matches("MCP server dead failed").count() < 2 {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(silent);
}

#[test]
fn a_server_of_the_earlier_era_that_dies_at_the_probe_is_started_again_with_the_handshake() {
    require_root!("MCP servers confined as the sandbox user");
    let daemon = Daemon::start_with(&faulty("strict", "\"strict\"", ""));
    let mut stream = daemon.raw();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = tool(&mut stream, json!({"op": "list"}));
        if server(&list, "strict")["state"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "{list}\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let sum = tool(
        &mut stream,
        json!({"op": "call", "server": "strict", "tool": "get-sum", "arguments": {"a": 1, "b": 2}}),
    );
    assert_eq!(sum["success"], true, "{sum}");
    let log = daemon.log();
    assert!(
        log.contains("request server/discover before initialization"),
        "{log}"
    );
    assert!(
        log.contains("MCP server strict ended at server/discover"),
        "{log}"
    );
}
