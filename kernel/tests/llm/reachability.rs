//! A provider that cannot be reached: the caller hears so within seconds,
//! with the host named, and HELLO says since when — until a call succeeds.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{request, Daemon};
use serde_json::json;

use crate::KEY;

/// A port on 127.0.0.1 nothing listens on (one the system just gave out
/// and took back).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_provider_that_refuses_connections_fails_fast_and_hello_says_unreachable_until_it_answers() {
    let port = closed_port();
    let host = format!("127.0.0.1:{port}");
    let daemon = Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"http://{host}/v1\"\napi_key = \"{KEY}\"\n\
         model = \"stub-model\"\n"
    ));
    let mut client = daemon.client();
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["llm"]["ready"], true, "nothing tried yet: {hello}");
    assert_eq!(hello["llm"]["state"], "ready", "{hello}");

    let started = Instant::now();
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    let took = started.elapsed();
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], "unavailable", "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(error.contains(&host), "the error names the host: {error}");
    assert!(
        took < Duration::from_secs(5),
        "a refused connection took {took:?} to report"
    );

    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    let llm = &hello["llm"];
    assert_eq!(llm["ready"], false, "{hello}");
    assert_eq!(llm["state"], "unreachable", "{hello}");
    let reason = llm["reason"].as_str().unwrap();
    assert!(reason.starts_with("unreachable since "), "{reason}");
    assert!(reason.contains(&host), "{reason}");
    let since = llm["unreachable_since"].as_str().unwrap();
    assert!(since.ends_with('Z') && reason.contains(since), "{hello}");
    assert!(
        llm["last_error"].as_str().unwrap().contains(&host),
        "{hello}"
    );
    assert_eq!(hello["features"]["think"], true, "THINK is still tried");

    // A second failure keeps the time of the first.
    let again = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(again["success"], false, "{again}");
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["llm"]["unreachable_since"], since, "{hello}");

    // The provider comes up on that port: one answered THINK, and ready.
    let stub = Stub::start_at(&host, |_, _| Reply::openai("stub says hi", 10, 5));
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(stub.requests().len(), 1);
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    let llm = &hello["llm"];
    assert_eq!(llm["ready"], true, "{hello}");
    assert_eq!(llm["state"], "ready", "{hello}");
    assert!(llm.get("reason").is_none(), "{hello}");
    assert!(llm.get("unreachable_since").is_none(), "{hello}");
}

#[test]
fn server_errors_still_get_the_polite_retries() {
    // A 503 is a busy provider, not a missing one: retried with backoff
    // (three attempts here), and HELLO does not call it unreachable.
    let stub = Stub::start(|_, n| {
        if n < 2 {
            Reply::json(503, &json!({"error": {"message": "overloaded"}}))
        } else {
            Reply::openai("stub says hi", 10, 5)
        }
    });
    let daemon = crate::daemon_for("openai", &stub, "");
    let mut client = daemon.client();
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(stub.requests().len(), 3);
    let hello = request(&mut client, Opcode::HELLO, &json!({}));
    assert_eq!(hello["llm"]["state"], "ready", "{hello}");
}
