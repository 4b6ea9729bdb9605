//! The kernel as a system service: boot agents (`[[agents.boot]]`), SIGHUP
//! reloading what is safe to change, and the systemd notifications, against
//! a real agentosd.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{self as support, call_json, request, until, Daemon};
use serde_json::{json, Value};

const SOON: Duration = Duration::from_secs(20);

fn list(daemon: &Daemon) -> Vec<Value> {
    let mut client = daemon.client();
    request(&mut client, Opcode::LIST, &json!({}))
        .as_array()
        .unwrap()
        .clone()
}

/// The live agent named `name`, if there is one.
fn live(daemon: &Daemon, name: &str) -> Option<Value> {
    list(daemon).into_iter().find(|a| {
        a["name"] == name
            && matches!(
                a["state"].as_str(),
                Some("starting" | "running" | "paused" | "restarting")
            )
    })
}

fn running(daemon: &Daemon, name: &str) -> Value {
    let mut found = None;
    until(&format!("boot agent {name} running"), SOON, || {
        found = live(daemon, name).filter(|a| a["state"] == "running");
        found.is_some()
    });
    found.unwrap()
}

fn boot_entry(name: &str, command: &str, extra: &str) -> String {
    format!("[[agents.boot]]\nname = \"{name}\"\ncommand = {command}\n{extra}\n")
}

fn sleeper(name: &str, seconds: u32) -> String {
    boot_entry(name, &format!("[\"/bin/sleep\", \"{seconds}\"]"), "")
}

#[test]
fn boot_agents_start_with_the_kernel_and_restart_by_policy() {
    let config = format!(
        "{}{}",
        sleeper("steady", 1000),
        boot_entry(
            "flaky",
            "[\"/bin/sh\", \"-c\", \"sleep 0.2; exit 3\"]",
            "restart_policy = \"on-failure\"\nmax_restarts = 2\nrestart_window = 60\n\
             limits = { memory = 67108864, max_pids = 16 }"
        )
    );
    let daemon = Daemon::start_with(&config);
    let steady = running(&daemon, "steady");
    assert_eq!(steady["boot"], true, "{steady}");
    // Restarted by its policy, twice, then given up on.
    let mut flaky = Value::Null;
    until("flaky restarted twice and failed", SOON, || {
        flaky = list(&daemon)
            .into_iter()
            .find(|a| a["name"] == "flaky")
            .unwrap();
        flaky["restarts"] == 2 && flaky["state"] == "failed"
    });
    assert_eq!(flaky["boot"], true, "{flaky}");
    assert_eq!(flaky["exit_code"], 3, "{flaky}");
    assert_eq!(flaky["limits"]["memory"], 67108864, "{flaky}");
    // An operator's agent is not a boot agent.
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "mine", "command": ["/bin/sleep", "1000"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    assert_eq!(running(&daemon, "mine")["boot"], false);
    assert!(daemon.log().contains("boot agent \"steady\" started"));
    // No agent may take a boot agent's name, even while that agent is down
    // (an operator may: the config is theirs).
    let (_, replies) = support::act(
        &daemon,
        "squatter",
        json!({"permissions": {"spawn": true}}),
        json!([[0x10, {"name": "flaky", "command": ["/bin/sleep", "1000"]}]]),
    );
    let refused = &replies[0]["reply"];
    assert_eq!(refused["code"], "already_exists", "{refused}");
    assert!(refused["error"]
        .as_str()
        .unwrap()
        .contains("reserved for a boot agent"));
    assert!(live(&daemon, "flaky").is_none());
}

/// A start-up that must fail, and what it said.
fn refused(config: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agentos.sock");
    let mut daemon = Daemon::spawn_at(dir, socket.clone(), config);
    let status = daemon.wait(SOON);
    assert!(!socket.exists(), "a refused kernel left its socket");
    (status.code().unwrap_or(-1), daemon.log())
}

#[test]
fn a_bad_boot_entry_is_a_start_up_error_naming_it() {
    let (code, log) = refused(&format!(
        "{}{}",
        sleeper("fine", 10),
        boot_entry("ghost", "[\"/nonexistent/agent\"]", "")
    ));
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("agents.boot[1] (\"ghost\")"), "{log}");
    assert!(log.contains("/nonexistent/agent"), "{log}");
    assert!(!log.contains("boot agent \"fine\" started"), "{log}");
    // It never claimed to serve.
    assert!(!log.contains("listening"), "{log}");
    // --check-config says the same without starting.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agentosd.toml");
    std::fs::write(&file, boot_entry("ghost", "[\"/nonexistent/agent\"]", "")).unwrap();
    let checked = std::process::Command::new(support::agentosd())
        .arg("--config")
        .arg(&file)
        .arg("--check-config")
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(2));
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(said.contains("agents.boot[0] (\"ghost\")"), "{said}");

    for (entry, says) in [
        (
            boot_entry("typo", "[\"/bin/true\"]", "restart_polcy = \"always\""),
            "restart_polcy",
        ),
        (
            boot_entry("bad name!", "[\"/bin/true\"]", ""),
            "agents.boot[0]",
        ),
        (
            boot_entry("big", "[\"/bin/true\"]", "limits = { memory = 1 }"),
            "memory",
        ),
        (
            format!("{}{}", sleeper("twin", 1), sleeper("twin", 2)),
            "another boot agent",
        ),
    ] {
        let (code, log) = refused(&entry);
        assert_eq!(code, 2, "{entry}: {log}");
        assert!(log.contains(says), "{entry}: {log}");
    }
}

