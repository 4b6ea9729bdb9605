//! The registry between connections, with no agent running: names, mail
//! in order, bounds, trees apart, and what a closed connection leaves.

use agentos_proto::payload::{
    BroadcastRequest, RecvRequest, RegisterRequest, SendRequest, SenderKind,
};
use agentos_proto::ErrorCode;

use super::*;
use crate::config::Config;

fn agents() -> (Agents, tempfile::TempDir) {
    let logs = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.agents.log_dir = Some(logs.path().to_path_buf());
    let gateway = std::sync::Arc::new(agentos_egress::Gateway::without_proxy());
    (Agents::new(&config, gateway).unwrap(), logs)
}

fn operator(id: u32, uid: u32) -> Sender {
    Sender {
        address: Address::Connection(id),
        uid,
        role: Role::Operator {
            serial: u64::from(id),
        },
    }
}

fn run(id: u32, uid: u32) -> Sender {
    Sender {
        address: Address::Connection(id),
        uid,
        role: Role::Run {
            serial: u64::from(id),
            of_agent: None,
        },
    }
}

fn send(json: &str) -> SendRequest {
    SendRequest::parse(json.as_bytes()).unwrap()
}

fn register(name: &str) -> RegisterRequest {
    RegisterRequest {
        name: name.to_owned(),
    }
}

const A: u32 = 1_000_000;
const B: u32 = 1_000_001;
const STRANGER: u32 = 1_000_002;

#[test]
fn connections_of_one_uid_message_by_name_and_id_in_order() {
    let (agents, _logs) = agents();
    let mut messages = Messages::default();
    let a = messages
        .register(&agents, operator(A, 0), register("a"))
        .unwrap();
    assert_eq!((a.agent_id, a.name.as_str()), (A, "a"));
    messages.recv(&agents, operator(B, 0), &RecvRequest::default());
    let to_a = send(r#"{"message":{"n":1},"to_name":"a"}"#);
    assert_eq!(
        messages
            .send(&agents, operator(B, 0), to_a)
            .unwrap()
            .delivered_to,
        A
    );
    let to_a = send(&format!(r#"{{"message":{{"n":2}},"to":{A}}}"#));
    messages.send(&agents, operator(B, 0), to_a).unwrap();
    let got = messages.recv(&agents, operator(A, 0), &RecvRequest::default());
    assert_eq!(got.count, 2);
    assert_eq!(got.messages[0].message["n"], 1);
    assert_eq!(got.messages[1].message["n"], 2);
    assert_eq!((got.messages[0].from_id, got.messages[0].from), (B, B));
    assert_eq!(got.messages[0].from_name, None);
    assert_eq!(got.messages[0].from_kind, SenderKind::Operator);
}

#[test]
fn another_uid_is_not_there_and_a_run_cannot_register() {
    let (agents, _logs) = agents();
    let mut messages = Messages::default();
    messages
        .register(&agents, operator(A, 0), register("a"))
        .unwrap();
    let by_name = messages.send(
        &agents,
        operator(STRANGER, 7),
        send(r#"{"message":1,"to_name":"a"}"#),
    );
    assert_eq!(by_name.unwrap_err().code, ErrorCode::NotFound);
    let by_id = send(&format!(r#"{{"message":1,"to":{A}}}"#));
    let refused = messages.send(&agents, operator(STRANGER, 7), by_id);
    assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
    let own_tree = messages.register(&agents, operator(STRANGER, 7), register("a"));
    assert!(own_tree.is_ok(), "names are per tree");
    let broadcast = BroadcastRequest::parse(br#"{"message":1}"#).unwrap();
    let reached = messages.broadcast(&agents, operator(STRANGER, 7), broadcast);
    assert_eq!(reached.delivered_count, 0);
    let err = messages
        .register(&agents, run(B, 0), register("r"))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
}

#[test]
fn a_closed_connection_frees_its_name_and_its_mailbox() {
    let (agents, _logs) = agents();
    let mut messages = Messages::default();
    messages
        .register(&agents, operator(A, 0), register("a"))
        .unwrap();
    let squat = messages.register(&agents, operator(B, 0), register("a"));
    assert_eq!(squat.unwrap_err().code, ErrorCode::AlreadyExists);
    let to_a = send(&format!(r#"{{"message":1,"to":{A}}}"#));
    messages.send(&agents, operator(B, 0), to_a).unwrap();
    messages.connection_closed(u64::from(A));
    assert!(!messages.mailboxes.contains_key(&Address::Connection(A)));
    assert!(messages
        .register(&agents, operator(B, 0), register("a"))
        .is_ok());
    let to_a = send(&format!(r#"{{"message":1,"to":{A}}}"#));
    let gone = messages.send(&agents, operator(B, 0), to_a).unwrap_err();
    assert_eq!(gone.code, ErrorCode::NotFound);
}

#[test]
fn a_full_mailbox_answers_busy_and_broadcast_counts_it() {
    let (agents, _logs) = agents();
    let mut messages = Messages::default();
    messages.recv(&agents, operator(A, 0), &RecvRequest::default());
    let to_a = format!(r#"{{"message":1,"to":{A}}}"#);
    for _ in 0..MAX_MESSAGES {
        messages.send(&agents, operator(B, 0), send(&to_a)).unwrap();
    }
    let full = messages
        .send(&agents, operator(B, 0), send(&to_a))
        .unwrap_err();
    assert_eq!(full.code, ErrorCode::Busy);
    let broadcast = BroadcastRequest::parse(br#"{"message":1}"#).unwrap();
    let reply = messages.broadcast(&agents, operator(B, 0), broadcast);
    assert_eq!((reply.delivered_count, reply.full_count), (0, 1));
}
