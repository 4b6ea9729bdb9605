//! The audit log through the task store's writer thread, on a database in
//! a temporary directory: who reads which entries, paging, the bound, and
//! the switches that cannot be turned off.

use std::sync::Arc;

use agentos_proto::payload::{
    AuditCategory, AuditLogReply, AuditLogRequest, PrincipalInfo, SetAuditConfigRequest,
};
use agentos_proto::ErrorCode;

use super::{Audit, Cause, Event, Reader, Subject};
use crate::config::audit::AuditSettings;
use crate::tasks::store::SqliteStore;

fn open(dir: &std::path::Path) -> (SqliteStore, Audit) {
    let poll = mio::Poll::new().unwrap();
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
    let (store, _) = SqliteStore::open(dir, dir, waker).unwrap();
    let audit = Audit::new(store.database());
    (store, audit)
}

fn read(audit: &mut Audit, reader: Reader, request: AuditLogRequest) -> AuditLogReply {
    serde_json::from_slice(&audit.read(reader, request)()).unwrap()
}

fn operator(uid: u32) -> Cause {
    Cause {
        principal: PrincipalInfo::Operator { uid },
        tree_uid: uid,
        run: None,
    }
}

fn agent(id: u32, owner_uid: u32, line: &[u32]) -> Subject {
    Subject {
        id,
        name: format!("a{id}"),
        owner_uid,
        line: line.to_vec(),
    }
}

fn event(event_type: &'static str, cause: Cause, subject: Option<Subject>) -> Event {
    Event {
        category: AuditCategory::AgentLifecycle,
        event_type,
        cause,
        subject,
        success: true,
        details: serde_json::Value::Null,
    }
}

fn ids(reply: &AuditLogReply) -> Vec<u64> {
    reply.entries.iter().map(|e| e.id).collect()
}

#[test]
fn agents_read_their_line_and_operators_their_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut audit) = open(dir.path());
    let settings = AuditSettings::default();
    // Operator 5's tree: agent 1, its child 2; operator 6's: agent 3.
    let entries = [
        event("OPERATOR_OWN", operator(5), None),
        event("AGENT_SPAWNED", operator(5), Some(agent(1, 5, &[1]))),
        event("AGENT_SPAWNED", operator(5), Some(agent(2, 5, &[1, 2]))),
        event("AGENT_SPAWNED", operator(6), Some(agent(3, 6, &[3]))),
        // Agent 11 must not match agent 1's line.
        event("AGENT_SPAWNED", operator(5), Some(agent(11, 5, &[11]))),
    ];
    for entry in entries {
        audit.record(&settings, entry);
    }
    let all = AuditLogRequest::default();
    let boot = audit.boot();
    let of = |audit: &mut Audit, reader| ids(&read(audit, reader, all.clone()));
    assert_eq!(of(&mut audit, Reader::Operator { uid: 5 }), [1, 2, 3, 5]);
    assert_eq!(of(&mut audit, Reader::Operator { uid: 6 }), [4]);
    assert_eq!(of(&mut audit, Reader::Agent { id: 1, boot }), [2, 3]);
    assert_eq!(of(&mut audit, Reader::Agent { id: 2, boot }), [3]);
    assert!(of(
        &mut audit,
        Reader::Agent {
            id: 1,
            boot: boot + 1
        }
    )
    .is_empty());
    assert!(of(&mut audit, Reader::Run { number: 1, boot }).is_empty());
    let first = read(
        &mut audit,
        Reader::Operator { uid: 5 },
        AuditLogRequest {
            limit: Some(2),
            ..AuditLogRequest::default()
        },
    );
    assert_eq!((ids(&first), first.more), (vec![1, 2], true));
    let next = read(
        &mut audit,
        Reader::Operator { uid: 5 },
        AuditLogRequest {
            since_id: 2,
            agent_id: Some(11),
            ..AuditLogRequest::default()
        },
    );
    assert_eq!((ids(&next), next.more), (vec![5], false));
    assert_eq!(next.entries[0].agent_name.as_deref(), Some("a11"));
}

#[test]
fn the_oldest_entries_go_beyond_the_bound_and_required_switches_stay_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut audit) = open(dir.path());
    let settings = AuditSettings {
        max_entries: 10,
        log_syscalls: false,
    };
    for _ in 0..12 {
        audit.record(&settings, event("E", operator(5), None));
    }
    let reader = Reader::Operator { uid: 5 };
    let kept = ids(&read(&mut audit, reader, AuditLogRequest::default()));
    assert_eq!(kept, (3..=12).collect::<Vec<u64>>());
    let lower = SetAuditConfigRequest {
        max_entries: Some(4),
        log_syscalls: Some(true),
        ..SetAuditConfigRequest::default()
    };
    let config = audit.set(&settings, &lower).unwrap();
    assert_eq!((config.max_entries, config.log_syscalls), (4, true));
    let kept = ids(&read(&mut audit, reader, AuditLogRequest::default()));
    assert_eq!(kept, [9, 10, 11, 12]);
    let off = SetAuditConfigRequest {
        log_lifecycle: Some(false),
        ..SetAuditConfigRequest::default()
    };
    let err = audit.set(&settings, &off).unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    assert!(err.error.contains("`log_lifecycle`"), "{}", err.error);
    let over = SetAuditConfigRequest {
        max_entries: Some(11),
        ..SetAuditConfigRequest::default()
    };
    assert_eq!(
        audit.set(&settings, &over).unwrap_err().code,
        ErrorCode::LimitExceeded
    );
    // What was set stays: a later change keeps the earlier switches.
    let config = audit
        .set(&settings, &SetAuditConfigRequest::default())
        .unwrap();
    assert_eq!((config.max_entries, config.log_syscalls), (4, true));
    let mut quiet = event("TOOL_CALL", operator(5), None);
    quiet.category = AuditCategory::Ipc;
    audit.record(&settings, quiet);
    let kept = ids(&read(&mut audit, reader, AuditLogRequest::default()));
    assert_eq!(kept, [9, 10, 11, 12], "IPC entries are off by default");
}

#[test]
fn a_caller_refused_in_a_loop_is_recorded_a_share_at_a_time_with_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut audit) = open(dir.path());
    let start = std::time::Instant::now();
    let hostile = (5, Some(7), None);
    let admitted = (0..30)
        .filter(|_| audit.admit_refusal(hostile, start).is_some())
        .count();
    assert_eq!(admitted, 20);
    // Another caller has a share of its own.
    assert_eq!(audit.admit_refusal((5, Some(8), None), start), Some(0));
    let later = start + std::time::Duration::from_secs(1);
    assert_eq!(
        audit.admit_refusal(hostile, later),
        Some(10),
        "the unrecorded count"
    );
    assert_eq!(audit.admit_refusal(hostile, later), Some(0));
}
