//! THINK against a stand-in provider: the exact requests each wire format
//! sends, what is retried and what is not, timeouts, fairness between
//! callers, and a reactor that stays responsive while THINKs queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, Opcode};
use agentos_test_support::llm_stub::{Recorded, Reply, Stub};
use agentos_test_support::{recv, request, Daemon};
use serde_json::json;

const KEY: &str = "sk-test-0123456789abcdef";

/// A daemon whose THINK goes to `stub` as `provider`, with extra `[llm]`
/// settings.
fn daemon_for(provider: &str, stub: &Stub, extra: &str) -> Daemon {
    let base = match provider {
        "openai" => format!("{}/v1", stub.url()),
        _ => stub.url(),
    };
    Daemon::start_with(&format!(
        "[llm]\nprovider = \"{provider}\"\nbase_url = \"{base}\"\napi_key = \"{KEY}\"\n\
         model = \"stub-model\"\n{extra}"
    ))
}

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

/// A connection that has sent `count` THINKs of `payload` at once.
fn pipeline_thinks(
    daemon: &Daemon,
    count: usize,
    payload: &[u8],
) -> std::os::unix::net::UnixStream {
    let mut stream = daemon.raw();
    let batch: Vec<u8> = (0..count)
        .flat_map(|_| encode_frame(Opcode::THINK, 0, payload))
        .collect();
    stream.write_all(&batch).unwrap();
    stream
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
fn rate_limits_space_requests_out() {
    let stub = Stub::start(|_, _| Reply::openai("stub says hi", 10, 5));
    // 120 a minute: a burst of 120, then one every 500 ms.
    let daemon = daemon_for("openai", &stub, "rpm = 120\n");
    let mut client = daemon.client();
    let total = 126;
    for _ in 0..total {
        client
            .send(Opcode::THINK, br#"{"prompt":"hi","max_tokens":5}"#)
            .unwrap();
    }
    for _ in 0..total {
        let reply: serde_json::Value =
            serde_json::from_slice(&client.recv().unwrap().payload).unwrap();
        assert_eq!(reply["success"], true, "{reply}");
    }
    let sent = stub.requests();
    // What refilled while the burst went out is spent by now.
    let last_gap = sent[total - 1].at - sent[total - 2].at;
    assert!(
        last_gap >= Duration::from_millis(400),
        "the last request went {last_gap:?} after the one before"
    );
}

#[test]
fn a_full_queue_is_busy() {
    let stub = Stub::start(|_, _| Reply::openai("slow", 1, 1).after(Duration::from_millis(500)));
    let daemon = daemon_for("openai", &stub, "concurrency = 1\nmax_queued = 2\n");
    let mut client = daemon.client();
    for _ in 0..4 {
        client.send(Opcode::THINK, b"hi").unwrap();
    }
    let codes: Vec<String> = (0..4)
        .map(|_| {
            let reply: serde_json::Value =
                serde_json::from_slice(&client.recv().unwrap().payload).unwrap();
            reply["code"].as_str().unwrap_or("ok").to_owned()
        })
        .collect();
    // One at the provider, two queued, one refused.
    assert_eq!(codes, ["ok", "ok", "ok", "busy"]);
}

#[test]
fn a_closed_connection_takes_its_queued_thinks_with_it() {
    let stub = Stub::start(|_, _| Reply::openai("slow", 1, 1).after(Duration::from_millis(300)));
    let daemon = daemon_for("openai", &stub, "concurrency = 1\n");
    {
        let _raw = pipeline_thinks(&daemon, 10, b"hi");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let sent = stub.requests().len();
    assert!(
        sent <= 2,
        "{sent} THINKs of a closed connection reached the provider"
    );
}

/// Fairness: with one request at a time and a 50 ms provider, a client
/// pipelining 30 THINKs does not hold up a second client's THINKs by more
/// than about two service times each (first come, first served would make
/// each wait ~30).
#[test]
fn a_backlog_does_not_delay_another_caller() {
    const SERVICE: Duration = Duration::from_millis(50);
    let stub = Stub::start(|_, _| Reply::openai("ok", 10, 10).after(SERVICE));
    let daemon = daemon_for("openai", &stub, "concurrency = 1\n");
    let mut greedy = pipeline_thinks(&daemon, 30, br#"{"prompt":"hi","max_tokens":10}"#);
    std::thread::sleep(SERVICE * 2);
    let mut polite = daemon.client();
    let mut waits = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let reply = request(
            &mut polite,
            Opcode::THINK,
            &json!({"prompt": "hi", "max_tokens": 10}),
        );
        assert_eq!(reply["success"], true, "{reply}");
        waits.push(started.elapsed());
    }
    let worst = *waits.iter().max().unwrap();
    eprintln!("second caller's THINKs took {waits:?} behind a backlog of 30");
    assert!(
        worst <= SERVICE * 5,
        "a THINK waited {worst:?} behind another caller's backlog ({waits:?}); FIFO would be ~1.5 s"
    );
    for _ in 0..30 {
        recv(&mut greedy);
    }
}

/// A newcomer is not held up by another caller's backlog, however far the
/// provider's usage is from what the kernel estimated before sending: with
/// one request at a time, at most the request already at the provider and
/// one more go before the newcomer's (two service times).
#[test]
fn a_newcomer_is_next_whatever_the_usage_says() {
    const SERVICE: Duration = Duration::from_millis(50);
    for (label, usage) in [("far below", 10u64), ("far above", 2000)] {
        let stub = Stub::start(move |_, _| {
            Reply::openai("ok", usage / 2, usage - usage / 2).after(SERVICE)
        });
        let daemon = daemon_for("openai", &stub, "concurrency = 1\n");
        let mut greedy = pipeline_thinks(&daemon, 30, br#"{"prompt":"greedy","max_tokens":256}"#);
        std::thread::sleep(SERVICE * 4);
        let mut polite = daemon.client();
        let seen_before = stub.requests().len();
        let started = Instant::now();
        let reply = request(
            &mut polite,
            Opcode::THINK,
            &json!({"prompt": "polite", "max_tokens": 256}),
        );
        let waited = started.elapsed();
        assert_eq!(reply["success"], true, "{reply}");
        let position = stub
            .requests()
            .iter()
            .position(|r| r.json()["messages"][0]["content"] == "polite")
            .unwrap();
        eprintln!(
            "usage {label} the estimate: the newcomer's THINK was request {} after it arrived, \
             answered in {:.1} service times",
            position + 1 - seen_before,
            waited.as_secs_f64() / SERVICE.as_secs_f64()
        );
        assert!(
            position <= seen_before + 1,
            "usage {label} the estimate: {} of the backlog's requests went before the \
             newcomer's",
            position - seen_before
        );
        for _ in 0..30 {
            recv(&mut greedy);
        }
    }
}

/// One caller never holds every slot at the provider while another waits:
/// with four slots and a provider taking 3 s a call, a client pipelining
/// eight THINKs has three at the provider, and a second client's THINK
/// takes the fourth at once instead of waiting out one of the first's.
#[test]
fn a_caller_with_slow_thinks_leaves_a_slot_for_another() {
    const SLOW: Duration = Duration::from_secs(3);
    let stub = Stub::start(|_, _| Reply::openai("ok", 10, 10).after(SLOW));
    let daemon = daemon_for("openai", &stub, "concurrency = 4\n");
    let mut greedy = pipeline_thinks(&daemon, 8, br#"{"prompt":"greedy","max_tokens":10}"#);
    std::thread::sleep(Duration::from_millis(200));
    let mut other = daemon.client();
    let started = Instant::now();
    let reply = request(
        &mut other,
        Opcode::THINK,
        &json!({"prompt": "other", "max_tokens": 10}),
    );
    let took = started.elapsed();
    assert_eq!(reply["success"], true, "{reply}");
    let queue_ms = reply["queue_ms"].as_u64().unwrap();
    let greedy_before = stub
        .requests()
        .iter()
        .position(|r| r.json()["messages"][0]["content"] == "other")
        .unwrap();
    eprintln!(
        "the second caller's THINK queued {queue_ms} ms, answered in {took:?}, behind \
         {greedy_before} of the first caller's at the provider"
    );
    assert!(
        queue_ms < 500,
        "the second caller's THINK queued {queue_ms} ms behind the first caller's calls"
    );
    assert!(
        took < SLOW + Duration::from_secs(1),
        "the second caller's THINK took {took:?} with a provider taking {SLOW:?}"
    );
    assert_eq!(
        greedy_before, 3,
        "the first caller had {greedy_before} THINKs at the provider of 4 slots"
    );
    // The first caller's THINKs all go in the end.
    for _ in 0..8 {
        let (_, payload) = recv(&mut greedy);
        let reply: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(reply["success"], true, "{reply}");
    }
}

/// The reactor never waits for the provider: NOOPs stay fast while 50
/// THINKs are queued behind a slow one.
#[test]
fn noops_stay_fast_while_thinks_queue() {
    let stub = Stub::start(|_, _| Reply::openai("ok", 10, 10).after(Duration::from_millis(50)));
    let daemon = daemon_for("openai", &stub, "concurrency = 1\n");
    let mut thinker = pipeline_thinks(&daemon, 50, b"hi");
    std::thread::sleep(Duration::from_millis(100));
    let mut pinger = daemon.client();
    let mut samples: Vec<Duration> = (0..500)
        .map(|_| {
            let started = Instant::now();
            pinger.noop(b"ping").unwrap();
            let took = started.elapsed();
            std::thread::sleep(Duration::from_millis(2));
            took
        })
        .collect();
    let queued_at_end = 50 - stub.requests().len();
    samples.sort_unstable();
    let p99 = samples[(samples.len() * 99) / 100 - 1];
    eprintln!("NOOP p99 {p99:?} with THINKs queued ({queued_at_end} still waiting at the end)");
    assert!(
        queued_at_end > 0,
        "the THINKs drained before the NOOPs ended"
    );
    assert!(p99 < Duration::from_millis(5), "NOOP p99 {p99:?}");
    for _ in 0..50 {
        recv(&mut thinker);
    }
}

/// Two backlogged callers of equal weight are served alternately once both
/// wait (the stub tells them apart by their prompts).
#[test]
fn two_backlogged_callers_share_the_provider_evenly() {
    let stub = Stub::start(|_, _| Reply::openai("ok", 10, 10).after(Duration::from_millis(10)));
    let daemon = daemon_for("openai", &stub, "concurrency = 1\n");
    let mut a = pipeline_thinks(&daemon, 40, br#"{"prompt":"light","max_tokens":10}"#);
    let mut b = pipeline_thinks(&daemon, 40, br#"{"prompt":"heavy","max_tokens":10}"#);
    for _ in 0..40 {
        recv(&mut a);
        recv(&mut b);
    }
    let order: Vec<bool> = stub
        .requests()
        .iter()
        .map(|r| r.json()["messages"][0]["content"] == "heavy")
        .collect();
    // Caller a may get a few in before b's requests arrive; from b's
    // first on, while both wait, they take turns.
    let first_b = order.iter().position(|heavy| *heavy).unwrap();
    let window = &order[first_b..first_b + 30];
    let b_served = window.iter().filter(|heavy| **heavy).count();
    assert!(
        (14..=16).contains(&b_served),
        "caller b got {b_served} of 30 turns while both waited: {order:?}"
    );
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
