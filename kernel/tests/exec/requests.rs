//! An EXEC request and its reply: every field, the Clove shell form, files
//! in and out, capped output and code of any size, and bad requests.

use agentos_test_support::{require_root, Daemon};
use serde_json::json;

use crate::exec;

#[test]
fn a_run_answers_with_every_field_of_the_reply() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = exec(&mut stream, json!({"code": "print(6 * 7)"}));
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["stdout"], "42\n");
    assert_eq!(reply["stderr"], "");
    assert_eq!(reply["exit_code"], 0);
    assert!(reply["signal"].is_null() && reply["error"].is_null());
    assert_eq!(reply["timed_out"], false);
    assert_eq!(reply["oom_killed"], false);
    assert_eq!(reply["truncated"], json!({"stdout": 0, "stderr": 0}));
    assert_eq!(reply["files"], json!({}));
    assert!(reply["session"].is_null());
    assert!(reply["duration_ms"].as_u64().is_some());
    let failed = exec(
        &mut stream,
        json!({"code": "print('so far')\nraise ValueError('bad input')"}),
    );
    assert_eq!(failed["success"], false);
    assert_eq!(failed["stdout"], "so far\n");
    assert_eq!(failed["exit_code"], 1);
    assert_eq!(failed["error"], "ValueError: bad input");
    let traceback = failed["stderr"].as_str().unwrap();
    assert!(traceback.contains("Traceback") && traceback.contains("ValueError: bad input"));
    assert!(
        !traceback.contains("run_python"),
        "the host's own frame: {traceback}"
    );
    // Code that closes its own stdout still gets its reply.
    let closed = exec(
        &mut stream,
        json!({"code": "import os\nprint('bye', flush=True)\nos.close(1)"}),
    );
    assert_eq!(
        (closed["stdout"].clone(), closed["exit_code"].clone()),
        (json!("bye\n"), json!(0)),
        "{closed}"
    );
    let exited = exec(&mut stream, json!({"code": "import sys; sys.exit(5)"}));
    assert_eq!(
        (exited["exit_code"].clone(), exited["success"].clone()),
        (json!(5), json!(false))
    );
}

#[test]
fn the_clove_shell_form_runs_as_bash() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = exec(
        &mut stream,
        json!({"command": "echo hi; echo oops >&2", "timeout": 30, "async": false, "request_id": "r-1"}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["stdout"], "hi\n");
    assert_eq!(reply["stderr"], "oops\n");
    assert_eq!(reply["exit_code"], 0);
    let failing = exec(&mut stream, json!({"command": "exit 7"}));
    assert_eq!(
        (failing["success"].clone(), failing["exit_code"].clone()),
        (json!(false), json!(7))
    );
    // Clove's asynchronous form is a TASK, answered at once with its id
    // (exec/async_poll.rs follows it to its result).
    let background = exec(&mut stream, json!({"command": "ls", "async": true}));
    assert_eq!(background["success"], true, "{background}");
    assert!(background["request_id"].as_u64().is_some(), "{background}");
    assert!(background["task_id"].as_str().is_some(), "{background}");
}

#[test]
fn ten_megabytes_of_output_come_back_as_head_and_tail() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let rss_before = daemon.rss_kib();
    let reply = exec(
        &mut stream,
        json!({"code": "import sys\nsys.stdout.write('HEAD\\n' + 'x' * (10 << 20) + '\\nTAIL\\n')"}),
    );
    assert_eq!(reply["success"], true, "{}", reply["error"]);
    let stdout = reply["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("HEAD\n"), "{}", &stdout[..20]);
    assert!(stdout.ends_with("\nTAIL\n"));
    assert!(stdout.contains("bytes dropped"));
    assert!(
        stdout.len() < (64 << 10) + 100,
        "{} bytes came back",
        stdout.len()
    );
    let dropped = reply["truncated"]["stdout"].as_u64().unwrap();
    assert_eq!(dropped as usize, 5 + (10 << 20) + 6 - (64 << 10));
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    assert!(grown < 8 << 10, "the kernel grew by {grown} KiB");
}

