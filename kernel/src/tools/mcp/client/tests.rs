use super::*;
use crate::tools::mcp::jsonrpc::LineReader;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The messages the client wrote since the last look.
fn sent(client: &mut McpClient) -> Vec<Value> {
    String::from_utf8(client.take_output())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn reply(client: &mut McpClient, id: u64, result: Value, now: Instant) -> Vec<ClientEvent> {
    let mut events = Vec::new();
    client.on_message(
        Incoming::Response {
            id,
            outcome: Ok(result),
        },
        now,
        &mut events,
    );
    events
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("does {name}"), "inputSchema": {"type": "object"}})
}

/// A client whose server has answered the handshake and listed `names`.
fn ready(names: &[&str], now: Instant) -> McpClient {
    let mut client = McpClient::new("everything", TIMEOUT, now);
    sent(&mut client);
    let init = json!({"protocolVersion": PROTOCOL, "capabilities": {"tools": {}}});
    reply(&mut client, 1, init, now);
    sent(&mut client);
    let tools: Vec<Value> = names.iter().map(|n| tool(n)).collect();
    let events = reply(&mut client, 2, json!({"tools": tools}), now);
    assert_eq!(events, vec![ClientEvent::ToolsListed(names.len())]);
    client
}

#[test]
fn the_handshake_offers_the_new_protocol_then_lists_every_page() {
    let now = Instant::now();
    let mut client = McpClient::new("everything", TIMEOUT, now);
    let hello = sent(&mut client);
    assert_eq!(hello[0]["method"], "initialize");
    assert_eq!(hello[0]["params"]["protocolVersion"], "2025-11-25");
    assert_eq!(client.state(), &ServerState::Starting);
    let init =
        json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": true}}});
    assert!(reply(&mut client, 1, init, now).is_empty());
    let next = sent(&mut client);
    assert_eq!(next[0]["method"], "notifications/initialized");
    assert!(next[0].get("id").is_none());
    assert_eq!(next[1]["method"], "tools/list");
    let page = json!({"tools": [tool("echo"), {"description": "no name"}], "nextCursor": "p2"});
    assert!(reply(&mut client, 2, page, now).is_empty());
    let second = sent(&mut client);
    assert_eq!(second[0]["params"]["cursor"], "p2");
    let events = reply(&mut client, 3, json!({"tools": [tool("get-sum")]}), now);
    assert_eq!(events, vec![ClientEvent::ToolsListed(2)]);
    assert_eq!(client.state(), &ServerState::Ready);
    let names: Vec<&str> = client.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo", "get-sum"]);
    assert_eq!(client.tools()[0].description, "does echo");
}

#[test]
fn an_unknown_protocol_version_fails_the_server_with_a_sentence() {
    let now = Instant::now();
    let mut client = McpClient::new("old", TIMEOUT, now);
    sent(&mut client);
    let events = reply(
        &mut client,
        1,
        json!({"protocolVersion": "2024-11-05"}),
        now,
    );
    let why = "speaks MCP protocol 2024-11-05; the kernel speaks 2025-11-25 and 2025-06-18";
    assert_eq!(events, vec![ClientEvent::Failed(why.into())]);
    assert_eq!(client.state(), &ServerState::Failed(why.into()));
    assert!(client.call(1, "x", json!({}), now + TIMEOUT, None).is_err());
}

#[test]
fn a_repeated_cursor_stops_the_listing() {
    let now = Instant::now();
    let mut client = McpClient::new("loop", TIMEOUT, now);
    sent(&mut client);
    reply(
        &mut client,
        1,
        json!({"protocolVersion": PROTOCOL, "capabilities": {"tools": {}}}),
        now,
    );
    reply(&mut client, 2, json!({"tools": [], "nextCursor": "a"}), now);
    reply(&mut client, 3, json!({"tools": [], "nextCursor": "b"}), now);
    let events = reply(&mut client, 4, json!({"tools": [], "nextCursor": "a"}), now);
    assert!(
        matches!(&events[..], [ClientEvent::Failed(why)] if why.contains("repeated the cursor")),
        "{events:?}"
    );
}

