//! The tasks' state machine, driven against a fake store ([`FakeStore`]):
//! no SQLite, no threads, no sleeps — the store saves or refuses when a
//! test says so, and time is whatever `now` a test passes.

mod earlier_kernels;
mod fake;
mod faulty_disk;
mod prompt_loop;

use crate::tasks::tool_menu::ToolMenu;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    ExecReply, StoppedResult, TaskDispatch, TaskDispatchReply, TaskInfo, TaskKind, TaskReply,
    TaskState,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde_json::json;

use super::store::Loaded;
use super::{CancelledWork, Reach, Start, Tasks, Waited, WorkRequest};
use crate::address::{Answer, ConnKey, Reply, ReplyTo};
use crate::config::tasks::TasksConfig;
use crate::identity::Principal;
use fake::FakeStore;

/// This kernel's boot number.
const BOOT: u64 = 0xb007;
const OPERATOR: Principal = Principal::Operator { uid: 0 };
const AGENT: Principal = Principal::Agent { id: 7 };

fn tasks(config: TasksConfig) -> Tasks<FakeStore> {
    Tasks::new(
        FakeStore::default(),
        Loaded::default(),
        &config,
        BOOT,
        Instant::now(),
    )
}

/// A request's address on a connection.
fn caller(seq: u64) -> ReplyTo {
    ReplyTo::Request {
        conn: ConnKey {
            index: 0,
            serial: 1,
        },
        seq,
    }
}

fn exec(code: &str) -> TaskDispatch {
    TaskDispatch::new(TaskKind::Exec, json!({ "code": code }))
}

fn dispatch_reply(id: &str) -> Answer {
    Answer::json(&TaskDispatchReply {
        success: true,
        task_id: id.to_owned(),
    })
}

/// Dispatches a task for `owner` as TASK does: its reply held until it is
/// saved, answered to `caller(0)`.
fn dispatch(tasks: &mut Tasks<FakeStore>, owner: Principal, dispatch: TaskDispatch) -> String {
    let id = tasks.dispatch(owner, dispatch).unwrap();
    tasks.reply_once_saved(caller(0), dispatch_reply(&id));
    id
}

/// Everything saved: the replies that go out, and whether tasks were
/// queued.
fn save(tasks: &mut Tasks<FakeStore>) -> (bool, Vec<Reply>) {
    tasks.store_mut().save_all();
    let mut replies = Vec::new();
    let queued = tasks.on_saved(&mut replies);
    (queued, replies)
}

/// A task of `owner`'s, dispatched, saved and started.
fn started(tasks: &mut Tasks<FakeStore>, owner: Principal, code: &str) -> (String, Start) {
    let id = dispatch(tasks, owner, exec(code));
    save(tasks);
    let start = tasks
        .startable(&ToolMenu::empty())
        .pop()
        .expect("the task starts");
    (id, start)
}

/// The task a `status` or `wait` reply carries.
fn task_in(answer: &Answer) -> TaskInfo {
    let json = answer.clone().into_json();
    serde_json::from_slice::<TaskReply>(&json).unwrap().task
}

fn ran(stdout: &str) -> ExecReply {
    ExecReply {
        success: true,
        stdout: stdout.into(),
        exit_code: Some(0),
        ..ExecReply::default()
    }
}

fn state(tasks: &Tasks<FakeStore>, id: &str) -> TaskState {
    tasks.status(Reach::Any, id).unwrap().state
}

#[test]
fn a_task_is_answered_and_starts_once_saved_and_its_reply_finishes_it_for_its_waiters() {
    let mut tasks = tasks(TasksConfig::default());
    let id = dispatch(&mut tasks, AGENT, exec("print(1)"));
    // Not saved yet: no answer, no start.
    let mut replies = Vec::new();
    assert!(!tasks.on_saved(&mut replies));
    assert!(replies.is_empty());
    assert!(tasks.startable(&ToolMenu::empty()).is_empty());
    assert_eq!(state(&tasks, &id), TaskState::Queued);
    // Saved: the dispatch is answered and the task queued, then started.
    let (queued, replies) = save(&mut tasks);
    assert!(queued);
    assert_eq!(replies, [(caller(0), dispatch_reply(&id))]);
    let start = tasks.startable(&ToolMenu::empty()).pop().unwrap();
    assert_eq!(start.owner, AGENT);
    assert!(
        matches!(&start.work, Ok(WorkRequest::Exec(run)) if run.code == "print(1)"),
        "{start:?}"
    );
    assert_eq!(tasks.running(), [start.number]);
    assert_eq!(tasks.number_of(&id), Some(start.number));
    assert_eq!(state(&tasks, &id), TaskState::Running);
    // A wait waits for the end, and has it.
    let waited = tasks.wait(Reach::Own(AGENT), &id, None, caller(1), Instant::now());
    assert!(matches!(waited, Ok(Waited::Later)), "{waited:?}");
    let mut replies = Vec::new();
    let next = tasks.on_reply(start.number, ran("1\n").into(), &mut replies);
    assert!(next.is_none());
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0, caller(1));
    let task = task_in(&replies[0].1);
    assert_eq!(task.state, TaskState::Completed);
    assert_eq!(task.result, Some(serde_json::to_value(ran("1\n")).unwrap()));
    assert!(task.finished_at.is_some());
    assert!(tasks.running().is_empty());
    assert_eq!(
        tasks.store().changes(),
        [
            format!("insert {id} queued"),
            format!("started {id}"),
            format!("finished {id} completed")
        ]
    );
}