#[test]
fn sighup_applies_boot_agent_changes_and_names_what_needs_a_restart() {
    let daemon = Daemon::start_with(&format!(
        "{}{}{}{}",
        sleeper("removed", 1000),
        sleeper("changed", 1000),
        sleeper("kept", 1000),
        sleeper("revived", 1000)
    ));
    let removed = running(&daemon, "removed");
    let changed = running(&daemon, "changed");
    let kept = running(&daemon, "kept");
    // An operator's agent under the name of an entry the reload adds is
    // not touched, and the entry waits.
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "operators", "command": ["/bin/sleep", "1000"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");

    // A boot agent KILLed by hand starts again on reload, as declared.
    let revived = running(&daemon, "revived");
    let killed = request(
        &mut client,
        Opcode::KILL,
        &json!({"name": "revived", "grace_ms": 0}),
    );
    assert_eq!(killed["killed"], true, "{killed}");
    until("revived killed", SOON, || {
        live(&daemon, "revived").is_none()
    });

    let reloaded = format!(
        "[exec]\ndefault_timeout_ms = 12345\n{}{}{}{}{}",
        sleeper("changed", 2000),
        sleeper("kept", 1000),
        sleeper("added", 1000),
        sleeper("revived", 1000),
        sleeper("operators", 5)
    );
    daemon.rewrite_config(&reloaded);
    daemon.signal(libc::SIGHUP);
    running(&daemon, "added");
    until("the removed boot agent stopped", SOON, || {
        live(&daemon, "removed").is_none()
    });
    let mut renewed = Value::Null;
    until("the changed boot agent restarted", SOON, || {
        renewed = live(&daemon, "changed").unwrap_or(Value::Null);
        renewed["state"] == "running" && renewed["id"] != changed["id"]
    });
    assert_eq!(renewed["boot"], true);
    assert_eq!(live(&daemon, "kept").unwrap()["id"], kept["id"]);
    assert_ne!(running(&daemon, "revived")["id"], revived["id"]);
    let operators = live(&daemon, "operators").unwrap();
    assert_eq!(operators["id"], spawned["id"], "{operators}");
    assert_eq!(operators["boot"], false, "{operators}");
    let ended = list(&daemon)
        .into_iter()
        .find(|a| a["id"] == removed["id"])
        .unwrap();
    assert_eq!(ended["state"], "killed", "{ended}");
    let log = daemon.log();
    assert!(
        log.contains("SIGHUP: configuration reloaded; applied: agents.boot"),
        "{log}"
    );
    assert!(log.contains("only after a restart: [exec]"), "{log}");
    assert!(
        log.contains("boot agent \"operators\" not started"),
        "{log}"
    );

    // Nothing changed in the file, but a boot agent that is down comes back.
    let killed = request(
        &mut client,
        Opcode::KILL,
        &json!({"name": "kept", "grace_ms": 0}),
    );
    assert_eq!(killed["killed"], true, "{killed}");
    until("kept killed", SOON, || live(&daemon, "kept").is_none());
    daemon.signal(libc::SIGHUP);
    let back = running(&daemon, "kept");
    assert_ne!(back["id"], kept["id"]);
    assert_eq!(back["boot"], true);
    // The kernel still serves.
    assert_eq!(
        call_json(&mut daemon.raw(), Opcode::HELLO, b"")["success"],
        true
    );

    // A configuration that does not load changes nothing.
    daemon.rewrite_config("[[agents.boot]]\nname = \"broken\"\n");
    daemon.signal(libc::SIGHUP);
    until("the failed reload logged", SOON, || {
        daemon.log().contains("the configuration was not reloaded")
    });
    assert!(live(&daemon, "added").is_some());
    assert!(live(&daemon, "broken").is_none());
}

#[test]
fn sighup_takes_up_a_new_llm_provider() {
    let daemon = Daemon::start();
    let think = |daemon: &Daemon| call_json(&mut daemon.raw(), Opcode::THINK, b"hi");
    assert_eq!(think(&daemon)["code"], "unavailable");
    let stub = Stub::start(|_, _| Reply::openai("reloaded", 3, 1));
    daemon.rewrite_config(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"sk-test\"\n\
         model = \"stub-model\"\n",
        stub.url()
    ));
    daemon.signal(libc::SIGHUP);
    let mut reply = Value::Null;
    until("THINK answered by the new provider", SOON, || {
        reply = think(&daemon);
        reply["success"] == true
    });
    assert_eq!(reply["content"], "reloaded", "{reply}");
    assert!(daemon.log().contains("applied: llm"));
    // Limits alone: the provider stays as it is.
    daemon.rewrite_config(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"sk-test\"\n\
         model = \"stub-model\"\nrpm = 600\nmax_queued = 7\n",
        stub.url()
    ));
    daemon.signal(libc::SIGHUP);
    until("the new limits taken up", SOON, || {
        daemon
            .log()
            .contains("THINK: new limits; provider openai and model stub-model unchanged")
    });
    assert_eq!(think(&daemon)["content"], "reloaded");

    // A THINK at the provider when another takes over is answered by the
    // one it went to; the next goes to the new one.
    let slow =
        Stub::start(|_, _| Reply::openai("old provider", 3, 1).after(Duration::from_millis(800)));
    let provider = |stub: &Stub| {
        format!(
            "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"sk-test\"\n\
             model = \"stub-model\"\n",
            stub.url()
        )
    };
    daemon.rewrite_config(&provider(&slow));
    daemon.signal(libc::SIGHUP);
    until("the slow provider answering", SOON, || {
        think(&daemon)["content"] == "old provider"
    });
    let mut asking = daemon.raw();
    let in_flight = std::thread::spawn(move || call_json(&mut asking, Opcode::THINK, b"hi"));
    until("the THINK at the slow provider", SOON, || {
        slow.requests().len() >= 2
    });
    daemon.rewrite_config(&provider(&stub));
    daemon.signal(libc::SIGHUP);
    let answered = in_flight.join().unwrap();
    assert_eq!(answered["content"], "old provider", "{answered}");
    until("the new provider answering", SOON, || {
        think(&daemon)["content"] == "reloaded"
    });
}

