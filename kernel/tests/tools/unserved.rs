//! Servers that are configured but not serving: code that names one learns
//! that it failed and why (its keys blotted out), TOOL `list` keeps a
//! restarting server's last failure, and a caller whose `permissions.tools`
//! leave a server out learns nothing of it, not even that it exists.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{call_json, require_root, Daemon};
use serde_json::{json, Value};

use crate::{lines, server, settled, tool, READY_WITHIN};

const KEY: &str = "sk-live-0123456789";

/// `time`, whose command is nowhere on the kernel's `PATH`, and `keyed`,
/// whose first incarnation exits naming its key and whose later ones never
/// answer `initialize` (within its minute): `keyed` stays `starting` after
/// a failure for long enough to look at.
fn config() -> String {
    let script = "import os, sys, time\\n\
                  mark = os.path.join(os.environ['HOME'], 'failed-once')\\n\
                  if not os.path.exists(mark):\\n    \
                  open(mark, 'w').close()\\n    \
                  sys.exit('key ' + os.environ['API_KEY'] + ' refused')\\n\
                  time.sleep(3600)\\n";
    format!(
        "[mcp.servers.time]\ncommand = \"no-such-uvx\"\nargs = [\"mcp-server-time\"]\n\n\
         [mcp.servers.keyed]\ncommand = \"/usr/bin/python3\"\nargs = [\"-c\", \"{script}\"]\n\
         env = {{ API_KEY = \"{KEY}\" }}\ntimeout_ms = 60000\n"
    )
}

/// Waits until `keyed` is starting again after its failure, its exit
/// status and stderr in; returns the TOOL list reply then.
fn restarting(stream: &mut UnixStream) -> Value {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let list = tool(stream, json!({"op": "list"}));
        let keyed = server(&list, "keyed");
        let failed_before = keyed["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("it exited with status 1"));
        if keyed["state"] == "starting" && failed_before {
            return list;
        }
        assert!(Instant::now() < deadline, "keyed never restarted: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An EXEC run of `code` whose connection may use only the tools
/// `patterns` allow.
fn run_allowed(stream: &mut UnixStream, patterns: &[&str], code: &str) -> Value {
    let request = json!({"code": code, "timeout_ms": 60_000, "permissions": {"tools": patterns}});
    call_json(stream, Opcode::EXEC, request.to_string().as_bytes())
}

/// Python that names server `name` from a run, both ways the package
/// takes, and prints what it raised.
fn naming(name: &str) -> String {
    format!(
        r#"
import tools
try:
    tools.{name}.get_current_time()
except Exception as err:
    print(type(err).__name__, getattr(err, "code", "-"), err)
try:
    from tools import {name}
except Exception as err:
    print(type(err).__name__, err)
"#
    )
}

#[test]
fn a_failed_server_named_from_code_says_why_with_its_key_blotted_out() {
    require_root!("MCP servers confined as the sandbox user, and EXEC");
    let daemon = Daemon::start_with(&config());
    let mut stream = daemon.raw();
    settled(&mut stream, &["time"]);
    restarting(&mut stream);

    // A pattern naming one of its tools is enough to learn of it.
    let run = run_allowed(&mut stream, &["time.get_current_time"], &naming("time"));
    let not_on_path = "tool server `time` failed: its command \"no-such-uvx\" is not on the \
                       kernel's PATH";
    assert_eq!(
        lines(&run),
        [
            format!("ToolError unavailable {not_on_path}"),
            format!("ToolError {not_on_path}"),
        ],
        "{run}"
    );

    // Starting again after a failure, it is named with that failure.
    let run = run_allowed(&mut stream, &["keyed.*"], &naming("keyed"));
    let why = "tool server `keyed` failed, and is starting again: it exited with status 1: \
               key [secret] refused";
    assert_eq!(
        lines(&run),
        [
            format!("ToolError unavailable {why}"),
            format!("ToolError {why}")
        ],
        "{run}"
    );
    assert!(!run.to_string().contains(KEY), "{run}");
    assert!(!daemon.log().contains(KEY), "the key reached the log");
}

#[test]
fn a_run_not_allowed_a_failed_server_learns_nothing_of_it() {
    require_root!("MCP servers confined as the sandbox user, and EXEC");
    let daemon = Daemon::start_with(&config());
    let mut stream = daemon.raw();
    settled(&mut stream, &["time"]);
    restarting(&mut stream);
    // Everything a run's own connection could ask: the package, TOOL
    // list and HELLO.
    let code = r#"
import json, os, tools

def ask(opcode, payload):
    fd = int(os.environ["AGENTOS_SOCKET_FD"])
    os.write(fd, tools._HEADER.pack(tools._MAGIC, 0, opcode, len(payload)) + payload)
    _, _, _, length = tools._HEADER.unpack(tools._read(fd, tools._HEADER.size))
    return json.loads(tools._read(fd, length))

for name in ["time", "keyed"]:
    try:
        getattr(tools, name)
    except Exception as err:
        print(type(err).__name__, err)
try:
    from tools import time
except Exception as err:
    print(type(err).__name__, err)
listed = ask(0x05, json.dumps({"op": "list"}).encode())["servers"]
hello = ask(0xFE, b"")["tool_servers"]
print(json.dumps([listed, hello]))
"#;
    let run = run_allowed(&mut stream, &["everything.*", "keyed.now"], code);
    let shown = lines(&run);
    assert_eq!(
        shown[..3],
        [
            "AttributeError module 'tools' has no attribute 'time'; no tool server is called that",
            "ToolError tool server `keyed` failed, and is starting again: it exited with status \
             1: key [secret] refused",
            "ImportError cannot import name 'time' from 'tools' (/tools/tools.py)",
        ],
        "{run}"
    );
    // `keyed.now` allows a tool of `keyed` (were it to have one), none of `time`.
    let servers: Value = serde_json::from_str(&shown[3]).unwrap();
    for seen in servers.as_array().unwrap() {
        let names: Vec<&str> = seen
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["keyed"], "{run}");
    }
    for leak in ["no-such-uvx", "PATH"] {
        assert!(
            !run.to_string().contains(leak),
            "{leak} reached the run: {run}"
        );
    }
}

#[test]
fn tool_list_keeps_a_restarting_servers_last_error() {
    require_root!("MCP servers confined as the sandbox user");
    let daemon = Daemon::start_with(&config());
    let mut stream = daemon.raw();
    let list = restarting(&mut stream);
    let keyed = server(&list, "keyed");
    assert_eq!(
        keyed,
        &json!({"name": "keyed", "state": "starting", "tools": 0,
                "error": "it exited with status 1: key [secret] refused"}),
        "{list}"
    );
    let time = server(&list, "time");
    assert_eq!(time["state"], "failed", "{list}");
    // The operator's HELLO says the same.
    let hello = call_json(&mut stream, Opcode::HELLO, b"");
    let servers = hello["tool_servers"].as_array().unwrap();
    assert!(servers.contains(keyed), "{hello}");
    assert!(!hello.to_string().contains(KEY), "{hello}");
}
