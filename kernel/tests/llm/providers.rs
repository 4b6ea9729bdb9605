//! What the kernel sends each provider and how it reads the answers: wire
//! formats, retries and their delays, errors, the key, redirects, and the
//! local model's absence.

use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Recorded, Reply, Stub};
use agentos_test_support::{request, Daemon};
use serde_json::json;

use crate::{daemon_for, KEY};

fn think(daemon: &Daemon, body: serde_json::Value) -> serde_json::Value {
    let mut client = daemon.client();
    request(&mut client, Opcode::THINK, &body)
}

fn assert_answered(reply: &serde_json::Value) {
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["content"], "stub says hi", "{reply}");
    assert_eq!(reply["tokens"], 15, "{reply}");
    assert_eq!(
        reply["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );
    assert_eq!(reply["model"], "stub-model");
    assert!(
        reply["queue_ms"].is_u64() && reply["latency_ms"].is_u64(),
        "{reply}"
    );
}

/// The gap between the first and second request the stub saw.
fn retry_gap(requests: &[Recorded]) -> Duration {
    assert!(requests.len() >= 2, "{} requests", requests.len());
    requests[1].at - requests[0].at
}

#[test]
fn openai_wire_format() {
    let stub = Stub::start(|_, _| Reply::openai("stub says hi", 10, 5));
    let daemon = daemon_for("openai", &stub, "");
    let reply = think(
        &daemon,
        json!({"prompt": "What is 2+2?", "system": "Be brief.", "max_tokens": 20, "temperature": 0.5}),
    );
    assert_answered(&reply);
    let sent = stub.requests();
    assert_eq!(sent.len(), 1);
    let sent = &sent[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(
        sent.json(),
        json!({"model": "stub-model", "max_tokens": 20, "temperature": 0.5,
               "messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "What is 2+2?"}]})
    );
}

#[test]
fn anthropic_wire_format() {
    let stub = Stub::start(|_, _| Reply::anthropic("stub says hi", 10, 5));
    let daemon = daemon_for("anthropic", &stub, "");
    let reply = think(
        &daemon,
        json!({"messages": [{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello."},
                            {"role": "user", "content": "What is 2+2?"}],
               "system_instruction": "Be brief."}),
    );
    assert_answered(&reply);
    let sent = &stub.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    let body = sent.json();
    assert_eq!(body["model"], "stub-model");
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(body["max_tokens"], 512, "max_tokens is always sent: {body}");
    assert_eq!(body["messages"].as_array().unwrap().len(), 3);
    assert_eq!(body["messages"][2]["content"], "What is 2+2?");
}

#[test]
fn gemini_wire_format() {
    let stub = Stub::start(|_, _| Reply::gemini("stub says hi", 10, 5));
    let daemon = daemon_for("gemini", &stub, "");
    let reply = think(
        &daemon,
        json!({"prompt": "What is 2+2?", "system": "Be brief.", "max_tokens": 30}),
    );
    assert_answered(&reply);
    let sent = &stub.requests()[0];
    assert_eq!(sent.path, "/v1beta/models/stub-model:generateContent");
    assert_eq!(sent.header("x-goog-api-key"), Some(KEY));
    let body = sent.json();
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "What is 2+2?"}]}])
    );
    assert_eq!(body["systemInstruction"]["parts"][0]["text"], "Be brief.");
    assert_eq!(body["generationConfig"]["maxOutputTokens"], 30);
}

#[test]
fn a_429_is_retried_after_its_retry_after() {
    let stub = Stub::start(|_, n| match n {
        0 => Reply::json(429, &json!({"error": {"message": "slow down"}}))
            .with_header("retry-after", "1"),
        _ => Reply::openai("stub says hi", 10, 5),
    });
    let daemon = daemon_for("openai", &stub, "");
    assert_answered(&think(&daemon, json!({"prompt": "hi"})));
    let gap = retry_gap(&stub.requests());
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    assert!(gap < Duration::from_millis(1500), "retried after {gap:?}");
}

#[test]
fn retry_after_ms_wins_over_retry_after() {
    let stub = Stub::start(|_, n| match n {
        0 => Reply::json(429, &json!({}))
            .with_header("retry-after-ms", "1500")
            .with_header("retry-after", "5"),
        _ => Reply::openai("stub says hi", 10, 5),
    });
    let daemon = daemon_for("openai", &stub, "");
    assert_answered(&think(&daemon, json!({"prompt": "hi"})));
    let gap = retry_gap(&stub.requests());
    assert!(
        gap >= Duration::from_millis(1500) && gap < Duration::from_secs(3),
        "retried after {gap:?}"
    );
}

#[test]
fn gemini_retry_info_sets_the_delay() {
    let stub = Stub::start(|_, n| match n {
        0 => Reply::json(
            429,
            &json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
                    "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                 "retryDelay": "1.2s"}]}}),
        ),
        _ => Reply::gemini("stub says hi", 10, 5),
    });
    let daemon = daemon_for("gemini", &stub, "");
    assert_answered(&think(&daemon, json!({"prompt": "hi"})));
    let gap = retry_gap(&stub.requests());
    assert!(
        gap >= Duration::from_millis(1200) && gap < Duration::from_millis(2000),
        "retried after {gap:?}"
    );
}