#[test]
fn a_changed_list_is_listed_again_even_mid_listing() {
    let now = Instant::now();
    let mut client = ready(&["echo"], now);
    let mut events = Vec::new();
    let changed = Incoming::Notification {
        method: "notifications/tools/list_changed".into(),
        params: Value::Null,
    };
    client.on_message(changed.clone(), now, &mut events);
    let list = sent(&mut client);
    assert_eq!(list[0]["method"], "tools/list");
    let id = list[0]["id"].as_u64().unwrap();
    // It changes again before the answer: one more listing follows.
    client.on_message(changed, now, &mut events);
    assert!(sent(&mut client).is_empty());
    let events = reply(
        &mut client,
        id,
        json!({"tools": [tool("echo"), tool("add")]}),
        now,
    );
    assert_eq!(events, vec![ClientEvent::ToolsListed(2)]);
    assert_eq!(sent(&mut client)[0]["method"], "tools/list");
}

#[test]
fn the_servers_requests_are_answered() {
    let now = Instant::now();
    let mut client = ready(&[], now);
    let mut events = Vec::new();
    for (id, method) in [(json!(7), "ping"), (json!("x"), "sampling/createMessage")] {
        client.on_message(
            Incoming::Request {
                id,
                method: method.into(),
            },
            now,
            &mut events,
        );
    }
    let answers = sent(&mut client);
    assert_eq!(answers[0], json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
    assert_eq!(answers[1]["id"], "x");
    assert_eq!(answers[1]["error"]["code"], -32601);
    assert!(events.is_empty());
}

#[test]
fn calls_end_in_a_result_a_tool_error_or_an_rpc_error() {
    let now = Instant::now();
    let mut client = ready(&["echo"], now);
    for call in 1..=3 {
        client
            .call(call, "echo", json!({"message": "hi"}), now + TIMEOUT, None)
            .unwrap();
    }
    let calls = sent(&mut client);
    assert_eq!(calls[0]["method"], "tools/call");
    assert_eq!(
        calls[0]["params"],
        json!({"name": "echo", "arguments": {"message": "hi"}})
    );
    let ids: Vec<u64> = calls.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    let done = reply(
        &mut client,
        ids[0],
        json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "structuredContent": {"a": 1}}),
        now,
    );
    assert_eq!(
        done,
        vec![ClientEvent::CallEnded {
            call: 1,
            outcome: CallOutcome::Done {
                content: json!([{"type": "text", "text": "{\"a\":1}"}]),
                structured: Some(json!({"a": 1})),
            }
        }]
    );
    let tool_error = reply(
        &mut client,
        ids[1],
        json!({"content": [{"type": "text", "text": "no such file"}], "isError": true}),
        now,
    );
    assert!(
        matches!(&tool_error[0], ClientEvent::CallEnded { call: 2, outcome: CallOutcome::ToolError { message, .. } } if message == "no such file")
    );
    let mut events = Vec::new();
    client.on_message(
        Incoming::Response {
            id: ids[2],
            outcome: Err(RpcError {
                code: -32602,
                message: "Invalid arguments for tool echo".into(),
                data: None,
            }),
        },
        now,
        &mut events,
    );
    assert_eq!(
        events,
        vec![ClientEvent::CallEnded {
            call: 3,
            outcome: CallOutcome::Rejected("Invalid arguments for tool echo".into())
        }]
    );
}

#[test]
fn a_call_past_its_deadline_is_cancelled_and_its_late_reply_ignored() {
    let now = Instant::now();
    let mut client = ready(&["slow"], now);
    client
        .call(9, "slow", json!({}), now + Duration::from_millis(100), None)
        .unwrap();
    let id = sent(&mut client)[0]["id"].as_u64().unwrap();
    assert_eq!(
        client.next_deadline(),
        Some(now + Duration::from_millis(100))
    );
    let mut events = Vec::new();
    client.on_deadlines(now + Duration::from_millis(50), &mut events);
    assert!(events.is_empty());
    client.on_deadlines(now + Duration::from_millis(100), &mut events);
    assert!(matches!(
        &events[..],
        [ClientEvent::CallEnded {
            call: 9,
            outcome: CallOutcome::TimedOut(_)
        }]
    ));
    let cancelled = sent(&mut client);
    assert_eq!(cancelled[0]["method"], "notifications/cancelled");
    assert_eq!(cancelled[0]["params"]["requestId"], id);
    assert!(reply(&mut client, id, json!({"content": []}), now).is_empty());
    assert_eq!(client.state(), &ServerState::Ready);
}

#[test]
fn a_cancelled_call_is_told_and_forgotten() {
    let now = Instant::now();
    let mut client = ready(&["slow"], now);
    client
        .call(4, "slow", json!({}), now + TIMEOUT, None)
        .unwrap();
    let id = sent(&mut client)[0]["id"].as_u64().unwrap();
    client.cancel(4, "the caller went away");
    let told = sent(&mut client);
    assert_eq!(
        told[0]["params"],
        json!({"requestId": id, "reason": "the caller went away"})
    );
    assert!(reply(&mut client, id, json!({"content": []}), now).is_empty());
    assert_eq!(client.next_deadline(), None);
}

