//! A prompt task's loop as the tasks drive it: each step's work comes
//! back under the task's number until THINK answers without code.

use crate::tasks::tool_menu::ToolMenu;
use agentos_proto::payload::{ExecReply, TaskDispatch, TaskKind, TaskState, ThinkReply};
use serde_json::json;

use super::{dispatch, save, state, tasks, OPERATOR};
use crate::config::tasks::TasksConfig;
use crate::tasks::{Reach, WorkRequest};

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
    let prompt = TaskDispatch {
        kind: TaskKind::Prompt,
        request: json!({ "prompt": "sum 1..10" }),
        label: None,
        trace: None,
    };
    let id = dispatch(&mut tasks, OPERATOR, prompt);
    save(&mut tasks);
    assert!(tasks.prompt_queued());
    let start = tasks
        .startable(&ToolMenu::new(
            |_| vec!["- tools.x.y(...): why".into()],
            None,
        ))
        .pop()
        .unwrap();
    let Ok(WorkRequest::Think(first)) = &start.work else {
        panic!("{start:?}");
    };
    let system = &first.messages.as_ref().unwrap()[0].content;
    assert!(system.contains("- tools.x.y(...): why"), "{system}");
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