#[test]
fn server_errors_are_retried_with_backoff() {
    let stub = Stub::start(|_, n| match n {
        0 | 1 => Reply::json(500, &json!({"error": {"message": "oops"}})),
        _ => Reply::anthropic("stub says hi", 10, 5),
    });
    let daemon = daemon_for("anthropic", &stub, "");
    assert_answered(&think(&daemon, json!({"prompt": "hi"})));
    let sent = stub.requests();
    assert_eq!(sent.len(), 3);
    // Equal-jitter backoff: 250-500 ms, then 500-1000 ms.
    let first = sent[1].at - sent[0].at;
    let second = sent[2].at - sent[1].at;
    assert!(first >= Duration::from_millis(250), "{first:?}");
    assert!(second >= Duration::from_millis(500), "{second:?}");
}

#[test]
fn unauthorised_is_not_retried_and_says_so() {
    let stub = Stub::start(|_, _| {
        Reply::json(
            401,
            &json!({"error": {"message": "Incorrect API key provided"}}),
        )
    });
    let daemon = daemon_for("openai", &stub, "");
    let reply = think(&daemon, json!({"prompt": "hi"}));
    assert_eq!(reply["success"], false);
    assert_eq!(reply["content"], "");
    assert_eq!(reply["tokens"], 0);
    assert_eq!(reply["code"], "unavailable");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("401") && error.contains("API key"),
        "{error}"
    );
    assert_eq!(stub.requests().len(), 1, "a 401 must not be retried");
}

#[test]
fn insufficient_quota_is_not_retried() {
    let stub = Stub::start(|_, _| {
        Reply::json(
            429,
            &json!({"error": {"message": "You exceeded your current quota",
                              "type": "insufficient_quota", "code": "insufficient_quota"}}),
        )
    });
    let daemon = daemon_for("openai", &stub, "");
    let reply = think(&daemon, json!({"prompt": "hi"}));
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "limit_exceeded", "{reply}");
    assert_eq!(stub.requests().len(), 1);
}

#[test]
fn a_malformed_reply_is_a_clear_error() {
    let stub = Stub::start(|_, _| Reply::raw(200, b"<html>not json</html>"));
    let daemon = daemon_for("openai", &stub, "");
    let reply = think(&daemon, json!({"prompt": "hi"}));
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "unavailable");
    assert!(
        reply["error"].as_str().unwrap().contains("cannot read"),
        "{reply}"
    );
    assert_eq!(stub.requests().len(), 1);
    // The kernel is fine.
    let mut client = daemon.client();
    assert_eq!(client.noop(b"alive").unwrap(), b"alive");
}

#[test]
fn a_hanging_provider_is_retried_then_times_out() {
    let stub = Stub::start(|_, _| Reply::openai("too late", 1, 1).after(Duration::from_secs(5)));
    let daemon = daemon_for(
        "openai",
        &stub,
        "timeout_ms = 1500\nattempt_timeout_ms = 500\n",
    );
    let started = Instant::now();
    let reply = think(&daemon, json!({"prompt": "hi"}));
    let took = started.elapsed();
    assert_eq!(reply["success"], false);
    assert_eq!(reply["code"], "timeout", "{reply}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    assert!(stub.requests().len() >= 2, "a hung attempt is retried");
}

#[test]
fn the_key_stays_in_the_kernel() {
    let stub = Stub::start(|_, _| Reply::json(401, &json!({"error": {"message": "bad key"}})));
    let daemon = daemon_for("openai", &stub, "");
    let reply = think(&daemon, json!({"prompt": "hi"}));
    let mut client = daemon.client();
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["llm"]["provider"], "openai");
    assert_eq!(hello["llm"]["model"], "stub-model");
    for text in [reply.to_string(), hello.to_string(), daemon.log()] {
        assert!(!text.contains(KEY), "the key leaked: {text}");
    }
}

#[test]
fn without_the_local_model_hello_says_how_to_install_it() {
    let daemon = Daemon::start_with(
        "[llm]\nprovider = \"local\"\nlocal.python = \"/nonexistent/bin/python\"\n",
    );
    let mut client = daemon.client();
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["features"]["think"], false, "{hello}");
    assert_eq!(hello["llm"]["provider"], "local");
    assert_eq!(hello["llm"]["ready"], false);
    let reason = hello["llm"]["reason"].as_str().unwrap();
    assert!(reason.contains("scripts/setup"), "{reason}");
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(reply["code"], "unavailable", "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("scripts/setup"),
        "{reply}"
    );
}

#[test]
fn a_redirect_is_not_followed_so_the_key_goes_nowhere_else() {
    let elsewhere = Stub::start(|_, _| Reply::anthropic("stub says hi", 10, 5));
    let target = format!("{}/v1/messages", elsewhere.url());
    let stub = Stub::start(move |_, _| Reply::raw(302, b"").with_header("location", &target));
    let daemon = daemon_for("anthropic", &stub, "");
    let reply = think(&daemon, json!({"prompt": "hi"}));
    assert_eq!(reply["success"], false, "{reply}");
    assert!(reply["error"].as_str().unwrap().contains("302"), "{reply}");
    assert!(
        elsewhere.requests().is_empty(),
        "the request (and its key) followed the redirect"
    );
}

#[test]
fn the_local_model_refuses_a_model_name_it_does_not_serve() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup, which installs the local model",
        python.display()
    );
    // The refusal comes before the model is needed: no wait for it to load.
    let daemon = Daemon::start_with("[llm]\nprovider = \"local\"\n");
    let mut client = daemon.client();
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["features"]["think"], true, "{hello}");
    let reply = request(
        &mut client,
        Opcode::THINK,
        &json!({"prompt": "hi", "model": "gpt-4"}),
    );
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], "bad_request", "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("`model`")
            && error.contains("Qwen2.5-Coder-1.5B-Instruct")
            && error.contains("gpt-4"),
        "{error}"
    );
}