#[test]
fn a_dispatch_the_store_refuses_is_answered_unavailable_and_its_task_forgotten() {
    let mut tasks = tasks(TasksConfig::default());
    let id = dispatch(&mut tasks, AGENT, exec("print('never')"));
    tasks
        .store_mut()
        .refuse_new_tasks("No space left on device (os error 28)");
    let mut replies = Vec::new();
    assert!(!tasks.on_saved(&mut replies));
    let refused = ErrorReply::new(
        ErrorCode::Unavailable,
        "the task store cannot save tasks: No space left on device (os error 28); the task \
         was not queued",
    );
    assert_eq!(replies, [(caller(0), Answer::Error(refused))]);
    let status = tasks.status(Reach::Any, &id).unwrap_err();
    assert_eq!(status.code, ErrorCode::NotFound);
    assert!(tasks.startable(&ToolMenu::empty()).is_empty());
    assert!(tasks.queued_per_owner().is_empty());
    assert!(tasks.kept_per_owner().is_empty());
}

#[test]
fn cancelling_a_running_task_ends_it_cancelled_names_its_work_and_ignores_its_late_reply() {
    let mut tasks = tasks(TasksConfig {
        max_running_per_owner: 1,
        ..TasksConfig::default()
    });
    let (id, start) = started(&mut tasks, AGENT, "while True: pass");
    let next = dispatch(&mut tasks, AGENT, exec("print(2)"));
    save(&mut tasks);
    assert!(
        tasks.startable(&ToolMenu::empty()).is_empty(),
        "its owner has no room"
    );
    tasks
        .wait(Reach::Own(AGENT), &id, None, caller(1), Instant::now())
        .unwrap();
    let mut replies = Vec::new();
    let (cancelled, work) = tasks.cancel(Reach::Own(AGENT), &id, &mut replies).unwrap();
    assert!(cancelled);
    assert_eq!(
        work,
        Some(CancelledWork {
            number: start.number
        })
    );
    let task = task_in(&replies[0].1);
    assert_eq!(task.state, TaskState::Cancelled);
    let result = StoppedResult::cancelled("the task was cancelled by its owner");
    assert_eq!(task.result, Some(serde_json::to_value(result).unwrap()));
    // The work's reply, when it comes, is for no one.
    let mut late = Vec::new();
    assert!(tasks
        .on_reply(start.number, ran("").into(), &mut late)
        .is_none());
    assert!(late.is_empty());
    assert_eq!(state(&tasks, &id), TaskState::Cancelled);
    // Cancelled twice, it was no longer going.
    assert_eq!(
        tasks.cancel(Reach::Own(AGENT), &id, &mut late),
        Ok((false, None))
    );
    // Its place is free for its owner's next task.
    let starts = tasks.startable(&ToolMenu::empty());
    assert_eq!(starts.len(), 1);
    assert_eq!(tasks.number_of(&next), Some(starts[0].number));
}