#[test]
fn bad_requests_name_their_field() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for (request, field) in [
        (json!({"code": "1", "language": "ruby"}), "language"),
        (json!({"language": "python"}), "code"),
        (json!({"code": "1", "timeout_ms": 0}), "timeout_ms"),
        (json!({"code": "1", "timeout_ms": 1u64 << 40}), "timeout_ms"),
        (json!({"code": "1", "files": {"../x": "aGk="}}), "files"),
        (json!({"code": "1", "files": {"/etc/x": "aGk="}}), "files"),
        (json!({"code": "1", "collect": ["a/../../b"]}), "collect"),
        (json!({"code": "1", "collect": vec!["f"; 300]}), "collect"),
        (json!({"code": "1", "session": "../other"}), "session"),
        (json!({"code": "1", "env": {"A=B": "x"}}), "env"),
        (json!({"code": "1", "env": {"A": "x\u{0}y"}}), "env"),
        (json!({"code": "1", "cwd": "/tmp\u{0}"}), "cwd"),
    ] {
        let reply = exec(&mut stream, request.clone());
        assert_eq!(reply["success"], false, "{request}");
        assert_eq!(reply["code"], "bad_request", "{request}: {reply}");
        assert!(
            reply["error"].as_str().unwrap().contains(field),
            "{request}: {reply}"
        );
    }
    // Limits out of range are named, as SPAWN's are.
    let zero = exec(&mut stream, json!({"code": "1", "limits": {"max_pids": 0}}));
    assert_eq!(zero["code"], "limit_exceeded", "{zero}");
    assert!(zero["error"].as_str().unwrap().contains("limits.max_pids"));
    // A run's CPU limit is a quota per 100 ms; it takes no period.
    let period = exec(
        &mut stream,
        json!({"code": "1", "limits": {"cpu_period": 50000}}),
    );
    assert_eq!(period["code"], "bad_request", "{period}");
    assert!(period["error"]
        .as_str()
        .unwrap()
        .contains("limits.cpu_period"));
    // The connection is still usable.
    assert_eq!(
        exec(&mut stream, json!({"code": "print(1)"}))["stdout"],
        "1\n"
    );
}

#[test]
fn files_go_in_before_the_run_and_collected_ones_come_back() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nmax_file_bytes = 1000\n");
    let mut stream = daemon.raw();
    let code = "data = open('data/in.txt').read()\n\
                open('out.txt', 'w').write(data.upper())\n\
                import os\nos.symlink('/etc/hostname', 'link')\n\
                open('big.bin', 'wb').write(b'x' * 2000)";
    let reply = exec(
        &mut stream,
        json!({
            "code": code,
            "files": {"data/in.txt": "aGVsbG8="},
            "collect": ["out.txt", "link", "big.bin", "missing.txt"],
        }),
    );
    assert_eq!(reply["exit_code"], 0, "{reply}");
    assert_eq!(reply["files"], json!({"out.txt": "SEVMTE8="}), "{reply}");
    let error = reply["error"].as_str().unwrap();
    for problem in ["link", "big.bin: 2000 bytes", "missing.txt: no such file"] {
        assert!(error.contains(problem), "{problem:?} not in {error}");
    }
    let too_big = exec(
        &mut stream,
        json!({"code": "1", "files": {"huge": "QUFB".repeat(400)}}),
    );
    assert_eq!(too_big["code"], "bad_request", "{too_big}");
    assert!(too_big["error"].as_str().unwrap().contains("files"));
    let not_base64 = exec(&mut stream, json!({"code": "1", "files": {"x": "%%%"}}));
    assert_eq!(not_base64["code"], "bad_request", "{not_base64}");
}

#[test]
fn code_larger_than_a_socket_buffer_reaches_its_run_whole() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // Near the request limit: the order goes out over several writes.
    let code = format!("x = '{}'\nprint(len(x))", "a".repeat(900_000));
    let reply = exec(&mut stream, json!({"code": code}));
    assert_eq!(reply["stdout"], "900000\n", "{}", reply["error"]);
}

#[test]
fn collected_files_never_outgrow_the_reply() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // Three files of 6 MiB, each within exec.max_file_bytes (8 MiB): the
    // reply (16 MiB, with base64 a third larger) holds only one of them.
    let code = "for name in 'abc':\n    open(name, 'wb').write(b'x' * (6 << 20))";
    let reply = exec(
        &mut stream,
        json!({"code": code, "collect": ["a", "b", "c"]}),
    );
    assert_eq!(reply["exit_code"], 0, "{}", reply["error"]);
    let files = reply["files"].as_object().unwrap();
    assert_eq!(
        files.len(),
        1,
        "collected {:?}",
        files.keys().collect::<Vec<_>>()
    );
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("would not fit in the reply"),
        "{}",
        reply["error"]
    );
}
