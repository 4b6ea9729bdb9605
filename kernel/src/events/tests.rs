use agentos_proto::payload::{KernelEvent, Topic};
use serde_json::json;

use super::*;

fn tree(uid: u32, agents: &[u32]) -> Audience {
    Audience {
        uid: Some(uid),
        agents: agents.to_vec(),
        run: None,
    }
}

fn spawned(audience: Audience) -> Event {
    let data = AgentEventData {
        agent_id: 7,
        name: "w".into(),
        ..AgentEventData::default()
    };
    Notice::now(KernelEvent::AgentSpawned, data).into_event(audience)
}

#[test]
fn an_event_reaches_only_subscribers_that_may_see_it_and_want_it() {
    let mut events = Events::default();
    let spawns = vec![Topic::Kernel(KernelEvent::AgentSpawned)];
    events
        .subscribe(1, Principal::Operator { uid: 0 }, spawns.clone())
        .unwrap();
    events
        .subscribe(2, Principal::Operator { uid: 1000 }, spawns.clone())
        .unwrap();
    events
        .subscribe(3, Principal::Agent { id: 5 }, spawns.clone())
        .unwrap();
    events
        .subscribe(4, Principal::Agent { id: 6 }, spawns)
        .unwrap();
    events
        .subscribe(5, Principal::Agent { id: 5 }, vec![Topic::AnyCustom])
        .unwrap();
    assert_eq!(
        events.publish(spawned(tree(0, &[7, 5]))),
        2,
        "uid 0 and agent 5"
    );
    assert_eq!(events.poll(1, 10).count, 1);
    assert_eq!(events.poll(2, 10).count, 0, "another uid's tree");
    assert_eq!(events.poll(3, 10).count, 1, "its descendant");
    assert_eq!(events.poll(4, 10).count, 0, "outside its tree");
    assert_eq!(events.poll(5, 10).count, 0, "not what it asked for");
}

#[test]
fn custom_topics_match_by_type_and_custom_matches_all() {
    let mut events = Events::default();
    let me = Principal::Operator { uid: 0 };
    events
        .subscribe(1, me, vec![Topic::Custom("job.done".into())])
        .unwrap();
    events.subscribe(2, me, vec![Topic::AnyCustom]).unwrap();
    events
        .subscribe(3, me, vec![Topic::Kernel(KernelEvent::AgentExited)])
        .unwrap();
    let done = Event::custom("job.done".into(), json!({"n": 1}), 1_000_000, tree(0, &[]));
    assert_eq!(events.publish(done), 2);
    let other = Event::custom("other".into(), json!(1), 1_000_000, tree(0, &[]));
    assert_eq!(events.publish(other), 1);
    let polled = events.poll(1, 10);
    assert_eq!(polled.events[0].kind, "CUSTOM");
    assert_eq!(polled.events[0].custom_type.as_deref(), Some("job.done"));
    assert_eq!(
        polled.events[0].data,
        json!({"n": 1, "custom_type": "job.done"})
    );
    assert_eq!(polled.events[0].source_agent_id, 1_000_000);
}

#[test]
fn a_full_queue_drops_the_oldest_and_poll_counts_them() {
    let mut events = Events::default();
    let me = Principal::Operator { uid: 0 };
    events.subscribe(1, me, vec![Topic::AnyCustom]).unwrap();
    for n in 0..QUEUE_EVENTS + 5 {
        events.publish(Event::custom("t".into(), json!(n), 1, tree(0, &[])));
    }
    let first = events.poll(1, 10);
    assert_eq!((first.count, first.dropped), (10, 5));
    assert_eq!(first.events[0].data, json!(5), "the five oldest went");
    assert_eq!(first.pending, QUEUE_EVENTS - 10);
    assert_eq!(events.poll(1, 10).dropped, 0, "counted once");
    let big = "x".repeat(QUEUE_BYTES / 4);
    for _ in 0..8 {
        events.publish(Event::custom("t".into(), json!(big), 1, tree(0, &[])));
    }
    let after = events.poll(1, usize::MAX);
    assert!(after.dropped > 0 && after.pending == 0);
}

#[test]
fn subscriptions_end_with_their_connection_and_unsubscribe_names_what_ended() {
    let mut events = Events::default();
    let me = Principal::Agent { id: 3 };
    let topics = vec![Topic::AnyCustom, Topic::Kernel(KernelEvent::AgentExited)];
    events.subscribe(9, me, topics).unwrap();
    let reply = events.unsubscribe(9, Some(vec![Topic::AnyCustom, Topic::Custom("x".into())]));
    assert_eq!(reply.unsubscribed, ["CUSTOM"]);
    assert_eq!(reply.subscribed, ["AGENT_EXITED"]);
    events.connection_closed(9);
    assert!(events.is_empty());
    let many: Vec<Topic> = (0..=MAX_TOPICS)
        .map(|n| Topic::Custom(n.to_string()))
        .collect();
    assert!(events.subscribe(9, me, many).is_err());
    assert!(events.is_empty());
}

#[test]
fn a_journal_keeps_the_latest_and_counts_what_it_lost() {
    let mut journal = Journal::default();
    for _ in 0..JOURNAL_EVENTS + 3 {
        journal.push(spawned(tree(0, &[7])));
    }
    let mut events = Events::default();
    let me = Principal::Operator { uid: 0 };
    events
        .subscribe(1, me, vec![Topic::Kernel(KernelEvent::AgentSpawned)])
        .unwrap();
    events.take_in(&mut journal);
    let polled = events.poll(1, 1);
    assert_eq!(polled.dropped, 3 + (JOURNAL_EVENTS - QUEUE_EVENTS) as u64);
    assert_eq!(journal.take().0.len(), 0);
}

#[test]
fn a_tasks_end_is_heard_by_its_owner_alone() {
    use agentos_proto::payload::{TaskKind, TaskState};
    let ended = |owner| Event::task_ended(owner, "t-1", TaskKind::Exec, None, TaskState::Completed);
    let mut events = Events::default();
    let topic = vec![Topic::Kernel(KernelEvent::TaskEnded)];
    events
        .subscribe(1, Principal::Operator { uid: 0 }, topic.clone())
        .unwrap();
    events
        .subscribe(2, Principal::Agent { id: 5 }, topic.clone())
        .unwrap();
    events
        .subscribe(3, Principal::Agent { id: 6 }, topic.clone())
        .unwrap();
    events
        .subscribe(4, Principal::Run { number: 9 }, topic)
        .unwrap();
    let agents = events.publish(ended(Principal::Agent { id: 5 }));
    assert_eq!(agents, 1, "not its tree's operator, nor another agent");
    assert_eq!(events.poll(2, 10).count, 1);
    assert_eq!(events.publish(ended(Principal::Operator { uid: 0 })), 1);
    let heard = events.poll(1, 10);
    assert_eq!(heard.events[0].kind, "TASK_ENDED");
    assert_eq!(
        heard.events[0].data,
        json!({"task_id": "t-1", "kind": "exec", "state": "completed"})
    );
    assert_eq!(events.publish(ended(Principal::Run { number: 9 })), 1);
    assert_eq!(events.poll(4, 10).count, 1);
}
