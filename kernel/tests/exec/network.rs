//! A run queued while NET `set` narrows its owner's policy starts within
//! the policy as it is then, or not at all: a queued run does not start
//! with the wider copy it was admitted with, a session's queued run does
//! not put it back on the session's endpoint, and what the owner's runs
//! reach is in the owner's record.

use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::egress::{
    net_set, net_show, reach_code, wait_for_runs, LineServer, Phased,
};
use agentos_test_support::{require_root, Daemon};
use serde_json::{json, Value};

/// `[tag, EXEC, request]` for a phase: a run that reaches the upstream on
/// `port` (and, with `hold`, keeps its tunnel until it is cut).
fn reaching(tag: &str, port: u16, hold: bool, session: Option<&str>) -> Value {
    let mut body = json!({"code": reach_code(port, tag, hold), "timeout_ms": 60_000});
    if let Some(session) = session {
        body["session"] = json!(session);
    }
    json!([tag, Opcode::EXEC.0, body])
}

#[test]
fn runs_queued_before_their_owners_policy_was_cut_do_not_start_with_the_old_one() {
    require_root!("a run's proxy endpoint (it is made inside the run's network namespace)");
    let upstream = LineServer::start();
    let port = upstream.port;
    let allow = format!("127.0.0.1/32:{port}");
    // One run of the agent's at a time, so the others queue; a run that
    // leaves out `network` gets what the agent has.
    let daemon = Daemon::start_with(&format!(
        "[exec]\nmax_running_per_owner = 1\n[network]\ndefault_allow = [\"{allow}\"]\n"
    ));
    let agent = Phased::spawn(
        &daemon,
        "owner",
        json!({"network": {"allow": [allow]}}),
        json!([
            [reaching("hold", port, true, Some("s"))],
            [
                reaching("queued", port, false, None),
                reaching("session", port, false, Some("s"))
            ],
            [reaching("later", port, false, Some("s"))],
        ]),
    );
    // Session s's first run holds the agent's place, its tunnel open...
    upstream.wait_for("hold", Duration::from_secs(30));
    // ...while a run of the agent's and the session's next run wait.
    agent.go(&daemon, 1);
    let mut client = daemon.client();
    wait_for_runs(&mut client, agent.id, 3);
    net_set(&mut client, agent.id, json!({"allow": []}));
    let replies = agent.wait_for_replies(&daemon, &["hold", "queued", "session"]);
    // The cut closed the running run's tunnel, which let the others start.
    assert_eq!(replies["hold"]["stdout"], "200\ncut\n", "{replies:?}");
    for tag in ["queued", "session"] {
        let reply = &replies[tag];
        assert_eq!(reply["code"], "permission_denied", "{tag}: {reply}");
        let error = reply["error"].as_str().unwrap();
        assert!(error.contains("`network`"), "{tag}: {error}");
    }
    // The session is still there, its endpoint as narrow as the cut left it.
    agent.go(&daemon, 2);
    let later = &agent.wait_for_replies(&daemon, &["later"])["later"];
    assert_eq!(later["stdout"], "403\n", "{later}");
    assert_eq!(
        upstream.lines(),
        ["hold"],
        "only the run that started before the cut reached the upstream"
    );
    // Each connection the agent's runs made is in the agent's record.
    let shown = net_show(&mut client, agent.id);
    let attempts = shown["attempts"].as_array().unwrap();
    let allowed: Vec<&Value> = attempts.iter().filter(|a| a["allowed"] == true).collect();
    assert_eq!(allowed.len(), upstream.lines().len(), "{shown}");
    assert!(
        allowed
            .iter()
            .all(|a| a["host"] == "127.0.0.1" && a["port"] == port),
        "{shown}"
    );
    assert!(
        attempts
            .iter()
            .any(|a| a["allowed"] == false && a["port"] == port),
        "the later run's refused attempt is not in the agent's record: {shown}"
    );
}
