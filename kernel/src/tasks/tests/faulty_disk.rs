//! Tasks on the real store whose disk fails while a test says so: every
//! new record and every change to one fails, as on a full disk, with
//! `CAUSE` (a trigger in the database raises it).

use crate::tasks::tool_menu::ToolMenu;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{TaskDispatch, TaskKind, TaskList, TaskState};
use agentos_proto::ErrorCode;
use serde_json::{json, Value};

use crate::address::{Answer, Reply, ReplyTo};
use crate::config::tasks::TasksConfig;
use crate::identity::Principal;
use crate::tasks::{Reach, Tasks, Waited};

const OPERATOR: Principal = Principal::Operator { uid: 0 };

/// Tasks on a store whose disk fails while the test says so: every new
/// record and every change to one fails, as on a full disk, with
/// `CAUSE` (a trigger in the database raises it).
struct Faulty {
    tasks: Tasks,
    disk: rusqlite::Connection,
    _dir: tempfile::TempDir,
}

const CAUSE: &str = "the disk is full (simulated)";

impl Faulty {
    fn open(config: TasksConfig) -> Faulty {
        let dir = tempfile::tempdir().unwrap();
        let config = TasksConfig {
            state_dir: Some(dir.path().to_path_buf()),
            ..config
        };
        let open = || {
            let poll = mio::Poll::new().unwrap();
            let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
            let socket = std::path::Path::new("/unused.sock");
            Tasks::open(&config, socket, waker, Instant::now())
                .unwrap()
                .0
        };
        open().finish_shutdown();
        let disk = rusqlite::Connection::open(dir.path().join("tasks.db")).unwrap();
        disk.busy_timeout(Duration::from_secs(5)).unwrap();
        disk.execute_batch(&format!(
            "CREATE TABLE fault (failing INTEGER);
             CREATE TRIGGER insert_fails BEFORE INSERT ON tasks
             WHEN EXISTS (SELECT 1 FROM fault) BEGIN SELECT RAISE(ABORT, '{CAUSE}'); END;
             CREATE TRIGGER update_fails BEFORE UPDATE ON tasks
             WHEN EXISTS (SELECT 1 FROM fault) BEGIN SELECT RAISE(ABORT, '{CAUSE}'); END;"
        ))
        .unwrap();
        Faulty {
            tasks: open(),
            disk,
            _dir: dir,
        }
    }

    fn fail(&self, failing: bool) {
        let change = if failing {
            "INSERT INTO fault VALUES (1)"
        } else {
            "DELETE FROM fault"
        };
        self.disk.execute(change, []).unwrap();
    }

    /// Dispatches an EXEC task; its reply is held until it is saved.
    fn dispatch(&mut self, code: &str) -> String {
        let id = self
            .tasks
            .dispatch(
                OPERATOR,
                TaskDispatch::new(TaskKind::Exec, json!({ "code": code })),
            )
            .unwrap();
        self.tasks.reply_once_saved(
            ReplyTo::Task(u64::MAX),
            Answer::Json(id.clone().into_bytes()),
        );
        id
    }

    /// What the writer's wake-ups bring, once they bring a reply.
    fn answered(&mut self) -> (bool, Vec<Reply>) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let mut replies = Vec::new();
            let queued = self.tasks.on_saved(&mut replies);
            if !replies.is_empty() {
                return (queued, replies);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no dispatch was answered");
    }
}

#[test]
fn a_dispatch_whose_record_cannot_be_saved_is_refused_with_the_cause_and_its_task_never_runs() {
    let mut faulty = Faulty::open(TasksConfig::default());
    faulty.fail(true);
    let id = faulty.dispatch("print('never')");
    // Until its record is saved, a task does not start.
    assert!(faulty.tasks.startable(&ToolMenu::empty()).is_empty());
    let (queued, replies) = faulty.answered();
    assert!(!queued);
    let reply: Value = serde_json::from_slice(&replies[0].1.clone().into_json()).unwrap();
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], "unavailable", "{reply}");
    assert_eq!(
        reply["error"],
        format!("the task store cannot save tasks: {CAUSE}; the task was not queued")
    );
    // It is gone: never listed, never started, its place in the queue
    // free.
    let status = faulty.tasks.status(Reach::Own(OPERATOR), &id).unwrap_err();
    assert_eq!(status.code, ErrorCode::NotFound);
    let list = faulty
        .tasks
        .list(Reach::Own(OPERATOR), &TaskList::default(), None)
        .unwrap();
    assert!(list.tasks.is_empty(), "{list:?}");
    assert!(faulty.tasks.startable(&ToolMenu::empty()).is_empty());
    assert!(faulty.tasks.queued_per_owner().is_empty());
    assert!(faulty.tasks.kept_per_owner().is_empty());

    // The store recovers by itself: the next dispatch is saved,
    // answered, and its task starts.
    faulty.fail(false);
    let id = faulty.dispatch("print('saved')");
    let (queued, replies) = faulty.answered();
    assert!(queued);
    assert_eq!(replies[0].1, Answer::Json(id.clone().into_bytes()));
    let starts = faulty.tasks.startable(&ToolMenu::empty());
    assert_eq!(starts.len(), 1);
    assert_eq!(
        faulty
            .tasks
            .status(Reach::Own(OPERATOR), &id)
            .unwrap()
            .state,
        TaskState::Running
    );
}

#[test]
fn an_end_that_cannot_be_saved_keeps_its_result_in_memory_and_is_saved_once_the_disk_recovers() {
    // Every result leaves memory once it is saved, and not before.
    let mut faulty = Faulty::open(TasksConfig {
        result_cache_bytes: 1,
        ..TasksConfig::default()
    });
    let id = faulty.dispatch("print(1)");
    faulty.answered();
    let start = faulty.tasks.startable(&ToolMenu::empty()).pop().unwrap();
    let state = |disk: &rusqlite::Connection| -> String {
        disk.query_row("SELECT state FROM tasks WHERE id = ?1", [&id], |row| {
            row.get(0)
        })
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while state(&faulty.disk) != "running" {
        assert!(Instant::now() < deadline, "the start was never saved");
        std::thread::sleep(Duration::from_millis(5));
    }
    faulty.fail(true);
    let mut replies = Vec::new();
    let result = agentos_proto::payload::ExecReply {
        success: true,
        stdout: "1\n".into(),
        ..Default::default()
    };
    faulty
        .tasks
        .on_reply(start.number, result.into(), &mut replies);
    std::thread::sleep(Duration::from_millis(300));
    faulty.tasks.on_saved(&mut replies);
    let waited = faulty
        .tasks
        .wait(
            Reach::Own(OPERATOR),
            &id,
            None,
            ReplyTo::Task(1),
            Instant::now(),
        )
        .unwrap();
    assert!(matches!(waited, Waited::Reply(_)), "{waited:?}");
    assert_eq!(state(&faulty.disk), "running");
    // Tried again every second, it is saved once it can be.
    faulty.fail(false);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        faulty.tasks.on_saved(&mut replies);
        let waited = faulty
            .tasks
            .wait(
                Reach::Own(OPERATOR),
                &id,
                None,
                ReplyTo::Task(1),
                Instant::now(),
            )
            .unwrap();
        if matches!(waited, Waited::ReadResult { .. }) {
            break;
        }
        assert!(Instant::now() < deadline, "the end was never saved");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(state(&faulty.disk), "completed");
}