#[test]
fn systemd_hears_ready_reloading_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(SOON)).unwrap();
    let daemon = Daemon::start_with_env("", &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())]);
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = notify.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next();
    assert!(ready.starts_with("READY=1\n"), "{ready}");
    assert!(
        ready.contains(&daemon.socket.display().to_string()),
        "{ready}"
    );
    daemon.signal(libc::SIGHUP);
    assert!(next().starts_with("RELOADING=1\nMONOTONIC_USEC="));
    assert!(next().starts_with("READY=1"));
    daemon.signal(libc::SIGTERM);
    assert!(next().starts_with("STOPPING=1"));
}

/// A `[mcp.servers.<name>]` table for the test server that behaves.
fn mcp_server(name: &str) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_faults.py");
    format!(
        "[mcp.servers.{name}]\ncommand = \"/usr/bin/python3\"\nargs = [\"{}\", \"serve\"]\n",
        script.display()
    )
}

/// The MCP servers HELLO reports, by name, with their states.
fn tool_servers(daemon: &Daemon) -> Vec<(String, String)> {
    let hello = call_json(&mut daemon.raw(), Opcode::HELLO, b"");
    hello["tool_servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn sighup_restarts_the_mcp_servers_as_configured() {
    let daemon = Daemon::start_with(&mcp_server("first"));
    until("the first server ready", SOON, || {
        tool_servers(&daemon) == [("first".to_owned(), "ready".to_owned())]
    });
    let server_pids = |daemon: &Daemon| -> Vec<i32> {
        descendants(daemon.pid())
            .into_iter()
            .filter(|pid| cmdline(*pid).contains("mcp_faults.py"))
            .collect()
    };
    let first = server_pids(&daemon);
    assert_eq!(first.len(), 1, "{first:?}");
    daemon.rewrite_config(&mcp_server("second"));
    daemon.signal(libc::SIGHUP);
    until("only the second server, ready", SOON, || {
        tool_servers(&daemon) == [("second".to_owned(), "ready".to_owned())]
    });
    let tools = call_json(&mut daemon.raw(), Opcode::TOOL, br#"{"op":"list"}"#);
    let servers: std::collections::BTreeSet<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["server"].as_str())
        .collect();
    assert!(servers.contains("second"), "{tools}");
    assert!(!servers.contains("first"), "{tools}");
    // The first server's process is gone; the second's runs.
    until("the old server ended", SOON, || {
        let now = server_pids(&daemon);
        now.len() == 1 && now[0] != first[0]
    });
    assert!(!std::path::Path::new(&format!("/proc/{}", first[0])).exists());
    assert!(daemon.log().contains("applied: mcp"));
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).into_owned())
        .unwrap_or_default()
}

