//! Each way users configure a server, against the real servers the
//! project's setup installs: `node` with a package's script, `npx -y` and
//! `uvx` started offline from the server's own cache, `python -m`, `uv
//! run` in a synced project, and a failing script whose error names what
//! is wrong. (A package's bin shim
//! and a virtual environment's console script are the forms of
//! `the_real_servers_tools_are_listed_and_called_over_tool_and_from_exec`.)

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentos_test_support::{require_root, shared_dir, Daemon};
use serde_json::{json, Value};

use crate::{repo, server, settled, tool};

/// The sandbox user confined servers run as.
const SERVER_UID: &str = "65534:65534";

/// A file the project's setup installs; the test fails without it.
fn installed(relative: &str) -> PathBuf {
    let path = repo().join(relative);
    assert!(
        path.exists(),
        "{} is not installed: run scripts/setup --test",
        path.display()
    );
    path
}

/// A daemon with `config` whose state directory is `state`.
fn daemon_with_state(config: &str, state: &Path) -> Daemon {
    Daemon::start_with_env(config, &[("AGENTOS_STATE_DIR", state.to_str().unwrap())])
}

/// Waits for server `name` to settle; returns its summary and how long
/// that took.
fn ready(daemon: &Daemon, name: &str) -> (Value, Duration) {
    let started = Instant::now();
    let mut stream = daemon.raw();
    let list = settled(&mut stream, &[name]);
    (server(&list, name).clone(), started.elapsed())
}

fn call(daemon: &Daemon, server: &str, name: &str, arguments: Value) -> Value {
    let mut stream = daemon.raw();
    tool(
        &mut stream,
        json!({"op": "call", "server": server, "tool": name, "arguments": arguments}),
    )
}

