//! Sessions and their snapshots: an interpreter and workspace kept between
//! runs for their owner alone, their timeouts, restores that follow no
//! symlink and leave nothing outside the workspace, and the caps on
//! sessions and snapshots.

use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, call_json, require_root, Daemon};
use serde_json::{json, Value};

use crate::{exec, sorted};

#[test]
fn a_session_keeps_its_interpreter_and_workspace_and_only_its_owner_sees_it() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nmax_sessions = 2\n");
    let mut stream = daemon.raw();
    let first = exec(
        &mut stream,
        json!({"code": "import os\ncount = 1\nopen('notes.txt', 'w').write('kept')\nprint(os.getpid())", "session": "s1"}),
    );
    assert_eq!(first["success"], true, "{first}");
    assert_eq!(first["session"], "s1");
    let second = exec(
        &mut stream,
        json!({"code": "count += 1\nprint(count, open('notes.txt').read())", "session": "s1"}),
    );
    assert_eq!(second["stdout"], "2 kept\n", "{second}");
    // A sessionless run, and another session, see none of it.
    let fresh = exec(
        &mut stream,
        json!({"code": "import os\nprint('count' in globals(), os.path.exists('notes.txt'))"}),
    );
    assert_eq!(fresh["stdout"], "False False\n");
    let other = exec(
        &mut stream,
        json!({"code": "import os\nprint('count' in globals(), os.path.exists('notes.txt'))", "session": "s2"}),
    );
    assert_eq!(other["stdout"], "False False\n");
    // The cap per owner.
    let third = exec(&mut stream, json!({"code": "1", "session": "s3"}));
    assert_eq!(third["code"], "limit_exceeded", "{third}");
    let listed = call_json(&mut stream, Opcode::EXEC, br#"{"op":"sessions"}"#);
    let names: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"], "{listed}");
    assert_eq!(listed["sessions"][0]["runs"], 2);
    assert_eq!(listed["sessions"][0]["workspace_bytes"], 4);
    // Another connection of the same uid reaches the same sessions.
    let mut again = daemon.raw();
    let third_run = exec(&mut again, json!({"code": "print(count)", "session": "s1"}));
    assert_eq!(third_run["stdout"], "2\n");
    let closed = call_json(
        &mut stream,
        Opcode::EXEC,
        br#"{"op":"close","session":"s1"}"#,
    );
    assert_eq!(closed, json!({"success": true, "closed": true}));
    let reopened = exec(
        &mut stream,
        json!({"code": "print('count' in globals())", "session": "s1"}),
    );
    assert_eq!(
        reopened["stdout"], "False\n",
        "a closed session comes back fresh"
    );
    let unknown = call_json(
        &mut stream,
        Opcode::EXEC,
        br#"{"op":"close","session":"nope"}"#,
    );
    assert_eq!(unknown["closed"], false);
}

#[test]
fn a_session_killed_at_its_timeout_ends_and_the_next_run_starts_fresh() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    exec(&mut stream, json!({"code": "x = 1", "session": "s"}));
    let timed = exec(
        &mut stream,
        json!({"code": "while True: pass", "session": "s", "timeout_ms": 300}),
    );
    assert_eq!(timed["timed_out"], true, "{timed}");
    let after = exec(
        &mut stream,
        json!({"code": "print('x' in globals())", "session": "s"}),
    );
    assert_eq!(after["stdout"], "False\n", "{after}");
}

