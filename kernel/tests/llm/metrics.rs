//! What THINK shows every local user through `[metrics] listen`: the
//! models the configuration names, whatever a request names and the
//! provider echoes.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Recorded, Reply, Stub};
use agentos_test_support::{act, until, Daemon};
use serde_json::json;

use crate::KEY;

/// An OpenAI chat completion under whatever model the request named, as
/// local servers answer.
fn echoing(request: &Recorded, _: usize) -> Reply {
    Reply::json(
        200,
        &json!({
            "id": "chatcmpl-echo", "object": "chat.completion",
            "model": request.json()["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }),
    )
}

fn scrape(socket: &Path) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Calls counted in `agentos_think_calls_total`, all models together.
fn calls_counted(text: &str) -> u64 {
    text.lines()
        .filter(|line| line.starts_with("agentos_think_calls_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Every value of a `model` label in `text`, as written.
fn model_labels(text: &str) -> BTreeSet<String> {
    text.split("model=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn metrics_label_only_configured_models_whatever_an_agent_names_and_the_provider_echoes() {
    let stub = Stub::start(echoing);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("metrics.sock");
    // The configured name has a newline: escaped in its label, it cannot
    // start a line of its own.
    let daemon = Daemon::start_with(&format!(
        "[metrics]\nlisten = \"{}\"\n\n[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\n\
         api_key = \"{KEY}\"\nmodel = \"stub\\nmodel\"\n",
        socket.display(),
        stub.url()
    ));
    let forged = format!("{}\nagentos_forged_total 1", "x".repeat(5000));
    let think = Opcode::THINK.0;
    let (_, replies) = act(
        &daemon,
        "thinker",
        json!({"permissions": {"think": true, "exec": false, "task": false, "tools": []}}),
        json!([[think, {"prompt": "hi", "model": forged}], [think, {"prompt": "hi"}]]),
    );
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert_eq!(
        replies[0]["reply"]["model"],
        forged.as_str(),
        "the provider echoes the name"
    );
    assert_eq!(replies[1]["reply"]["success"], true, "{replies:?}");
    let mut text = String::new();
    until("both calls in a snapshot", Duration::from_secs(10), || {
        text = scrape(&socket);
        calls_counted(&text) == 2
    });
    for line in [
        "agentos_think_calls_total{provider=\"openai\",model=\"other\"} 1",
        "agentos_think_calls_total{provider=\"openai\",model=\"stub\\nmodel\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in {text}");
    }
    let labels = model_labels(&text);
    let allowed = BTreeSet::from(["other".to_owned(), "stub\\nmodel".to_owned()]);
    assert!(
        labels.is_subset(&allowed),
        "model labels: {}",
        shortened(&labels)
    );
    assert!(
        !text.contains("xxxx") && !text.contains("agentos_forged"),
        "{}",
        &text[..text.len().min(2000)]
    );
}

/// Labels for a failure message, each cut to 60 characters.
fn shortened(labels: &BTreeSet<String>) -> String {
    let cut: Vec<String> = labels
        .iter()
        .map(|label| label.chars().take(60).collect())
        .collect();
    format!("{cut:?}")
}