/// The error of failed server `name` once its exit status and stderr are
/// in (at first it says only that its output closed).
fn ended_error(daemon: &Daemon, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (summary, _) = ready(daemon, name);
        assert_eq!(summary["state"], "failed", "{summary}");
        let error = summary["error"].as_str().unwrap().to_owned();
        if error.starts_with("it exited with") || Instant::now() > deadline {
            return error;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `time` server answers a call.
fn assert_time_is_served(daemon: &Daemon) {
    let now = call(
        daemon,
        "time",
        "get_current_time",
        json!({"timezone": "UTC"}),
    );
    assert_eq!(now["result"]["timezone"], "UTC", "{now}");
}

/// Copies a cache the setup filled into a server's home, owned by the
/// user the server runs as (it writes its index and its installs there).
fn seed_home(state: &Path, server: &str, cache: &Path, inside_home: &str) -> PathBuf {
    let home = state.join("mcp").join(server).join("home");
    let target = home.join(inside_home);
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(cache)
        .arg(&target)
        .status()
        .unwrap();
    assert!(copied.success());
    let owned = Command::new("chown")
        .args(["-R", SERVER_UID])
        .arg(&home)
        .status()
        .unwrap();
    assert!(owned.success());
    home
}

#[test]
fn node_running_a_packages_script_sees_the_whole_package() {
    require_root!("MCP servers confined as the sandbox user");
    let script = installed(
        "scripts/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    let config = format!(
        "[mcp.servers.everything]\ncommand = \"node\"\nargs = [\"{}\"]\n",
        script.display()
    );
    let daemon = Daemon::start_with(&config);
    let (summary, _) = ready(&daemon, "everything");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", daemon.log());
    let echo = call(&daemon, "everything", "echo", json!({"message": "hi"}));
    assert_eq!(echo["result"], "Echo: hi", "{echo}");
}

#[test]
fn a_script_missing_its_dependency_fails_naming_the_module_and_its_exit_status() {
    require_root!("MCP servers confined as the sandbox user");
    let project = shared_dir();
    let dist = project.path().join("server/dist");
    fs::create_dir_all(&dist).unwrap();
    fs::write(
        project.path().join("server/package.json"),
        r#"{"type": "module"}"#,
    )
    .unwrap();
    fs::write(dist.join("index.js"), "import { z } from 'zod';\n").unwrap();
    for dir in ["server", "server/dist"] {
        Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(project.path().join(dir))
            .status()
            .unwrap();
    }
    let config = format!(
        "[mcp.servers.broken]\ncommand = \"/usr/bin/node\"\nargs = [\"{}\"]\n",
        dist.join("index.js").display()
    );
    let daemon = Daemon::start_with(&config);
    let error = ended_error(&daemon, "broken");
    assert!(
        error.starts_with(
            "it exited with status 1: Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod'"
        ),
        "{error}"
    );
}

#[test]
fn npx_starts_a_registry_package_offline_from_the_servers_private_cache() {
    require_root!("MCP servers confined as the sandbox user");
    let cache = installed("scripts/mcp-servers/cache/npm/_cacache");
    let manifest: Value = serde_json::from_str(
        &fs::read_to_string(installed("scripts/mcp-servers/package.json")).unwrap(),
    )
    .unwrap();
    let version = manifest["dependencies"]["@modelcontextprotocol/server-everything"]
        .as_str()
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let home = seed_home(state.path(), "everything", &cache, ".npm/_cacache");
    // `--offline`: the registry is never asked; only the cache can answer.
    let config = format!(
        "[mcp.servers.everything]\ncommand = \"npx\"\n\
         args = [\"--offline\", \"-y\", \"@modelcontextprotocol/server-everything@{version}\"]\n\
         timeout_ms = 120000\n"
    );
    let first = daemon_with_state(&config, state.path());
    let (summary, took) = ready(&first, "everything");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", first.log());
    let echo = call(&first, "everything", "echo", json!({"message": "from npx"}));
    assert_eq!(echo["result"], "Echo: from npx", "{echo}");
    eprintln!("npx: first start ready in {took:?}");
    drop(first);

    // Its home is private and kept: the second kernel's start finds the
    // package npx installed there.
    let meta = fs::metadata(&home).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o700, 65534));
    assert!(home.join(".npm/_npx").is_dir(), "npx installed nothing");
    let second = daemon_with_state(&config, state.path());
    let (summary, took) = ready(&second, "everything");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", second.log());
    eprintln!("npx: second start ready in {took:?}");
}

#[test]
fn uvx_starts_a_pypi_package_offline_from_the_servers_private_cache() {
    require_root!("MCP servers confined as the sandbox user");
    let cache = installed("scripts/mcp-servers/cache/uv");
    let uvx = installed(".venv/bin/uvx");
    let state = tempfile::tempdir().unwrap();
    seed_home(state.path(), "time", &cache, ".cache/uv");
    let config = format!(
        "[mcp.servers.time]\ncommand = \"{}\"\nargs = [\"--offline\", \"mcp-server-time\"]\n\
         timeout_ms = 120000\n",
        uvx.display()
    );
    let daemon = daemon_with_state(&config, state.path());
    let (summary, took) = ready(&daemon, "time");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", daemon.log());
    eprintln!("uvx: start ready in {took:?}");
    assert_time_is_served(&daemon);
}

#[test]
fn python_dash_m_runs_a_module_of_its_environment() {
    require_root!("MCP servers confined as the sandbox user");
    let python = installed(".venv/bin/python");
    let config = format!(
        "[mcp.servers.time]\ncommand = \"{}\"\nargs = [\"-m\", \"mcp_server_time\"]\n",
        python.display()
    );
    let daemon = Daemon::start_with(&config);
    let (summary, _) = ready(&daemon, "time");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", daemon.log());
    assert_time_is_served(&daemon);
}

