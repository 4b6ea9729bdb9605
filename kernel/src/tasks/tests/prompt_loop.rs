//! A prompt task's loop as the tasks drive it: each step's work comes
//! back under the task's number until THINK answers without code.

use crate::tasks::tool_menu::{Ranked, ToolMenu};
use agentos_proto::payload::{ExecReply, TaskDispatch, TaskKind, TaskState, ThinkReply};
use serde_json::json;

use super::{caller, dispatch, save, state, task_in, tasks, OPERATOR};
use crate::config::tasks::TasksConfig;
use crate::tasks::{Reach, Waited, WorkRequest};
use std::time::Instant;

fn think(content: &str) -> ThinkReply {
    ThinkReply {
        success: true,
        content: content.into(),
        tokens: 10,
        error: None,
        code: None,
        usage: None,
        model: None,
        queue_ms: None,
        latency_ms: None,
    }
}

#[test]
fn a_prompt_task_thinks_runs_its_code_in_its_own_session_and_ends_with_the_answer() {
    let mut tasks = tasks(TasksConfig::default());
    let prompt = TaskDispatch::new(TaskKind::Prompt, json!({ "prompt": "sum 1..10" }));
    let id = dispatch(&mut tasks, OPERATOR, prompt);
    save(&mut tasks);
    assert!(tasks.prompt_queued());
    let start = tasks
        .startable(&ToolMenu::new(
            |_, _| Ranked {
                named: vec!["tools.x.y(path, head=None)  # why".into()],
                rest: Vec::new(),
            },
            None,
        ))
        .pop()
        .unwrap();
    let Ok(WorkRequest::Think(first)) = &start.work else {
        panic!("{start:?}");
    };
    let system = &first.messages.as_ref().unwrap()[0].content;
    assert!(
        system.contains("tools.x.y(path, head=None)  # why"),
        "{system}"
    );
    let number = start.number;
    let mut replies = Vec::new();
    let run = tasks
        .on_reply(
            number,
            think("```python\nprint(55)\n```").into(),
            &mut replies,
        )
        .unwrap();
    assert_eq!(run.number, number);
    let Ok(WorkRequest::Exec(code)) = &run.work else {
        panic!("{run:?}");
    };
    assert_eq!(code.session, Some(format!("task-{id}")));
    let progress = tasks.status(Reach::Any, &id).unwrap().progress.unwrap();
    assert_eq!(progress.iteration, Some(1));
    let ran = ExecReply {
        success: true,
        stdout: "55\n".into(),
        exit_code: Some(0),
        ..ExecReply::default()
    };
    let again = tasks.on_reply(number, ran.into(), &mut replies).unwrap();
    assert!(matches!(again.work, Ok(WorkRequest::Think(_))));
    assert!(tasks
        .on_reply(number, think("55").into(), &mut replies)
        .is_none());
    assert_eq!(state(&tasks, &id), TaskState::Completed);
    // The session it made for itself is closed.
    assert_eq!(
        tasks.take_ended_sessions(),
        [(OPERATOR, format!("task-{id}"))]
    );
    assert!(tasks.running().is_empty());
}

#[test]
fn a_prompt_task_whose_model_repeats_failing_code_fails_with_the_reason() {
    let mut tasks = tasks(TasksConfig::default());
    let prompt = TaskDispatch::new(
        TaskKind::Prompt,
        json!({ "prompt": "read a.txt", "max_iterations": 10 }),
    );
    let id = dispatch(&mut tasks, OPERATOR, prompt);
    save(&mut tasks);
    let start = tasks.startable(&ToolMenu::empty()).pop().unwrap();
    let number = start.number;
    let mut replies = Vec::new();
    let same = "```python\nimport tools\ntools.x.y('a.txt', 1, 2, 3)\n```";
    let run = tasks
        .on_reply(number, think(same).into(), &mut replies)
        .unwrap();
    assert!(matches!(run.work, Ok(WorkRequest::Exec(_))));
    let failed = ExecReply {
        stderr: "TypeError: tools.x.y(path, head=None) takes 2 positional arguments but 4 \
                 were given\n"
            .into(),
        exit_code: Some(1),
        ..ExecReply::default()
    };
    let nudge = tasks.on_reply(number, failed.into(), &mut replies).unwrap();
    assert!(matches!(nudge.work, Ok(WorkRequest::Think(_))));
    // Not run again: THINK is asked once more.
    let again = tasks
        .on_reply(number, think(same).into(), &mut replies)
        .unwrap();
    let Ok(WorkRequest::Think(asked)) = &again.work else {
        panic!("{again:?}");
    };
    let told = &asked.messages.as_ref().unwrap().last().unwrap().content;
    assert!(told.contains("already failed with: TypeError"), "{told}");
    let progress = tasks.status(Reach::Any, &id).unwrap().progress.unwrap();
    assert_eq!(progress.iteration, Some(3));
    let waited = tasks.wait(Reach::Any, &id, None, caller(1), Instant::now());
    assert!(matches!(waited, Ok(Waited::Later)), "{waited:?}");
    assert!(tasks
        .on_reply(number, think(same).into(), &mut replies)
        .is_none());
    assert_eq!(state(&tasks, &id), TaskState::Failed);
    let task = task_in(&replies.last().unwrap().1);
    let result = task.result.unwrap();
    assert_eq!(
        result["error"],
        "the model repeated the same failing code 3 times in a row"
    );
}