#[test]
fn a_server_that_never_answers_initialize_fails_at_its_timeout() {
    let now = Instant::now();
    let mut client = McpClient::new("mute", Duration::from_millis(300), now);
    let mut events = Vec::new();
    client.on_deadlines(now + Duration::from_millis(300), &mut events);
    assert_eq!(
        events,
        vec![ClientEvent::Failed(
            "did not answer initialize within 300 ms".into()
        )]
    );
}

#[test]
fn an_oversized_reply_fails_its_call_and_garbage_is_reported() {
    let now = Instant::now();
    let mut client = ready(&["big"], now);
    client
        .call(5, "big", json!({}), now + TIMEOUT, None)
        .unwrap();
    let id = sent(&mut client)[0]["id"].as_u64().unwrap();
    let mut events = Vec::new();
    client.on_message(Incoming::Garbage("Server started".into()), now, &mut events);
    client.on_message(
        Incoming::Oversized {
            id: Some(id),
            bytes: 10 << 20,
        },
        now,
        &mut events,
    );
    assert_eq!(events[0], ClientEvent::Garbage("Server started".into()));
    assert!(
        matches!(&events[1], ClientEvent::CallEnded { call: 5, outcome: CallOutcome::Failed(why) } if why.contains("over the limit"))
    );
    assert_eq!(client.state(), &ServerState::Ready);
}

/// What the client makes of `bytes` as the server prints them.
fn printed(client: &mut McpClient, bytes: &[u8], now: Instant) -> Vec<ClientEvent> {
    let mut messages = Vec::new();
    LineReader::new(1 << 20).push(bytes, &mut messages);
    let mut events = Vec::new();
    for message in messages {
        client.on_message(message, now, &mut events);
    }
    events
}

/// The calls `events` ended as refused, with their reasons.
fn refusals(events: &[ClientEvent]) -> Vec<(CallId, String)> {
    events
        .iter()
        .map(|event| match event {
            ClientEvent::CallEnded {
                call,
                outcome: CallOutcome::Rejected(why),
            } => (*call, why.clone()),
            other => panic!("not a refused call: {other:?}"),
        })
        .collect()
}

#[test]
fn a_malformed_reply_ends_the_call_its_id_names_at_once_saying_why() {
    let now = Instant::now();
    let mut client = ready(&["echo"], now);
    for call in 1..=4 {
        client
            .call(call, "echo", json!({}), now + TIMEOUT, None)
            .unwrap();
    }
    let ids: Vec<u64> = sent(&mut client)
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let lines = [
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"content\":[{{\"type\":\"text\",\
             \"text\":\"a\0b\"}}]}}}}\n",
            ids[0]
        ),
        // The id last, after the nesting (as JavaScript servers write it);
        // an "id" inside the result is not the message's.
        format!(
            "{{\"result\":{{\"structuredContent\":{{\"id\":{},\"deep\":{deep}}}}},\"id\":{}}}\n",
            ids[3], ids[1]
        ),
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{}}}\n", ids[2]),
    ];
    let mut events = Vec::new();
    for line in &lines {
        events.extend(printed(&mut client, line.as_bytes(), now));
    }
    let refused = refusals(&events);
    let expected = [
        (1, "a raw NUL byte inside a string"),
        (2, "nested deeper than 128 levels"),
        (3, "neither a result nor an error"),
    ];
    assert_eq!(refused.len(), expected.len(), "{refused:?}");
    for ((call, why), (expected_call, fault)) in refused.iter().zip(expected) {
        assert_eq!(*call, expected_call, "{refused:?}");
        assert!(why.contains("the server's reply was malformed"), "{why}");
        assert!(why.contains(fault), "{why}");
    }
    // The fourth call waits on; the server stays of use.
    assert_eq!(client.next_deadline(), Some(now + TIMEOUT));
    assert_eq!(client.state(), &ServerState::Ready);
}

