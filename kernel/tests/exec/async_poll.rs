//! Clove's asynchronous EXEC and ASYNC_POLL: the run is a TASK of its
//! caller's, answered at once with a `request_id`; the caller polls for
//! the reply, once, and no one else ever sees it.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{call_json, py_frames, require_root, until, Daemon};
use serde_json::{json, Value};

use super::exec;

const ASYNC_POLL: u8 = 0x80;

fn poll(stream: &mut std::os::unix::net::UnixStream, body: Value) -> Value {
    call_json(stream, Opcode(ASYNC_POLL), body.to_string().as_bytes())
}

#[test]
fn an_async_exec_is_polled_once_by_its_caller_and_by_no_one_else() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let accepted = exec(
        &mut stream,
        json!({"command": "echo async-ok", "async": true, "request_id": 5}),
    );
    assert_eq!(accepted["success"], true, "{accepted}");
    assert_eq!(accepted["request_id"], 5, "{accepted}");
    let task_id = accepted["task_id"].as_str().unwrap().to_owned();
    let again = exec(
        &mut stream,
        json!({"command": "echo twice", "async": true, "request_id": 5}),
    );
    assert_eq!(again["code"], "already_exists", "{again}");
    let made = exec(&mut stream, json!({"command": "true", "async": true}));
    assert!(made["request_id"].as_u64().unwrap() > 0, "{made}");

    // Another uid's connection polls: nothing of root's shows.
    std::fs::set_permissions(daemon.dir.path(), Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&daemon.socket, Permissions::from_mode(0o666)).unwrap();
    let script = format!(
        "{}\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
         import time\ntime.sleep(1.5)\nsend(s, 0x80, {{'max': 100}})\n\
         print(recv(s)[2].decode(), flush=True)\n",
        py_frames!()
    );
    let output = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&daemon.socket)
        .uid(65534)
        .gid(0)
        .output()
        .unwrap();
    let theirs: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!("{}", String::from_utf8_lossy(&output.stderr));
    });
    assert_eq!(theirs["success"], true, "{theirs}");
    assert_eq!(theirs["results"], json!([]), "{theirs}");

    let mut found = None;
    until("the async run's result", Duration::from_secs(20), || {
        let polled = poll(&mut stream, json!({"max": 1_000_000_000u64}));
        assert_eq!(polled["success"], true, "{polled}");
        found = polled["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["request_id"] == 5)
            .cloned();
        found.is_some()
    });
    let found = found.unwrap();
    assert_eq!(found["task_id"], task_id.as_str(), "{found}");
    assert_eq!(found["opcode_name"], "EXEC", "{found}");
    let payload: Value = serde_json::from_str(found["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["success"], true, "{payload}");
    assert_eq!(payload["stdout"], "async-ok\n", "{payload}");
    // Handed over once.
    let later = poll(&mut stream, json!({}));
    assert!(
        !later["results"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["request_id"] == 5),
        "{later}"
    );
    let unknown = poll(&mut stream, json!({"max": 1, "agent": 7}));
    assert_eq!(unknown["code"], "bad_request", "{unknown}");
}