/// Every process below `root`, from each process's parent in /proc.
fn descendants(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 2..];
            let ppid = after_name.split(' ').nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        at += 1;
    }
    found.split_off(1)
}

/// Puts back on drop what the system-socket test changed: the `agentos`
/// group if it made it, and `/run/agentos` as it was (or not there).
struct PutBack {
    made_group: bool,
    run_dir: Option<(u32, u32)>,
}

impl Drop for PutBack {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        match self.run_dir {
            Some((gid, mode)) => {
                let _ = nix::unistd::chown("/run/agentos", None, Some(gid.into()));
                let _ =
                    std::fs::set_permissions("/run/agentos", std::fs::Permissions::from_mode(mode));
            }
            None => {
                let _ = std::fs::remove_dir("/run/agentos");
            }
        }
        if self.made_group {
            let _ = std::process::Command::new("groupdel")
                .arg("agentos")
                .status();
        }
    }
}

#[test]
fn with_no_flags_root_serves_the_system_socket_to_group_agentos() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const SYSTEM_SOCKET: &str = "/run/agentos/agentos.sock";
    if !support::is_root() {
        eprintln!("!!! NOT TESTED: the system socket needs root");
        return;
    }
    if std::os::unix::net::UnixStream::connect(SYSTEM_SOCKET).is_ok() {
        eprintln!("!!! NOT TESTED: a kernel already serves {SYSTEM_SOCKET}");
        return;
    }
    let existed = nix::unistd::Group::from_name("agentos").unwrap().is_some();
    let put_back = PutBack {
        made_group: !existed,
        run_dir: std::fs::metadata("/run/agentos")
            .ok()
            .map(|m| (m.gid(), m.permissions().mode() & 0o7777)),
    };
    if !existed {
        let made = std::process::Command::new("groupadd")
            .args(["--system", "agentos"])
            .status()
            .unwrap();
        assert!(made.success());
    }
    let gid = nix::unistd::Group::from_name("agentos")
        .unwrap()
        .unwrap()
        .gid;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agentosd.toml");
    std::fs::write(&config, "[llm]\nprovider = \"none\"\n").unwrap();
    let log = dir.path().join("agentosd.log");
    // No flags: only the environment keeps it off this machine's real
    // config, state and logs.
    let child = std::process::Command::new(support::agentosd())
        .env_remove("AGENTOS_SOCKET")
        .env("AGENTOS_CONFIG", &config)
        .env("AGENTOS_STATE_DIR", dir.path().join("state"))
        .env("AGENTOS_AGENT_LOG_DIR", dir.path().join("logs"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let daemon = support::StopOnDrop(child);
    until("the system socket answers", SOON, || {
        std::os::unix::net::UnixStream::connect(SYSTEM_SOCKET).is_ok()
    });
    let socket = std::fs::metadata(SYSTEM_SOCKET).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o660);
    assert_eq!(socket.gid(), gid.as_raw());
    let parent = std::fs::metadata("/run/agentos").unwrap();
    assert_eq!(parent.gid(), gid.as_raw());
    assert_eq!(
        parent.permissions().mode() & 0o007,
        0,
        "others may not enter"
    );
    let mut raw = std::os::unix::net::UnixStream::connect(SYSTEM_SOCKET).unwrap();
    assert_eq!(call_json(&mut raw, Opcode::HELLO, b"")["success"], true);
    let status = daemon.stop();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(!std::path::Path::new(SYSTEM_SOCKET).exists());
    if put_back.run_dir.is_none() {
        assert!(
            !std::path::Path::new("/run/agentos").exists(),
            "the kernel made /run/agentos and left it"
        );
    }
}

