//! A model with a small context and a kernel with many tools: the prompt
//! loop lists the tools that fit, says how many it left out, and its
//! THINKs stay within the context over several iterations. The stand-in
//! provider refuses, as llama.cpp does, a request whose prompt and answer
//! would not fit.

use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Recorded, Reply, Stub};
use agentos_test_support::{call_json, require_root, with_llm_stub};
use serde_json::{json, Value};

/// The stand-in model's context, in tokens.
const CONTEXT: u64 = 768;
/// Completion tokens each THINK asks for (the kernel's default here).
const MAX_TOKENS: u64 = 128;

/// Tokens a request would take at the provider: its text at about four
/// characters a token (as the kernel estimates), and its `max_tokens`.
fn tokens_needed(request: &Recorded) -> u64 {
    let body = request.json();
    let characters: usize = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").len())
        .sum();
    characters as u64 / 4 + body["max_tokens"].as_u64().unwrap_or(0)
}

/// Three copies of the test MCP server: 42 tools, with the built-ins 44.
fn many_tools() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_faults.py");
    ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| {
            format!(
                "[mcp.servers.{name}]\ncommand = \"/usr/bin/python3\"\nargs = [\"{}\", \"serve\"]\n",
                script.display()
            )
        })
        .collect()
}

fn all_ready(stream: &mut std::os::unix::net::UnixStream) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = call_json(stream, Opcode::TOOL, br#"{"op":"list"}"#);
        let servers = list["servers"].as_array().unwrap();
        if servers.len() == 3 && servers.iter().all(|s| s["state"] == "ready") {
            return list;
        }
        assert!(Instant::now() < deadline, "servers not ready: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_loop_with_many_tools_fits_a_small_context_over_several_iterations() {
    require_root!("EXEC (its isolation needs namespaces)");
    let stub = Stub::start(|request, n| {
        let needed = tokens_needed(request);
        if needed > CONTEXT {
            return Reply::json(
                400,
                &json!({"error": {"message": format!(
                    "the request exceeds the available context size ({needed} > {CONTEXT} tokens)"
                )}}),
            );
        }
        let content = match n {
            0..=2 => format!("```python\nprint({n} * 2)\n```"),
            _ => "Done: 0, 2, 4.".to_owned(),
        };
        Reply::openai(&content, 10, 5)
    });
    let daemon = with_llm_stub(
        &stub.url(),
        &format!(
            "context_tokens = {CONTEXT}\ndefault_max_tokens = {MAX_TOKENS}\n{}",
            many_tools()
        ),
    );
    let mut stream = daemon.raw();
    let list = all_ready(&mut stream);
    let on_offer = list["tools"].as_array().unwrap().len();
    assert!(on_offer >= 40, "{on_offer} tools");

    let dispatched = call_json(
        &mut stream,
        Opcode::TASK,
        json!({"op": "dispatch", "kind": "prompt",
               // A small model is told only of the tools its prompt names:
               // this one names every server's.
               "request": {"prompt": "Double 0, 1 and 2; the alpha, beta and gamma \
                                      servers are there if you need them.",
                           "max_iterations": 5}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(dispatched["success"], true, "{dispatched}");
    let id = dispatched["task_id"].as_str().unwrap();
    let done = call_json(
        &mut stream,
        Opcode::TASK,
        json!({"op": "wait", "task_id": id, "timeout_ms": 60_000})
            .to_string()
            .as_bytes(),
    )["task"]
        .clone();
    assert_eq!(done["state"], "completed", "{done}");
    let result = &done["result"];
    assert_eq!(result["answer"], "Done: 0, 2, 4.", "{result}");
    let outputs: Vec<&Value> = result["iterations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["stdout"])
        .collect();
    assert_eq!(outputs, [&json!("0\n"), &json!("2\n"), &json!("4\n")]);

    let requests = stub.requests();
    assert_eq!(requests.len(), 4, "three runs and the answer");
    for request in &requests {
        assert!(tokens_needed(request) <= CONTEXT);
    }
    // The list THINK was told: some tools, and how many it was not.
    let system = requests[0].json()["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = system.lines().filter(|l| l.starts_with("tools.")).count();
    let note = system
        .lines()
        .find(|l| l.contains("more tools are not listed"))
        .unwrap_or_else(|| panic!("no word of the tools left out:\n{system}"));
    assert!(
        listed > 0 && listed < on_offer,
        "{listed} listed:\n{system}"
    );
    assert_eq!(
        note,
        format!(
            "({} more tools are not listed here; `tools.search(\"words\")` finds them.)",
            on_offer - listed
        )
    );
}
