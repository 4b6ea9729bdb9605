//! A task's run, and a prompt loop's, that waited while NET `set` narrowed
//! its owner's policy starts within the policy as it is then, or fails
//! naming `network`.

use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::egress::{
    net_set, net_show, reach_code, wait_for_runs, LineServer, Phased,
};
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{require_root, with_llm_stub, Daemon};
use serde_json::{json, Value};

use crate::{wait, TASK};

/// A test's upstream and the policy entry that allows it, for an agent
/// whose first run holds its one place in EXEC with its tunnel open.
struct Held {
    upstream: LineServer,
    allow: String,
}

impl Held {
    fn new() -> Held {
        let upstream = LineServer::start();
        let allow = format!("127.0.0.1/32:{}", upstream.port);
        Held { upstream, allow }
    }

    /// `[tag, EXEC, request]`: a run that holds its tunnel until it is cut.
    fn hold(&self) -> Value {
        let code = reach_code(self.upstream.port, "hold", true);
        json!(["hold", Opcode::EXEC.0, {"code": code, "timeout_ms": 60_000,
                                         "network": {"allow": [self.allow]}}])
    }

    /// Spawns `phases`' agent with the policy; once its first run holds
    /// its place, phase 1 goes, and the test waits until `runs` runs of
    /// the agent's were accepted before its policy is cut to nothing.
    fn cut_while_queued(&self, daemon: &Daemon, phases: Value, runs: u64) -> Phased {
        let agent = Phased::spawn(
            daemon,
            "owner",
            json!({"network": {"allow": [self.allow]}}),
            phases,
        );
        self.upstream.wait_for("hold", Duration::from_secs(30));
        agent.go(daemon, 1);
        let mut client = daemon.client();
        wait_for_runs(&mut client, agent.id, runs);
        net_set(&mut client, agent.id, json!({"allow": []}));
        let held = &agent.wait_for_replies(daemon, &["hold"])["hold"];
        assert_eq!(held["stdout"], "200\ncut\n", "{held}");
        agent
    }

    /// Only the holding run reached the upstream, and what the agent's
    /// runs reached is in its record.
    fn only_the_holder_reached(&self, daemon: &Daemon, agent: &Phased) {
        assert_eq!(self.upstream.lines(), ["hold"]);
        let shown = net_show(&mut daemon.client(), agent.id);
        let allowed = shown["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["allowed"] == true && a["port"] == self.upstream.port)
            .count();
        assert_eq!(allowed, 1, "{shown}");
    }
}

#[test]
fn a_task_whose_run_waited_while_its_owners_policy_was_cut_fails_naming_network() {
    require_root!("a run's proxy endpoint (it is made inside the run's network namespace)");
    let held = Held::new();
    // One run and one task of the agent's at a time: the first task's run
    // waits in EXEC, the second task in the task queue.
    let daemon = Daemon::start_with(
        "[exec]\nmax_running_per_owner = 1\n[tasks]\nmax_running_per_owner = 1\n",
    );
    let task = |tag: &str| {
        let run = json!({"code": reach_code(held.upstream.port, tag, false),
                         "network": {"allow": [held.allow]}, "timeout_ms": 60_000});
        json!([tag, TASK, {"op": "dispatch", "kind": "exec", "request": run}])
    };
    let agent = held.cut_while_queued(
        &daemon,
        json!([[held.hold()], [task("first"), task("second")]]),
        2,
    );
    let replies = agent.wait_for_replies(&daemon, &["first", "second"]);
    let mut stream = daemon.raw();
    for tag in ["first", "second"] {
        let id = replies[tag]["task_id"].as_str().unwrap();
        let done = wait(&mut stream, id, 30_000);
        assert_eq!(done["state"], "failed", "{tag}: {done}");
        assert_eq!(done["result"]["code"], "permission_denied", "{tag}: {done}");
        let error = done["result"]["error"].as_str().unwrap();
        assert!(error.contains("`network"), "{tag}: {error}");
    }
    held.only_the_holder_reached(&daemon, &agent);
}

#[test]
fn a_prompt_loops_run_that_waited_while_its_owners_policy_was_cut_does_not_start() {
    require_root!("a run's proxy endpoint (it is made inside the run's network namespace)");
    let held = Held::new();
    let code = reach_code(held.upstream.port, "prompt", false);
    let stub = Stub::start(move |_, n| {
        let content = match n {
            0 => format!("```python\n{code}```"),
            _ => "The upstream cannot be reached.".to_owned(),
        };
        Reply::openai(&content, 10, 5)
    });
    // The loop's runs leave out `network`: they get what the agent has.
    let daemon = with_llm_stub(
        &stub.url(),
        &format!(
            "[exec]\nmax_running_per_owner = 1\n[network]\ndefault_allow = [\"{}\"]\n",
            held.allow
        ),
    );
    let prompt = json!({"prompt": "Reach the upstream.", "max_iterations": 2});
    let agent = held.cut_while_queued(
        &daemon,
        json!([
            [held.hold()],
            [["prompt", TASK, {"op": "dispatch", "kind": "prompt", "request": prompt}]]
        ]),
        2,
    );
    let replies = agent.wait_for_replies(&daemon, &["prompt"]);
    let id = replies["prompt"]["task_id"].as_str().unwrap();
    let done = wait(&mut daemon.raw(), id, 60_000);
    let iterations = done["result"]["iterations"].as_array().unwrap();
    assert_eq!(iterations.len(), 1, "{done}");
    assert_eq!(iterations[0]["exit_code"], Value::Null, "{done}");
    assert_eq!(iterations[0]["stdout"], "", "{done}");
    // THINK was told why the run did not start; its answer without a
    // run that worked was sent back once, then taken as unchecked.
    let requests = stub.requests();
    assert_eq!(requests.len(), 3, "{done}");
    assert_eq!(done["result"]["checked"], false, "{done}");
    let told = String::from_utf8_lossy(&requests[1].body).into_owned();
    assert!(
        told.contains("EXEC field `network`") && told.contains("narrowed while it waited"),
        "{told}"
    );
    held.only_the_holder_reached(&daemon, &agent);
}