#[test]
fn an_unreadable_line_that_names_no_awaited_request_is_only_reported() {
    let now = Instant::now();
    let mut client = ready(&["echo"], now);
    client
        .call(1, "echo", json!({}), now + TIMEOUT, None)
        .unwrap();
    let id = sent(&mut client)[0]["id"].as_u64().unwrap();
    let lines = [
        // Cut short before any id.
        "{\"broken\": \n".to_owned(),
        // A notification of the server's, its params naming the call.
        format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\
             \"params\":{{\"id\":{id},\"text\":\"a\0b\"}}}}\n"
        ),
        // A request of the server's: its id is the server's own number.
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\",\"x\":\"\0\"}}\n"),
        // The answer to a request no longer awaited.
        "{\"jsonrpc\":\"2.0\",\"id\":999,\"result\":\"\0\"}\n".to_owned(),
    ];
    for line in &lines {
        let events = printed(&mut client, line.as_bytes(), now);
        assert!(
            matches!(&events[..], [ClientEvent::Garbage(_)]),
            "{line:?}: {events:?}"
        );
    }
    let events = printed(
        &mut client,
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[]}}}}\n").as_bytes(),
        now,
    );
    assert!(
        matches!(
            &events[..],
            [ClientEvent::CallEnded {
                call: 1,
                outcome: CallOutcome::Done { .. }
            }]
        ),
        "{events:?}"
    );
}

#[test]
fn a_malformed_answer_to_the_handshake_fails_the_server() {
    let now = Instant::now();
    let mut client = McpClient::new("broken", TIMEOUT, now);
    sent(&mut client);
    let events = printed(
        &mut client,
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":\"\0\"}}\n",
        now,
    );
    assert!(
        matches!(&events[..], [ClientEvent::Failed(why)] if why.contains("a raw NUL byte")),
        "{events:?}"
    );
}

#[test]
fn a_server_that_ends_fails_its_calls() {
    let now = Instant::now();
    let mut client = ready(&["echo"], now);
    client
        .call(1, "echo", json!({}), now + TIMEOUT, None)
        .unwrap();
    let mut events = Vec::new();
    client.ended("it exited with status 1", &mut events);
    assert!(
        matches!(&events[0], ClientEvent::CallEnded { call: 1, outcome: CallOutcome::Failed(why) } if why.contains("exited"))
    );
    assert_eq!(
        events[1],
        ClientEvent::Failed("it exited with status 1".into())
    );
    assert_eq!(client.next_deadline(), None);
}

fn refuse(
    client: &mut McpClient,
    id: u64,
    code: i64,
    data: Option<Value>,
    now: Instant,
) -> Vec<ClientEvent> {
    let mut events = Vec::new();
    let error = RpcError {
        code,
        message: "refused".into(),
        data,
    };
    client.on_message(
        Incoming::Response {
            id,
            outcome: Err(error),
        },
        now,
        &mut events,
    );
    events
}

const META_VERSION_POINTER: &str = "/params/_meta/io.modelcontextprotocol~1protocolVersion";

#[test]
fn a_modern_server_is_probed_then_spoken_to_with_meta_and_no_handshake() {
    let now = Instant::now();
    let mut client = McpClient::probing("modern", Transport::Stdio, TIMEOUT, now);
    let probe = client.take_messages();
    assert_eq!(probe[0].method.as_deref(), Some("server/discover"));
    assert_eq!(probe[0].protocol_version.as_deref(), Some(MODERN));
    let body: Value = serde_json::from_slice(&probe[0].body).unwrap();
    assert_eq!(body.pointer(META_VERSION_POINTER), Some(&json!(MODERN)));
    let found = json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}});
    assert!(reply(&mut client, 1, found, now).is_empty());
    assert_eq!(client.era(), &Era::Modern);
    let listing = sent(&mut client);
    assert_eq!(
        listing.len(),
        1,
        "no notifications/initialized: {listing:?}"
    );
    assert_eq!(listing[0]["method"], "tools/list");
    assert_eq!(
        listing[0].pointer(META_VERSION_POINTER),
        Some(&json!(MODERN))
    );
    let events = reply(&mut client, 2, json!({"tools": [tool("add")]}), now);
    assert_eq!(events, vec![ClientEvent::ToolsListed(1)]);
    client
        .call(7, "add", json!({"a": 1}), now + TIMEOUT, None)
        .unwrap();
    let call = client.take_messages();
    assert_eq!(call[0].name.as_deref(), Some("add"));
    let body: Value = serde_json::from_slice(&call[0].body).unwrap();
    assert_eq!(body.pointer(META_VERSION_POINTER), Some(&json!(MODERN)));
    assert_eq!(body["params"]["arguments"], json!({"a": 1}));
    // A result that asks for input is not taken for an answer.
    let events = reply(
        &mut client,
        3,
        json!({"resultType": "input_required", "inputRequests": {}}),
        now,
    );
    assert!(
        matches!(&events[..], [ClientEvent::CallEnded { call: 7, outcome: CallOutcome::Rejected(why) }] if why.contains("input_required")),
        "{events:?}"
    );
}