#[test]
fn check_config_warns_of_a_server_program_it_cannot_find_or_that_is_a_shim() {
    let dir = tempfile::tempdir().unwrap();
    let shims = dir.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let shim = shims.join("python");
    std::fs::write(&shim, "#!/bin/sh\nexec python3 \"$@\"\n").unwrap();
    let file = dir.path().join("agentosd.toml");
    let config = "[mcp.servers.gone]\ncommand = \"no-such-server-program\"\n\n\
         [mcp.servers.shimmed]\ncommand = \"python\"\n\n\
         [mcp.servers.fine]\ncommand = \"/bin/sh\"\n\n\
         [mcp.servers.off]\ncommand = \"also-not-here\"\nenabled = false\n";
    std::fs::write(&file, config).unwrap();
    let checked = std::process::Command::new(support::agentosd())
        .arg("--config")
        .arg(&file)
        .arg("--check-config")
        .env("PATH", format!("{}:/usr/bin:/bin", shims.display()))
        .output()
        .unwrap();
    // The settings are valid; what would go wrong at start is said.
    assert_eq!(checked.status.code(), Some(0));
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(
        said.contains("MCP server `gone` will not start")
            && said.contains("\"no-such-server-program\" is not on the kernel's PATH"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "MCP server `shimmed`: its command is {}",
            shim.display()
        )) && said.contains("pyenv which python"),
        "{said}"
    );
    assert!(
        !said.contains("`fine`") && !said.contains("`off`"),
        "{said}"
    );
}