#[test]
fn a_queued_task_cancelled_by_an_operator_never_starts_and_leaves_no_work_to_stop() {
    let mut tasks = tasks(TasksConfig::default());
    let id = dispatch(&mut tasks, AGENT, exec("print(1)"));
    let mut replies = Vec::new();
    // Cancelled while its record is still being saved.
    let (cancelled, work) = tasks.cancel(Reach::Any, &id, &mut replies).unwrap();
    assert!(cancelled);
    assert_eq!(work, None);
    let (queued, replies) = save(&mut tasks);
    assert!(!queued);
    assert_eq!(replies, [(caller(0), dispatch_reply(&id))]);
    assert!(tasks.startable(&ToolMenu::empty()).is_empty());
    let task = tasks.status(Reach::Own(AGENT), &id).unwrap();
    assert_eq!(task.state, TaskState::Cancelled);
    assert!(tasks.queued_per_owner().is_empty());
    let waited = tasks
        .wait(Reach::Own(AGENT), &id, None, caller(1), Instant::now())
        .unwrap();
    let Waited::Reply(json) = waited else {
        panic!("{waited:?}");
    };
    let task = serde_json::from_slice::<TaskReply>(&json).unwrap().task;
    let result = StoppedResult::cancelled("the task was cancelled by an operator");
    assert_eq!(task.result, Some(serde_json::to_value(result).unwrap()));
}

#[test]
fn another_owners_task_is_not_found_even_by_its_id() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, _) = started(&mut tasks, AGENT, "print(1)");
    let other = Reach::Own(Principal::Agent { id: 8 });
    assert_eq!(
        tasks.status(other, &id).unwrap_err().code,
        ErrorCode::NotFound
    );
    let mut replies = Vec::new();
    assert!(tasks.cancel(other, &id, &mut replies).is_err());
    assert_eq!(state(&tasks, &id), TaskState::Running);
}

#[test]
fn each_owner_runs_at_most_its_cap_and_queues_at_most_its_share_in_order() {
    let mut tasks = tasks(TasksConfig {
        max_running_per_owner: 1,
        max_queued_per_owner: 2,
        ..TasksConfig::default()
    });
    let first = dispatch(&mut tasks, AGENT, exec("1"));
    let second = dispatch(&mut tasks, AGENT, exec("2"));
    let busy = tasks.dispatch(AGENT, exec("3")).unwrap_err();
    assert_eq!(busy.code, ErrorCode::Busy);
    let operators = dispatch(&mut tasks, OPERATOR, exec("4"));
    save(&mut tasks);
    let starts = tasks.startable(&ToolMenu::empty());
    let started: Vec<Principal> = starts.iter().map(|start| start.owner).collect();
    assert_eq!(started, [AGENT, OPERATOR]);
    assert_eq!(state(&tasks, &first), TaskState::Running);
    assert_eq!(state(&tasks, &second), TaskState::Queued);
    assert_eq!(state(&tasks, &operators), TaskState::Running);
    // A place in the queue is free again: the agent may queue one more.
    tasks.dispatch(AGENT, exec("5")).unwrap();
    let mut replies = Vec::new();
    tasks.on_reply(starts[0].number, ran("1").into(), &mut replies);
    let next = tasks.startable(&ToolMenu::empty());
    assert_eq!(next.len(), 1);
    assert_eq!(tasks.number_of(&second), Some(next[0].number));
}

#[test]
fn work_that_cannot_start_fails_its_task_with_the_reason() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, start) = started(&mut tasks, AGENT, "print(1)");
    let why = ErrorReply::new(ErrorCode::Unavailable, "the task's owner has ended");
    let mut replies = Vec::new();
    tasks.failed_to_start(start.number, why.clone(), &mut replies);
    assert_eq!(state(&tasks, &id), TaskState::Failed);
    assert!(tasks.running().is_empty());
    let Waited::Reply(json) = tasks
        .wait(Reach::Any, &id, None, caller(1), Instant::now())
        .unwrap()
    else {
        panic!("not finished");
    };
    let task = serde_json::from_slice::<TaskReply>(&json).unwrap().task;
    assert_eq!(task.result, Some(serde_json::to_value(why).unwrap()));
}

#[test]
fn a_result_leaves_memory_only_once_saved_and_a_wait_then_reads_it_back_from_the_store() {
    let mut tasks = tasks(TasksConfig {
        result_cache_bytes: 1,
        ..TasksConfig::default()
    });
    let (id, start) = started(&mut tasks, AGENT, "print(1)");
    let mut replies = Vec::new();
    tasks.on_reply(start.number, ran("1\n").into(), &mut replies);
    // Not saved yet: the result stays in memory, over the budget.
    let waited = tasks.wait(Reach::Any, &id, None, caller(1), Instant::now());
    let Ok(Waited::Reply(in_memory)) = waited else {
        panic!("{waited:?}");
    };
    save(&mut tasks);
    let waited = tasks.wait(Reach::Any, &id, None, caller(1), Instant::now());
    let Ok(Waited::ReadResult { read, task }) = waited else {
        panic!("{waited:?}");
    };
    assert_eq!(task.result, None);
    let stored = read.read().unwrap().unwrap();
    assert_eq!(stored, serde_json::to_vec(&ran("1\n")).unwrap());
    let mut read_back = *task;
    read_back.result = serde_json::from_slice(&stored).ok();
    let reply = TaskReply {
        success: true,
        task: read_back,
    };
    assert_eq!(agentos_proto::payload::to_json(&reply), in_memory);
}