#[test]
fn help_on_a_tool_says_what_it_takes_and_returns() {
    require_root!("MCP servers confined as the sandbox user, and EXEC");
    let time = installed(".venv/bin/mcp-server-time");
    let everything = installed("scripts/mcp-servers/node_modules/.bin/mcp-server-everything");
    let config = format!(
        "[mcp.servers.time]\ncommand = \"{}\"\n[mcp.servers.everything]\ncommand = \"{}\"\n",
        time.display(),
        everything.display()
    );
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    settled(&mut stream, &["time", "everything"]);
    let run = crate::exec(
        &mut stream,
        "import pydoc, tools\n\
         for f in (tools.time.get_current_time, tools.everything.echo):\n    \
             print(pydoc.render_doc(f, renderer=pydoc.plaintext))\n\
         print(open('/tools/time/SKILL.md').read())\n",
    );
    let shown = run["stdout"].as_str().unwrap_or_default();
    eprintln!("{shown}");
    for expected in [
        "get_current_time(timezone: str) -> dict",
        "Returns:\n        a dict (the tool's structured content) with these keys:",
        "- `timezone` (string)",
        "echo(message: str)\n",
        "Returns:\n        the tool's text content as a str",
        "Raises tools.ToolError when the tool fails.",
        "Returns a dict (the tool's structured content) with these keys:",
    ] {
        assert!(
            shown.contains(expected),
            "{expected:?} not in:\n{shown}\n{run}"
        );
    }
}

#[test]
fn a_failed_servers_error_blots_out_its_key_but_not_its_home() {
    require_root!("MCP servers confined as the sandbox user");
    let state = tempfile::tempdir().unwrap();
    let config = "[mcp.servers.keyed]\ncommand = \"/usr/bin/python3\"\n\
                  args = [\"-c\", \"import os, sys; sys.exit('cannot open ' + os.environ['HOME'] + \
                  '/.config; key ' + os.environ['API_KEY'] + ' refused')\"]\n\
                  env = { API_KEY = \"sk-live-0123456789\" }\n";
    let daemon = daemon_with_state(config, state.path());
    let home = state.path().join("mcp/keyed/home");
    let error = ended_error(&daemon, "keyed");
    assert_eq!(
        error,
        format!(
            "it exited with status 1: cannot open {}/.config; key [secret] refused",
            home.display()
        )
    );
    assert!(!daemon.log().contains("sk-live-0123456789"));
}

#[test]
fn uv_runs_a_synced_projects_command_with_the_project_read_only() {
    require_root!("MCP servers confined as the sandbox user");
    let uv = installed(".venv/bin/uv");
    let project = installed("scripts/mcp-servers/uv-project");
    installed("scripts/mcp-servers/uv-project/.venv/bin/mcp-server-time");
    let config = format!(
        "[mcp.servers.time]\ncommand = \"{}\"\n\
         args = [\"--directory\", \"{}\", \"run\", \"--frozen\", \"mcp-server-time\"]\n",
        uv.display(),
        project.display()
    );
    let daemon = Daemon::start_with(&config);
    let (summary, _) = ready(&daemon, "time");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", daemon.log());
    assert_time_is_served(&daemon);
}

#[test]
fn python_running_a_script_sees_the_modules_beside_it() {
    require_root!("MCP servers confined as the sandbox user");
    let python = installed(".venv/bin/python");
    let project = shared_dir();
    let script = project.path().join("server.py");
    fs::write(&script, "from helper import main\nmain()\n").unwrap();
    fs::write(
        project.path().join("helper.py"),
        "from mcp_server_time import main\n",
    )
    .unwrap();
    Command::new("chmod")
        .args(["a+r"])
        .arg(&script)
        .arg(project.path().join("helper.py"))
        .status()
        .unwrap();
    let config = format!(
        "[mcp.servers.time]\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        python.display(),
        script.display()
    );
    let daemon = Daemon::start_with(&config);
    let (summary, _) = ready(&daemon, "time");
    assert_eq!(summary["state"], "ready", "{summary}\n{}", daemon.log());
    assert_time_is_served(&daemon);
}
