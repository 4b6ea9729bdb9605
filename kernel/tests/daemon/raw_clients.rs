//! Clients written from the protocol alone, in other languages, with only
//! their standard libraries (`examples/clients/`; Bash borrows socat or nc
//! for the socket): each does HELLO, NOOP, THINK and LIST against a real
//! agentosd.

use std::path::Path;
use std::process::{Command, Stdio};

use agentos_test_support::Daemon;
use serde_json::Value;

/// Runs `program args... SOCKET` and checks its four replies; says loudly
/// when the language is not installed.
fn check(language: &str, program: &str, args: &[&str]) {
    let daemon = Daemon::start();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = match Command::new(program)
        .args(args)
        .arg(&daemon.socket)
        .current_dir(repo)
        .output()
    {
        Ok(output) => output,
        Err(err) => {
            eprintln!("!!! NOT TESTED: the {language} client: {program} cannot run ({err})");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{language}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reply = |name: &str| -> String {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{language}: no {name} line in {stdout}"))
            .to_owned()
    };
    let hello: Value = serde_json::from_str(&reply("hello")).unwrap();
    assert_eq!(hello["success"], true, "{language}: {hello}");
    assert_eq!(hello["protocol_version"], 1, "{language}: {hello}");
    assert_eq!(reply("noop"), "ping", "{language}");
    // No LLM here: THINK answers, saying so.
    let think: Value = serde_json::from_str(&reply("think")).unwrap();
    assert_eq!(think["code"], "unavailable", "{language}: {think}");
    let list: Value = serde_json::from_str(&reply("list")).unwrap();
    assert!(list.is_array(), "{language}: {list}");
}

#[test]
fn a_node_client() {
    check("Node.js", "node", &["examples/clients/client.js"]);
}

#[test]
fn a_perl_client() {
    check("Perl", "perl", &["examples/clients/client.pl"]);
}

#[test]
fn a_java_client() {
    check("Java", "java", &["examples/clients/Client.java"]);
}

#[test]
fn a_bash_client() {
    // Bash cannot open a Unix socket: without a helper the client can only
    // say so, which is not a failure of the client.
    let runs = |program: &str| {
        Command::new(program)
            .arg("-h")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !runs("socat") && !runs("nc") {
        eprintln!("!!! NOT TESTED: the Bash client: neither socat nor nc is installed");
        return;
    }
    check("Bash", "bash", &["examples/clients/client.sh"]);
}
