//! THINK's queue: rate limits, a full queue, connections that close, and
//! fairness between callers while the reactor stays fast.

use std::io::Write;
use std::time::{Duration, Instant};

use agentos_proto::{encode_frame, Opcode};
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{recv, request, Daemon};
use serde_json::json;

use crate::daemon_for;

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
    // Slow to generate, quick to say it is there: the kernel's health
    // probe (a GET of the model list) is answered at once.
    let stub = Stub::start(|request, _| match request.method.as_str() {
        "GET" => Reply::json(200, &serde_json::json!({"data": []})),
        _ => Reply::openai("ok", 10, 10).after(SLOW),
    });
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
        .filter(|r| r.method == "POST")
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
    // A reactor that waited on THINKs would answer in seconds; the bound is
    // no measure of speed (benches measure that).
    assert!(p99 < Duration::from_millis(100), "NOOP p99 {p99:?}");
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
