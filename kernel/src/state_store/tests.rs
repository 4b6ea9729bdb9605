//! The state store through the task store's writer thread, on a database
//! in a temporary directory: quotas, scopes, expiry, and what a start
//! removes.

use std::sync::Arc;
use std::time::Duration;

use agentos_proto::payload::{KeyRequest, KeysRequest, Scope, StoreRequest, MAX_KEYS_LISTED};
use serde_json::{json, Value};

use super::{Holder, Quota, StateStore};
use crate::tasks::store::SqliteStore;

const ROOMY: Quota = Quota {
    keys: 100,
    bytes: 1 << 20,
};

fn open(dir: &std::path::Path) -> (SqliteStore, StateStore) {
    let poll = mio::Poll::new().unwrap();
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
    let (store, _) = SqliteStore::open(dir, dir, waker).unwrap();
    let state = StateStore::new(store.database());
    (store, state)
}

fn answer(job: crate::workers::Job) -> Value {
    serde_json::from_slice(&job()).unwrap()
}

fn stored(state: &mut StateStore, holder: Holder, body: Value, quota: Quota) -> Value {
    let request = StoreRequest::parse(body.to_string().as_bytes()).unwrap();
    let value = request.value.to_string();
    answer(state.store(holder, request, value, quota))
}

fn fetched(state: &mut StateStore, holder: Holder, key: &str, scope: Option<Scope>) -> Value {
    let request = KeyRequest {
        key: key.into(),
        scope,
    };
    answer(state.fetch(holder, request))
}

const OPERATOR: Holder = Holder::Operator { uid: 5 };
const AGENT: Holder = Holder::Agent {
    id: 1,
    owner_uid: 5,
};
const STRANGER: Holder = Holder::Operator { uid: 6 };

#[test]
fn an_owners_own_keys_its_agents_and_its_trees_count_against_one_quota() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tasks, mut state) = open(dir.path());
    let two = Quota {
        keys: 2,
        bytes: 1 << 20,
    };
    let mine = json!({"key": "k", "value": 1, "scope": "agent"});
    assert_eq!(
        stored(&mut state, OPERATOR, mine.clone(), two)["success"],
        true
    );
    assert_eq!(stored(&mut state, AGENT, mine, two)["success"], true);
    let shared = stored(&mut state, AGENT, json!({"key": "t", "value": 1}), two);
    assert_eq!(shared["code"], "limit_exceeded", "{shared}");
    // Another owner's quota is its own.
    let theirs = stored(&mut state, STRANGER, json!({"key": "t", "value": 1}), two);
    assert_eq!(theirs["success"], true, "{theirs}");
    // A byte quota counts keys and values as JSON, what a key replaces freed.
    let small = Quota { keys: 10, bytes: 8 };
    let fits = stored(
        &mut state,
        STRANGER,
        json!({"key": "t", "value": "abcde"}),
        small,
    );
    assert_eq!(fits["success"], true, "{fits}");
    let over = stored(&mut state, STRANGER, json!({"key": "u", "value": 1}), small);
    assert_eq!(over["code"], "limit_exceeded", "{over}");
    tasks.close();
}

#[test]
fn a_lookup_without_a_scope_reads_the_callers_own_key_first_and_delete_takes_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tasks, mut state) = open(dir.path());
    stored(
        &mut state,
        OPERATOR,
        json!({"key": "k", "value": "tree"}),
        ROOMY,
    );
    stored(
        &mut state,
        AGENT,
        json!({"key": "k", "value": "own", "scope": "session"}),
        ROOMY,
    );
    assert_eq!(fetched(&mut state, AGENT, "k", None)["value"], "own");
    assert_eq!(fetched(&mut state, OPERATOR, "k", None)["value"], "tree");
    assert_eq!(
        fetched(&mut state, AGENT, "k", Some(Scope::Global))["value"],
        "tree"
    );
    assert_eq!(fetched(&mut state, STRANGER, "k", None)["exists"], false);
    let request = KeyRequest {
        key: "k".into(),
        scope: None,
    };
    let deleted = answer(state.delete(AGENT, request));
    assert_eq!(
        deleted,
        json!({"success": true, "deleted": true, "scope": "agent"})
    );
    assert_eq!(fetched(&mut state, AGENT, "k", None)["value"], "tree");
    let listed = answer(state.keys(AGENT, KeysRequest::default()));
    assert_eq!(listed["keys"], json!(["k"]), "{listed}");
    tasks.close();
}

#[test]
fn expired_keys_are_never_read_nor_counted_and_agents_keys_go_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut tasks, mut state) = open(dir.path());
        let one = Quota {
            keys: 1,
            bytes: 1 << 20,
        };
        let brief = json!({"key": "brief", "value": 1, "ttl": 0.05});
        assert_eq!(stored(&mut state, OPERATOR, brief, one)["success"], true);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(
            fetched(&mut state, OPERATOR, "brief", None)["exists"],
            false
        );
        let listed = answer(state.keys(OPERATOR, KeysRequest::default()));
        assert_eq!(listed["count"], 0, "{listed}");
        let next = stored(
            &mut state,
            OPERATOR,
            json!({"key": "next", "value": 2}),
            one,
        );
        assert_eq!(
            next["success"], true,
            "the expired key no longer counts: {next}"
        );
        let own = json!({"key": "own", "value": 3, "scope": "agent"});
        stored(&mut state, AGENT, own, ROOMY);
        assert_eq!(fetched(&mut state, AGENT, "own", None)["value"], 3);
        tasks.close();
    }
    let (mut tasks, mut state) = open(dir.path());
    assert_eq!(fetched(&mut state, AGENT, "own", None)["exists"], false);
    assert_eq!(fetched(&mut state, AGENT, "next", None)["value"], 2);
    tasks.close();
}

#[test]
fn a_closed_store_answers_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tasks, mut state) = open(dir.path());
    tasks.close();
    let refused = fetched(&mut state, OPERATOR, "k", None);
    assert_eq!(refused["code"], "unavailable", "{refused}");
}

#[test]
fn keys_lists_at_most_a_thousand_and_says_it_left_some_out() {
    let dir = tempfile::tempdir().unwrap();
    let (mut tasks, mut state) = open(dir.path());
    let quota = Quota {
        keys: 2000,
        bytes: 1 << 20,
    };
    for n in 0..=MAX_KEYS_LISTED {
        let body = json!({"key": format!("k{n:04}"), "value": n});
        assert_eq!(stored(&mut state, OPERATOR, body, quota)["success"], true);
    }
    let all = answer(state.keys(OPERATOR, KeysRequest::default()));
    assert_eq!(
        (all["count"].as_u64(), &all["truncated"]),
        (Some(1000), &json!(true))
    );
    assert_eq!(all["keys"][0], "k0000");
    let narrowed = KeysRequest {
        prefix: "k09".into(),
        scope: Some(Scope::Global),
    };
    let some = answer(state.keys(OPERATOR, narrowed));
    assert_eq!(
        (some["count"].as_u64(), &some["truncated"]),
        (Some(100), &json!(false))
    );
    tasks.close();
}