#[test]
fn a_snapshot_restores_a_sessions_files_into_a_fresh_interpreter_following_no_symlink() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let setup = concat!(
        "import os\n",
        "os.makedirs('sub')\n",
        "open('a.txt', 'w').write('one')\n",
        "open('sub/b.bin', 'wb').write(b'12345')\n",
        "os.symlink('/etc', 'etc-link')\n",
        "os.symlink('/etc/passwd', 'pw')\n",
        "os.mkfifo('fifo')\n",
        "x = 41\n"
    );
    let ran = exec(&mut stream, json!({"code": setup, "session": "s"}));
    assert_eq!(ran["success"], true, "{ran}");
    let taken = exec(
        &mut stream,
        json!({"op": "snapshot", "session": "s", "name": "before"}),
    );
    assert_eq!(taken["success"], true, "{taken}");
    assert_eq!(taken["snapshot"]["name"], "before");
    // Its files, and the session's environment beside them.
    assert!(taken["snapshot"]["bytes"].as_u64().unwrap() >= 8, "{taken}");
    assert!(taken["snapshot"]["created_at"].is_string());
    assert_eq!(sorted(&taken["left_out"]), ["etc-link", "fifo", "pw"]);
    exec(
        &mut stream,
        json!({"code": "import shutil; open('a.txt', 'w').write('two'); shutil.rmtree('sub'); x = 42",
               "session": "s"}),
    );
    let listed = exec(&mut stream, json!({"op": "snapshots", "session": "s"}));
    assert_eq!(listed["snapshots"][0]["name"], "before", "{listed}");
    let restored = exec(
        &mut stream,
        json!({"op": "restore", "session": "s", "name": "before"}),
    );
    assert_eq!(restored["success"], true, "{restored}");
    let after = exec(
        &mut stream,
        json!({"code": "import os; print(open('a.txt').read(), open('sub/b.bin').read(), \
                        sorted(os.listdir('.')), 'x' in globals())",
               "session": "s"}),
    );
    assert_eq!(
        after["stdout"], "one 12345 ['a.txt', 'sub'] False\n",
        "the files come back, the interpreter is fresh: {after}"
    );
    let sessions = exec(&mut stream, json!({"op": "sessions"}));
    assert_eq!(
        sessions["sessions"][0]["runs"], 3,
        "the session carries on, counting runs of code: {sessions}"
    );
    let missing = exec(
        &mut stream,
        json!({"op": "restore", "session": "s", "name": "nope"}),
    );
    assert_eq!(missing["code"], "not_found", "{missing}");
    let nowhere = exec(
        &mut stream,
        json!({"op": "snapshot", "session": "none", "name": "x"}),
    );
    assert_eq!(nowhere["code"], "not_found", "{nowhere}");
    // Closing the session deletes its snapshots.
    exec(&mut stream, json!({"op": "close", "session": "s"}));
    let gone = exec(&mut stream, json!({"op": "snapshots", "session": "s"}));
    assert_eq!(gone["code"], "not_found", "{gone}");
}

/// A session's code controls its interpreter, so it can save whatever it
/// likes as its globals. The kernel keeps those bytes without reading
/// them, and a restore loads them only in the session's own interpreter:
/// a forgery changes nothing but that session's globals, and says so.
#[test]
fn a_forged_state_is_loaded_only_by_its_own_session() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let forge = concat!(
        "import os, sys\n",
        "def forged(scope, fd):\n",
        "    with os.fdopen(fd, 'wb') as sink:\n",
        "        sink.write(b'not a pickle at all')\n",
        "    return {'exit_code': 0, 'error': None, 'left_out': ['../../etc/passwd']}\n",
        "sys.modules['__main__'].save_state = forged\n",
        "open('kept.txt', 'w').write('kept')\n"
    );
    let ran = exec(&mut stream, json!({"code": forge, "session": "f"}));
    assert_eq!(ran["success"], true, "{ran}");
    let taken = exec(
        &mut stream,
        json!({"op": "snapshot", "session": "f", "name": "forged", "state": true}),
    );
    assert_eq!(taken["success"], true, "{taken}");
    assert_eq!(taken["snapshot"]["state"], true, "{taken}");
    let restored = exec(
        &mut stream,
        json!({"op": "restore", "session": "f", "name": "forged"}),
    );
    assert_eq!(restored["success"], true, "{restored}");
    let left_out = restored["left_out"].to_string();
    assert!(left_out.contains("cannot be read"), "{restored}");
    let look = exec(
        &mut stream,
        json!({"code": "print(open('kept.txt').read(), 'forged' in globals())", "session": "f"}),
    );
    assert_eq!(look["stdout"], "kept False\n", "{look}");
}

/// A restore given a child with a shell started stops the shell (it holds
/// the output pipes the kernel waits on) and finishes.
#[test]
fn a_restore_on_a_child_with_a_shell_finishes() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon =
        Daemon::start_with("[exec]\nready_runs = 1\nready_shells = 1\ndefault_timeout_ms = 5000\n");
    let mut stream = daemon.raw();
    // Bash runs have come: every child prepared from now on has a shell.
    exec(&mut stream, json!({"language": "bash", "code": "true"}));
    std::thread::sleep(Duration::from_millis(300));
    let ran = exec(
        &mut stream,
        json!({"code": "open('kept.txt', 'w').write('yes')", "session": "s"}),
    );
    assert_eq!(ran["success"], true, "{ran}");
    let taken = exec(
        &mut stream,
        json!({"op": "snapshot", "session": "s", "name": "n"}),
    );
    assert_eq!(taken["success"], true, "{taken}");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let restored = exec(
        &mut stream,
        json!({"op": "restore", "session": "s", "name": "n"}),
    );
    assert_eq!(restored["success"], true, "{restored}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let after = exec(
        &mut stream,
        json!({"code": "print(open('kept.txt').read())", "session": "s"}),
    );
    assert_eq!(after["stdout"], "yes\n", "{after}");
}