#[test]
fn a_wait_that_times_out_gets_the_task_as_it_is_and_changes_nothing() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, _) = started(&mut tasks, AGENT, "while True: pass");
    let now = Instant::now();
    let timeout = Some(Duration::from_secs(5));
    tasks
        .wait(Reach::Own(AGENT), &id, timeout, caller(1), now)
        .unwrap();
    assert!(tasks.next_deadline(now).unwrap() <= Duration::from_secs(5));
    let mut replies = Vec::new();
    tasks.on_deadlines(now + Duration::from_secs(4), &mut replies);
    assert!(replies.is_empty());
    tasks.on_deadlines(now + Duration::from_secs(5), &mut replies);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0, caller(1));
    assert_eq!(task_in(&replies[0].1).state, TaskState::Running);
    assert_eq!(state(&tasks, &id), TaskState::Running);
    // A zero timeout answers at once.
    let waited = tasks.wait(Reach::Any, &id, Some(Duration::ZERO), caller(2), now);
    assert!(matches!(waited, Ok(Waited::Reply(_))), "{waited:?}");
}

#[test]
fn waits_of_a_connection_that_closed_are_dropped() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, start) = started(&mut tasks, AGENT, "print(1)");
    tasks
        .wait(Reach::Any, &id, None, caller(1), Instant::now())
        .unwrap();
    tasks.connection_closed(1);
    let mut replies = Vec::new();
    tasks.on_reply(start.number, ran("1").into(), &mut replies);
    assert!(replies.is_empty());
}

#[test]
fn a_running_tasks_output_is_shown_while_it_runs_and_saved_only_when_asked_and_changed() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, start) = started(&mut tasks, AGENT, "print(1)");
    let now = Instant::now();
    assert!(tasks.progress_due(now));
    assert!(!tasks.progress_due(now), "once a second");
    tasks.progress(start.number, "half".into(), false);
    let progress = tasks.status(Reach::Any, &id).unwrap().progress.unwrap();
    assert_eq!(progress.output, "half");
    tasks.progress(start.number, "half".into(), true);
    tasks.progress(start.number, "half".into(), true);
    let saved = tasks.store().changes();
    assert_eq!(saved.last().unwrap(), &format!("output {id} \"half\""));
    assert_eq!(saved.iter().filter(|c| c.starts_with("output")).count(), 1);
}

#[test]
fn the_kernels_stop_interrupts_running_tasks_with_their_output_and_starts_nothing_more() {
    let mut tasks = tasks(TasksConfig::default());
    let (id, start) = started(&mut tasks, AGENT, "print(1)");
    tasks.progress(start.number, "half way".into(), false);
    tasks
        .wait(Reach::Any, &id, None, caller(1), Instant::now())
        .unwrap();
    let queued = dispatch(&mut tasks, OPERATOR, exec("print(2)"));
    save(&mut tasks);
    let mut replies = Vec::new();
    tasks.stop(&mut replies);
    let task = task_in(&replies[0].1);
    assert_eq!(task.state, TaskState::Interrupted);
    let result = StoppedResult::interrupted("the kernel stopped while the task ran", "half way");
    assert_eq!(task.result, Some(serde_json::to_value(result).unwrap()));
    assert!(tasks.startable(&ToolMenu::empty()).is_empty());
    assert_eq!(state(&tasks, &queued), TaskState::Queued);
    tasks.finish_shutdown();
    assert!(tasks.store().closed);
}

#[test]
fn expired_tasks_leave_memory_and_the_store_and_unfinished_ones_stay() {
    let mut tasks = tasks(TasksConfig::default());
    let (done, start) = started(&mut tasks, AGENT, "print(1)");
    let (going, _) = started(&mut tasks, AGENT, "while True: pass");
    let mut replies = Vec::new();
    tasks.on_reply(start.number, ran("1").into(), &mut replies);
    let day = 86_400_000;
    tasks.expire(super::store::now_ms() + day + 1);
    assert_eq!(
        tasks.status(Reach::Any, &done).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(state(&tasks, &going), TaskState::Running);
    assert_eq!(
        tasks.store().changes().last().unwrap(),
        &format!("delete {done}")
    );
}
