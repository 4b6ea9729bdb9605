//! Which Python runs an agent's script when SPAWN names none: the
//! project's `.venv`, which holds the SDK, so an agent written with
//! `from agentos import AgentOSClient` runs right after `scripts/setup`;
//! and a reply that warns when the interpreter given cannot import it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{
    agent_log_with_line, request, shared_dir, wait_for_state, write_script, Daemon,
};
use serde_json::json;

/// An agent that connects through the SDK and says who the kernel says
/// it is.
const SDK_AGENT: &str = "\
from agentos import AgentOSClient
with AgentOSClient() as client:
    hello = client.hello()
    print('connected as', hello['agent_id'], flush=True)
";

/// The project's environment, which `scripts/setup` makes.
fn project_python() -> PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup, which installs the SDK there",
        python.display()
    );
    python
}

fn imports_sdk(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import agentos"])
        .env_clear()
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_script_runs_with_the_projects_sdk_when_spawn_names_no_python() {
    assert!(
        imports_sdk(&project_python()),
        "the project's .venv cannot import agentos: run scripts/setup"
    );
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = shared_dir();
    let script = write_script(dir.path(), "sdk_agent.py", SDK_AGENT);
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "sdk", "script": script}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    assert!(
        reply.get("warnings").is_none(),
        "the default interpreter has the SDK, yet: {reply}"
    );
    let id = reply["id"].as_u64().unwrap();
    agent_log_with_line(&daemon, "sdk", id, &format!("connected as {id}"));
    let info = wait_for_state(&mut client, id, &["exited"], Duration::from_secs(20));
    assert_eq!(info["exit_code"], 0, "{info}");
}

#[test]
fn an_interpreter_without_the_sdk_is_warned_of_in_the_spawn_reply() {
    let system = Path::new("/usr/bin/python3");
    assert!(system.exists(), "this test needs /usr/bin/python3");
    assert!(
        !imports_sdk(system),
        "/usr/bin/python3 can import agentos on this host: the test needs a Python without it"
    );
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = shared_dir();
    let script = write_script(dir.path(), "plain.py", "print('plain', flush=True)\n");
    let reply = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "plain", "script": script, "python": system}),
    );
    assert_eq!(reply["success"], true, "{reply}");
    let warnings = reply["warnings"].as_array().expect("a warnings array");
    assert_eq!(warnings.len(), 1, "{reply}");
    let warning = warnings[0].as_str().unwrap();
    assert!(
        warning.contains("/usr/bin/python3") && warning.contains("cannot import the agentos SDK"),
        "{warning}"
    );
    // The agent runs all the same: the warning is advice, not a refusal.
    let id = reply["id"].as_u64().unwrap();
    agent_log_with_line(&daemon, "plain", id, "plain");
    // The same interpreter a second time: the same warning, from memory.
    let again = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "plain2", "script": script, "python": system}),
    );
    assert_eq!(again["warnings"], reply["warnings"], "{again}");
    // A command is not a script: there is no interpreter to warn about.
    let command = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "cmd", "command": ["/bin/true"]}),
    );
    assert!(command.get("warnings").is_none(), "{command}");
}
