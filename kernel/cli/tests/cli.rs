//! `agentos` end to end against a real agentosd: the commands a new user
//! types in the first hour, what they print, and their exit codes (0 ok,
//! 1 the operation failed, 2 the command line was wrong).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use agentos_test_support::{agent_info, listed_names, Daemon};
use serde_json::Value;

/// What one `agentos` command did.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.stdout))
    }
}

/// Runs `agentos --socket <daemon's> ARGS`.
fn agentos(daemon: &Daemon, args: &[&str]) -> Ran {
    let Output {
        status,
        stdout,
        stderr,
    } = std::process::Command::new(env!("CARGO_BIN_EXE_agentos"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .output()
        .unwrap();
    Ran {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

/// Runs a command that must succeed; its stdout.
fn ok(daemon: &Daemon, args: &[&str]) -> String {
    let ran = agentos(daemon, args);
    assert_eq!(ran.code, 0, "{args:?}: {}{}", ran.stdout, ran.stderr);
    ran.stdout
}

/// `/workspace/f` of session s1, as `agentos exec` prints it.
fn workspace_file_of_s1(daemon: &Daemon) -> String {
    let code = "print(open('/workspace/f').read())";
    ok(daemon, &["exec", "--session", "s1", code])
}

fn id_of(daemon: &Daemon, name: &str) -> u64 {
    let spawned = agentos(daemon, &["--json", "spawn", name, "--", "/bin/sleep", "30"]);
    assert_eq!(spawned.code, 0, "{}", spawned.stderr);
    spawned.json()["id"].as_u64().unwrap()
}

#[test]
fn kill_wait_frees_the_name_at_once_and_stop_always_waits() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for _ in 0..3 {
        let id = id_of(&daemon, "again");
        ok(&daemon, &["kill", "again", "--wait", "--grace-ms", "0"]);
        assert_eq!(agent_info(&mut client, id)["state"], "killed");
    }
    let id = id_of(&daemon, "polite");
    let said = ok(&daemon, &["stop", "polite"]);
    assert!(said.contains("stopped: killed"), "{said}");
    assert_eq!(agent_info(&mut client, id)["state"], "killed");
    let waited = agentos(
        &daemon,
        &["--json", "kill", "--wait", &id_of(&daemon, "j").to_string()],
    );
    assert_eq!(waited.json()["state"], "killed", "{}", waited.stdout);
}

#[test]
fn ps_inspect_restart_and_rm_follow_an_agent_through_its_life() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let id = id_of(&daemon, "worker");
    ok(
        &daemon,
        &[
            "spawn",
            "--restart",
            "on-failure",
            "other",
            "--",
            "/bin/sleep",
            "30",
        ],
    );

    let table = ok(&daemon, &["ps"]);
    assert!(table.lines().next().unwrap().contains("NAME"), "{table}");
    assert!(
        table.contains("worker") && table.contains("other"),
        "{table}"
    );
    let filtered = agentos(&daemon, &["--json", "ps", "--filter", "name=work"]).json();
    assert_eq!(filtered.as_array().unwrap().len(), 1, "{filtered}");
    assert_eq!(filtered[0]["name"], "worker");

    let text = ok(&daemon, &["inspect", "worker"]);
    for line in [
        &format!("agent {id} (worker): running"),
        "command:     /bin/sleep 30",
        "network:     loopback only",
        "permissions: think, exec, task; tools *; LLM tokens unlimited",
        "restarts:    0 so far; policy never, at most",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(text.contains("limits:      memory"), "{text}");
    assert!(text.contains("isolation:   namespaces"), "{text}");
    let inspected = agentos(&daemon, &["inspect", "--json", "other"]).json();
    assert_eq!(inspected[0]["restart_policy"], "on-failure", "{inspected}");
    assert_eq!(inspected[0]["command"][0], "/bin/sleep");

    let pid = agent_info(&mut client, id)["pid"].clone();
    let restarted = ok(&daemon, &["restart", "worker", "--grace-ms", "0"]);
    assert!(restarted.contains("restarted: running"), "{restarted}");
    let info = agent_info(&mut client, id);
    assert_eq!(
        (info["state"].as_str(), info["restarts"].as_u64()),
        (Some("running"), Some(1))
    );
    assert_ne!(info["pid"], pid);

    let refused = agentos(&daemon, &["rm", "worker"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("stop it first"),
        "{}",
        refused.stderr
    );
    ok(&daemon, &["stop", "other", "--grace-ms", "0"]);
    let live = ok(&daemon, &["ps"]);
    assert!(
        !live.contains("other"),
        "ps shows live agents only:\n{live}"
    );
    let all = ok(&daemon, &["ps", "-a"]);
    assert!(all.contains("other") && all.contains("killed"), "{all}");
    let killed = agentos(&daemon, &["--json", "ps", "--filter", "state=killed"]).json();
    assert_eq!(killed.as_array().unwrap().len(), 1, "{killed}");

    let removed = ok(&daemon, &["rm", "other"]);
    assert!(removed.contains("removed agent"), "{removed}");
    // Nothing of a name goes while one of its agents runs, unless -f.
    ok(&daemon, &["stop", "worker", "--grace-ms", "0"]);
    let second = id_of(&daemon, "worker");
    assert_eq!(agentos(&daemon, &["rm", "worker"]).code, 1);
    let both = agentos(&daemon, &["--json", "ps", "-a", "--filter", "name=worker"]).json();
    assert_eq!(both.as_array().unwrap().len(), 2, "{both}");
    let forced = agentos(
        &daemon,
        &["--json", "rm", "-f", "--grace-ms", "0", "worker"],
    )
    .json();
    assert_eq!(forced.as_array().unwrap().len(), 2, "{forced}");
    assert_eq!(
        forced[1],
        serde_json::json!({"success": true, "removed": true, "id": second})
    );
    assert!(
        listed_names(&mut client).is_empty(),
        "{:?}",
        listed_names(&mut client)
    );
}

#[test]
fn errors_speak_the_clis_terms_and_exit_codes_say_which_kind() {
    let daemon = Daemon::start();
    for args in [
        &["kill", "nobody"][..],
        &["inspect", "nobody"],
        &["restart", "nobody"],
        &["rm", "nobody"],
        &["logs", "nobody"],
    ] {
        let ran = agentos(&daemon, args);
        assert_eq!(ran.code, 1, "{args:?}: {}", ran.stderr);
        assert_eq!(
            ran.stderr, "agentos: no agent named 'nobody' (agentos ps -a lists them)\n",
            "{args:?}"
        );
    }
    let by_id = agentos(&daemon, &["stop", "4242"]);
    assert_eq!(
        by_id.stderr,
        "agentos: no agent with id 4242 (agentos ps -a lists them)\n"
    );
    for args in [
        &["ps", "--filter", "colour=red"][..],
        &["ps", "--filter", "state=asleep"],
        &["task", "wait", "t-1", "--timeout-ms", "5"],
        &["call", "x.y", "--timeout-ms", "5"],
        &["exec", "--run-timeout", "-1", "print(1)"],
        &["--timeout", "0", "ps"],
        &["spawn", "w", "--env", "NOEQUALS", "--", "/bin/true"],
        &["--json", "completion", "bash"],
        &["no-such-command"],
    ] {
        let ran = agentos(&daemon, args);
        assert_eq!(ran.code, 2, "{args:?} is a usage error: {}", ran.stderr);
    }
}

#[test]
fn completion_scripts_name_the_commands_for_each_shell() {
    let daemon = Daemon::start();
    let bash = ok(&daemon, &["completion", "bash"]);
    assert!(
        bash.contains("_agentos") && bash.contains("inspect"),
        "{bash}"
    );
    let zsh = ok(&daemon, &["completion", "zsh"]);
    assert!(zsh.starts_with("#compdef agentos"), "{zsh}");
    let fish = ok(&daemon, &["completion", "fish"]);
    assert!(fish.contains("complete -c agentos"), "{fish}");
}

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn call_types_each_argument_as_the_tools_schema_says() {
    let script = repo().join("kernel/tests/mcp_faults.py");
    let daemon = Daemon::start_with(&format!(
        "[mcp.servers.faulty]\ncommand = \"/usr/bin/python3\"\nargs = [\"{}\", \"serve\"]\n",
        script.display()
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok(&daemon, &["tools"]).contains("server faulty ready") {
        assert!(Instant::now() < deadline, "{}", ok(&daemon, &["tools"]));
        std::thread::sleep(Duration::from_millis(100));
    }
    // `from` and `to` are strings: sent as typed, not read as JSON (which
    // would make them 1.5 and True on the server's side).
    assert_eq!(
        ok(&daemon, &["call", "faulty.send", "from=1.50", "to=true"]),
        "1.50->true\n"
    );
    // `a` and `b` are numbers.
    assert_eq!(
        ok(&daemon, &["call", "faulty.get-sum", "a=1.5", "b=2"]),
        "3.5\n"
    );
    let refused = agentos(&daemon, &["call", "faulty.get-sum", "a=one", "b=2"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("`a` is a number"),
        "{}",
        refused.stderr
    );
    let reply = agentos(&daemon, &["--json", "call", "faulty.send", "from=x"]).json();
    assert_eq!(reply["success"], true, "{reply}");
}

#[test]
fn sessions_snapshot_restore_and_tasks_read_as_text() {
    let daemon = Daemon::start();
    let write = |text: &str| {
        let code = format!("open('/workspace/f', 'w').write('{text}')");
        ok(&daemon, &["exec", "--session", "s1", &code]);
    };
    write("one");
    let taken = ok(&daemon, &["snapshot", "s1", "before"]);
    assert!(taken.contains("agentos restore s1 before"), "{taken}");
    write("two");
    ok(&daemon, &["restore", "s1", "before"]);
    let read = workspace_file_of_s1(&daemon);
    assert_eq!(read, "one\n");
    let sessions = ok(&daemon, &["sessions"]);
    let line = sessions.lines().nth(1).unwrap();
    assert!(line.starts_with("s1 "), "{sessions}");
    assert!(
        line.split_whitespace().nth(1) == Some("ready"),
        "{sessions}"
    );
    assert_eq!(
        agentos(&daemon, &["--json", "sessions"]).json()["sessions"][0]["session"],
        "s1"
    );
    let listed = ok(&daemon, &["snapshot", "s1", "--list"]);
    assert!(listed.contains("before"), "{listed}");
    let closed = ok(&daemon, &["sessions", "--close", "s1"]);
    assert!(closed.contains("session 's1' closed"), "{closed}");
    let gone = agentos(&daemon, &["sessions", "--close", "s1"]);
    assert_eq!(gone.code, 1, "{}", gone.stderr);
    let missing = agentos(&daemon, &["restore", "nope", "before"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("agentos sessions lists yours"),
        "{}",
        missing.stderr
    );

    let task = ok(&daemon, &["task", "dispatch", "print(41 + 1)"]);
    let task = task.trim();
    assert_eq!(ok(&daemon, &["task", "wait", task]), "42\n");
    let status = ok(&daemon, &["task", "status", task]);
    assert!(
        status.starts_with(&format!("task {task} (exec): completed\n")),
        "{status}"
    );
    assert!(!status.contains('{'), "text, not JSON: {status}");
    let raw = agentos(&daemon, &["task", "status", task, "--json"]).json();
    assert_eq!(raw["task"]["state"], "completed", "{raw}");

    // The global --timeout is how long `task wait` waits; the task goes on.
    let slow = ok(
        &daemon,
        &["task", "dispatch", "import time; time.sleep(30)"],
    );
    let started = Instant::now();
    let waited = agentos(&daemon, &["--timeout", "1", "task", "wait", slow.trim()]);
    assert_eq!(waited.code, 1, "{}", waited.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        waited.stderr.contains("is running") || waited.stderr.contains("is queued"),
        "{}",
        waited.stderr
    );
}

#[test]
fn run_with_a_session_leaves_its_workspace_to_that_session() {
    use agentos_test_support::llm_stub::{Reply, Stub};
    let stub = Stub::start(|_, n| {
        let content = match n {
            0 => "```python\nopen('/workspace/f', 'w').write('kept')\n```",
            _ => "Written.",
        };
        Reply::openai(content, 10, 5)
    });
    let daemon = agentos_test_support::with_llm_stub(&stub.url(), "");
    let answer = ok(&daemon, &["run", "--session", "s1", "write the file"]);
    assert_eq!(answer, "Written.\n");
    let read = workspace_file_of_s1(&daemon);
    assert_eq!(read, "kept\n", "the run's code ran in session s1");
}

#[test]
fn exec_file_runs_a_files_code_and_a_files_name_as_code_is_refused() {
    let daemon = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("hello.py");
    std::fs::write(&python, "print('hi from', 'python')\n").unwrap();
    let bash = dir.path().join("hello.sh");
    std::fs::write(&bash, "echo \"hi from $0\" | cut -c1-7\n").unwrap();
    let python = python.to_str().unwrap();
    let bash = bash.to_str().unwrap();
    assert_eq!(ok(&daemon, &["exec", "--file", python]), "hi from python\n");
    assert_eq!(ok(&daemon, &["exec", "--file", bash]), "hi from\n");

    let refused = agentos(&daemon, &["exec", python]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.starts_with(&format!(
            "agentos: `{python}` is a file here; to run its contents use --file {python}\n"
        )),
        "{}",
        refused.stderr
    );
    let missing = agentos(&daemon, &["exec", "--file", "/nonexistent/x.py"]);
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("reading /nonexistent/x.py: "),
        "{}",
        missing.stderr
    );
}

#[test]
fn think_with_its_provider_down_says_so_with_the_kernels_reason() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let daemon = Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
         api_key = \"sk-test\"\nmodel = \"m\"\n"
    ));
    let ran = agentos(&daemon, &["think", "hi"]);
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.starts_with(&format!(
            "agentos: the kernel's LLM provider cannot answer: cannot connect to openai at \
             127.0.0.1:{port}"
        )),
        "{}",
        ran.stderr
    );
    assert!(
        !ran.stderr.contains("not available on this kernel"),
        "{}",
        ran.stderr
    );
}

#[test]
fn send_puts_json_or_text_in_an_agents_mailbox_by_name_or_id() {
    let daemon = Daemon::start();
    let id = id_of(&daemon, "inbox");
    let said = ok(&daemon, &["send", "inbox", r#"{"task": 1}"#]);
    assert_eq!(said.trim(), format!("sent to {id}"));
    let by_id = agentos(&daemon, &["--json", "send", &id.to_string(), "plain words"]);
    assert_eq!(by_id.json()["delivered_to"], id, "{}", by_id.stderr);
    let nobody = agentos(&daemon, &["send", "nobody-here", "x"]);
    assert_eq!(nobody.code, 1, "{}{}", nobody.stdout, nobody.stderr);
    assert!(nobody.stderr.contains("nobody-here"), "{}", nobody.stderr);
}

#[test]
fn audit_prints_what_was_done_and_by_whom_oldest_first() {
    let daemon = Daemon::start();
    let id = id_of(&daemon, "audited");
    ok(&daemon, &["kill", "audited", "--wait", "--grace-ms", "0"]);
    let id = id.to_string();
    let printed = ok(
        &daemon,
        &["audit", "--category", "agent_lifecycle", "--agent", &id],
    );
    let kinds: Vec<&str> = printed
        .lines()
        .map(|line| line.split_whitespace().nth(3).unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["AGENT_SPAWNED", "AGENT_KILLED", "AGENT_EXITED"],
        "{printed}"
    );
    assert!(
        printed.lines().next().unwrap().contains("audited"),
        "{printed}"
    );
    assert!(
        printed.lines().next().unwrap().contains("by uid"),
        "{printed}"
    );
    let paged = agentos(&daemon, &["audit", "-n", "1"]);
    assert_eq!(paged.code, 0, "{}", paged.stderr);
    assert!(paged.stderr.contains("--since 1"), "{}", paged.stderr);
    let json = agentos(&daemon, &["--json", "audit", "--since", "1"]).json();
    assert_eq!(json["entries"][0]["id"], 2, "{json}");
    let wrong = agentos(&daemon, &["audit", "--category", "everything"]);
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
}

/// Runs `agentos --socket <daemon's> ARGS` while emitting CUSTOM events
/// of `custom_type` until it exits (it must subscribe first to hear any).
fn events_while_emitting(daemon: &Daemon, args: &[&str], custom_type: &str) -> Ran {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_agentos"));
    command.arg("--socket").arg(&daemon.socket).args(args);
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = daemon.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "agentos {args:?} did not end");
        let emit = serde_json::json!({"event_type": custom_type, "data": {"n": 1}});
        client
            .call(agentos_proto::Opcode::EMIT, emit.to_string().as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    Ran {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

#[test]
fn events_prints_what_it_subscribed_to_one_a_line_and_stops_after_n() {
    let daemon = Daemon::start();
    let ran = events_while_emitting(
        &daemon,
        &["--json", "events", "-n", "2", "job.done"],
        "job.done",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<Value> = ran
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", ran.stdout);
    assert!(lines
        .iter()
        .all(|e| e["type"] == "CUSTOM" && e["custom_type"] == "job.done"));
    let human = events_while_emitting(&daemon, &["events", "-n", "1"], "note");
    assert_eq!(human.code, 0, "{}", human.stderr);
    assert!(
        human.stdout.contains(" CUSTOM:note (from "),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains(r#""n":1"#), "{}", human.stdout);
    let refused = agentos(&daemon, &["events", "AGENT_EXITED", ""]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
}