#[test]
fn snapshots_stay_within_what_an_owner_and_the_kernel_may_keep() {
    require_root!("EXEC (its isolation needs namespaces)");
    for (config, named) in [
        ("[exec]\nsnapshot_bytes = 100\n", "(exec.snapshot_bytes)"),
        (
            "[exec]\nsnapshot_bytes_total = 100\n",
            "(exec.snapshot_bytes_total",
        ),
    ] {
        let daemon = Daemon::start_with(config);
        let mut stream = daemon.raw();
        exec(
            &mut stream,
            json!({"code": "import os; open('r.bin', 'wb').write(os.urandom(4096))", "session": "s"}),
        );
        let taken = exec(
            &mut stream,
            json!({"op": "snapshot", "session": "s", "name": "big"}),
        );
        assert_eq!(taken["code"], "limit_exceeded", "{config}: {taken}");
        assert!(
            taken["error"].as_str().unwrap().contains(named),
            "{config}: {taken}"
        );
        let listed = exec(&mut stream, json!({"op": "snapshots", "session": "s"}));
        assert_eq!(listed["snapshots"], json!([]), "nothing kept: {listed}");
    }
}

/// New sessions whose first runs are still waiting for a sandbox count
/// against the owner's cap: sending many at once opens no more.
#[test]
fn sessions_waiting_to_open_count_against_the_cap() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nmax_sessions = 2\nready_runs = 1\n");
    let mut stream = daemon.raw();
    // The host is up once one run has gone through.
    exec(&mut stream, json!({"code": "1"}));
    for i in 0..6 {
        let request = json!({"code": "import time; time.sleep(0.2)", "session": format!("p{i}")});
        support::send(&mut stream, Opcode::EXEC, request.to_string().as_bytes());
    }
    let replies: Vec<Value> = (0..6).map(|_| support::recv_json(&mut stream).1).collect();
    let opened = replies.iter().filter(|r| r["success"] == true).count();
    let refused = replies
        .iter()
        .filter(|r| r["code"] == "limit_exceeded")
        .count();
    assert_eq!((opened, refused), (2, 4), "{replies:?}");
    let listed = exec(&mut stream, json!({"op": "sessions"}));
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2, "{listed}");
}

/// Children kept by sessions never hold up new ones: with one run kept
/// prepared, three sessions open one after another and a sessionless run
/// still goes through.
#[test]
fn sessions_never_starve_other_runs() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nready_runs = 1\ndefault_timeout_ms = 5000\n");
    let mut stream = daemon.raw();
    for name in ["a", "b", "c"] {
        let opened = exec(&mut stream, json!({"code": "x = 1", "session": name}));
        assert_eq!(opened["success"], true, "session {name}: {opened}");
    }
    let free = exec(&mut stream, json!({"code": "print('through')"}));
    assert_eq!(free["stdout"], "through\n", "{free}");
}

/// A second run for a session whose first run still waits opens nothing
/// new: it is not refused for the cap that session already counts in.
#[test]
fn runs_for_a_session_about_to_open_are_not_refused() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nmax_sessions = 1\nready_runs = 1\n");
    let mut stream = daemon.raw();
    exec(&mut stream, json!({"code": "1"}));
    // A sessionless run holds the one prepared child; the session's runs
    // wait, the first of them to open it.
    let busy = json!({"code": "import time; time.sleep(0.3)"});
    support::send(&mut stream, Opcode::EXEC, busy.to_string().as_bytes());
    for code in ["x = 1", "print(x)"] {
        let request = json!({"code": code, "session": "only"});
        support::send(&mut stream, Opcode::EXEC, request.to_string().as_bytes());
    }
    let replies: Vec<Value> = (0..3).map(|_| support::recv_json(&mut stream).1).collect();
    assert!(replies.iter().all(|r| r["success"] == true), "{replies:?}");
    assert_eq!(replies[2]["stdout"], "1\n", "{replies:?}");
}