#[test]
fn a_server_that_does_not_know_discover_gets_the_handshake() {
    let now = Instant::now();
    let mut client = McpClient::probing("legacy", Transport::Http, TIMEOUT, now);
    client.take_messages();
    assert!(refuse(&mut client, 1, -32601, None, now).is_empty());
    let hello = client.take_messages();
    assert_eq!(hello[0].method.as_deref(), Some("initialize"));
    assert_eq!(hello[0].protocol_version, None);
    let init = json!({"protocolVersion": PROTOCOL, "capabilities": {"tools": {}}});
    reply(&mut client, 2, init, now);
    let next = client.take_messages();
    assert_eq!(next[0].method.as_deref(), Some("notifications/initialized"));
    assert_eq!(next[1].protocol_version.as_deref(), Some(PROTOCOL));
    let body: Value = serde_json::from_slice(&next[1].body).unwrap();
    assert!(body["params"].get("_meta").is_none(), "{body}");
    assert_eq!(client.era(), &Era::Handshake(PROTOCOL.into()));
}

#[test]
fn a_silent_probe_means_the_earlier_era_on_stdio_and_a_failure_over_http() {
    let now = Instant::now();
    const LONG: Duration = Duration::from_secs(20);
    let mut stdio = McpClient::probing("quiet", Transport::Stdio, LONG, now);
    stdio.take_messages();
    let mut events = Vec::new();
    stdio.on_deadlines(now + PROBE_TIMEOUT, &mut events);
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(sent(&mut stdio)[0]["method"], "initialize");

    let mut http = McpClient::probing("quiet", Transport::Http, LONG, now);
    http.take_messages();
    http.on_deadlines(now + PROBE_TIMEOUT, &mut events);
    assert!(events.is_empty(), "the whole timeout is waited: {events:?}");
    http.on_deadlines(now + LONG, &mut events);
    assert_eq!(
        events,
        vec![ClientEvent::Failed(
            "did not answer server/discover within 20000 ms".into()
        )]
    );
}

#[test]
fn modern_refusals_are_answers_not_a_reason_to_fall_back() {
    let now = Instant::now();
    // An unsupported version, listing only the earlier era: the handshake.
    let mut client = McpClient::probing("dual", Transport::Stdio, TIMEOUT, now);
    client.take_messages();
    let data = json!({"supported": ["2025-11-25"], "requested": MODERN});
    assert!(refuse(&mut client, 1, -32022, Some(data), now).is_empty());
    assert_eq!(sent(&mut client)[0]["method"], "initialize");
    // ...listing nothing the kernel speaks: the server fails, saying so.
    let mut client = McpClient::probing("future", Transport::Stdio, TIMEOUT, now);
    client.take_messages();
    let data = json!({"supported": ["2030-01-01"]});
    let events = refuse(&mut client, 1, -32022, Some(data), now);
    assert!(
        matches!(&events[..], [ClientEvent::Failed(why)] if why.contains("speaks MCP protocol 2030-01-01")),
        "{events:?}"
    );
    // A header mismatch is a modern server's complaint: no fallback.
    let mut client = McpClient::probing("strict", Transport::Http, TIMEOUT, now);
    client.take_messages();
    let events = refuse(&mut client, 1, -32020, None, now);
    assert!(
        matches!(&events[..], [ClientEvent::Failed(why)] if why.contains("server/discover was refused")),
        "{events:?}"
    );
    assert!(client.take_messages().is_empty());
}

#[test]
fn a_late_modern_server_that_refuses_the_handshake_is_spoken_to_in_its_era() {
    let now = Instant::now();
    let mut client = McpClient::probing("slow", Transport::Stdio, TIMEOUT, now);
    client.take_messages();
    let mut events = Vec::new();
    client.on_deadlines(now + PROBE_TIMEOUT, &mut events);
    client.take_messages();
    // It took the (now forgotten) probe as its era and refuses initialize.
    let data = json!({"supported": [MODERN]});
    assert!(refuse(&mut client, 2, -32022, Some(data), now).is_empty());
    assert_eq!(client.era(), &Era::Modern);
    let listing = sent(&mut client);
    assert_eq!(listing[0]["method"], "tools/list");
    assert_eq!(
        listing[0].pointer(META_VERSION_POINTER),
        Some(&json!(MODERN))
    );
}
