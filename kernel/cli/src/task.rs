//! `agentos task ...`: background tasks.

use std::fmt::Display;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    ExecRequest, Language, PrincipalInfo, PromptIteration, PromptResult, TaskCancelReply,
    TaskDispatch, TaskDispatchReply, TaskInfo, TaskKind, TaskList, TaskListReply, TaskOwner,
    TaskRef, TaskReply, TaskRequest, TaskState, TaskWait, ThinkRequest,
};
use agentos_proto::{Client, Opcode};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

use crate::error::CliError;
use crate::input::{millis, protocol_word, seconds, words_or_stdin};
use crate::raw::Raw;

/// The longest one TASK `wait` request waits: well inside the kernel's
/// bound on it.
const WAIT_STEP: Duration = Duration::from_secs(60);

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Start code (or, with --think, a prompt) in the background; prints
    /// the task id
    Dispatch {
        /// The code, or the prompt (its words are joined by spaces); `-`
        /// reads it from stdin
        #[arg(required = true, allow_hyphen_values = true)]
        text: Vec<String>,
        /// The text is a prompt for the LLM, not code
        #[arg(long)]
        think: bool,
        /// The code is bash, not Python
        #[arg(long, conflicts_with = "think")]
        bash: bool,
        /// Your own name for the task
        #[arg(long)]
        label: Option<String>,
        /// The run's own wall-clock limit, in seconds, enforced by the
        /// kernel [default: the kernel's]
        #[arg(long, value_name = "SECS", conflicts_with = "think")]
        run_timeout: Option<f64>,
        /// In a fleet: start it at most N times, when the node running it
        /// dies (1 to 10) [default: 1]
        #[arg(long, value_name = "N")]
        max_attempts: Option<u32>,
        /// In a fleet: run it on this node only
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// In a fleet: your key for this dispatch; dispatching again with
        /// it answers with the same task
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// A task as it is (with what it has printed, while it runs)
    Status {
        /// The task's id
        task_id: String,
    },
    /// Wait for a task to end and print its result (a run's output, a
    /// THINK's answer); exits non-zero unless it completed. The global
    /// --timeout is how long to wait (default 600 s; the task goes on)
    Wait {
        /// The task's id
        task_id: String,
    },
    /// Your tasks, newest first
    List {
        /// Only tasks in this state (queued, running, completed, ...)
        #[arg(long, value_parser = protocol_word::<TaskState>)]
        state: Option<TaskState>,
        /// Only tasks of this kind (exec, think, prompt)
        #[arg(long, value_parser = protocol_word::<TaskKind>)]
        kind: Option<TaskKind>,
        /// Most tasks shown
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Another owner's tasks (operators only): an agent's id or name,
        /// or `*` for everyone's
        #[arg(long)]
        owner: Option<String>,
        /// Your tasks in the whole fleet, not only this node's
        #[arg(long, conflicts_with = "owner")]
        fleet: bool,
    },
    /// Stop a queued or running task
    Cancel {
        /// The task's id
        task_id: String,
    },
}

/// What the CLI reads of a task's result, whichever reply it is: an
/// EXEC reply's streams, a THINK reply's answer, the prompt loop's answer
/// and transcript, or why the work failed or was stopped.
#[derive(Debug, Default, Deserialize)]
pub struct TaskResult {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// A THINK's answer.
    pub content: Option<String>,
    pub error: Option<String>,
    /// The prompt loop's answer.
    #[serde(skip)]
    pub answer: Option<String>,
    /// The prompt loop's rounds.
    #[serde(skip)]
    pub iterations: Option<Vec<PromptIteration>>,
    /// The prompt loop's tokens.
    #[serde(skip)]
    pub tokens: Option<u64>,
    /// The prompt loop's tool calls.
    #[serde(skip)]
    pub tool_calls: Option<u64>,
    /// Why the prompt loop's answer is not checked, if it is not.
    #[serde(skip)]
    pub unchecked: Option<String>,
}

impl TaskResult {
    /// The task's result, if it has finished (an empty one if it cannot
    /// be read as any of the replies a task ends with).
    pub fn of(task: &TaskInfo) -> Option<TaskResult> {
        let result = task.result.as_ref()?;
        // A prompt task stopped or refused before its loop ended has that
        // reply as its result, not the loop's: read as any other.
        if task.kind == TaskKind::Prompt {
            if let Ok(prompt) = PromptResult::deserialize(result) {
                return Some(TaskResult::from(prompt));
            }
        }
        Some(TaskResult::deserialize(result).unwrap_or_default())
    }
}

impl From<PromptResult> for TaskResult {
    fn from(prompt: PromptResult) -> TaskResult {
        TaskResult {
            error: prompt.error,
            answer: prompt.answer,
            iterations: Some(prompt.iterations),
            tokens: Some(prompt.tokens),
            tool_calls: Some(prompt.tool_calls),
            unchecked: (prompt.success && !prompt.checked).then(|| {
                prompt
                    .unchecked_reason
                    .unwrap_or_else(|| "the kernel did not say why".to_owned())
            }),
            ..TaskResult::default()
        }
    }
}

/// A figure as JSON writes it: `null` when there is none.
pub fn or_null(figure: Option<impl Display>) -> String {
    figure.map_or_else(|| "null".to_owned(), |figure| figure.to_string())
}

/// `wait`'s reply with its task as the kernel sent it, for `--json`.
#[derive(Debug, Deserialize)]
pub struct Waited {
    pub task: Raw,
}

/// `wait_for` is how long `wait` waits: the global `--timeout`.
pub fn task(
    client: &mut Client,
    command: TaskCommand,
    wait_for: Duration,
    json: bool,
) -> Result<ExitCode, CliError> {
    match command {
        TaskCommand::Dispatch {
            text,
            think,
            bash,
            label,
            run_timeout,
            max_attempts,
            node,
            idempotency_key,
        } => {
            let text = words_or_stdin(&text)?;
            if let Some(secs) = run_timeout {
                seconds("--run-timeout", secs)?;
            }
            let timeout_ms = run_timeout.map(millis);
            let (kind, request) = if think {
                let request = ThinkRequest {
                    prompt: Some(text),
                    ..ThinkRequest::default()
                };
                (TaskKind::Think, serde_json::to_value(request)?)
            } else {
                let request = ExecRequest {
                    code: text,
                    language: if bash {
                        Language::Bash
                    } else {
                        Language::Python
                    },
                    timeout_ms,
                    ..ExecRequest::default()
                };
                (TaskKind::Exec, serde_json::to_value(request)?)
            };
            let raw = ask(
                client,
                &TaskRequest::Dispatch(TaskDispatch {
                    label,
                    max_attempts,
                    node,
                    idempotency_key,
                    ..TaskDispatch::new(kind, request)
                }),
            )?;
            if json {
                raw.print()?;
            } else {
                println!("{}", raw.decode::<TaskDispatchReply>()?.task_id);
            }
        }
        TaskCommand::Status { task_id } => {
            let raw = ask(client, &TaskRequest::Status(TaskRef { task_id }))?;
            if json {
                raw.print()?;
            } else {
                print!("{}", describe(&raw.decode::<TaskReply>()?.task));
            }
        }
        TaskCommand::Wait { task_id } => {
            // In steps the kernel accepts, until the task ends or the wait
            // asked for is over.
            let deadline = Instant::now() + wait_for;
            let (raw, reply) = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let step = left.min(WAIT_STEP);
                let request = TaskRequest::Wait(TaskWait {
                    task_id: task_id.clone(),
                    timeout_ms: Some(step.as_millis() as u64),
                });
                let raw = ask(client, &request)?;
                let reply: TaskReply = raw.decode()?;
                if reply.task.state.is_finished() || left <= step {
                    break (raw, reply);
                }
            };
            let task = &reply.task;
            if json {
                raw.decode::<Waited>()?.task.print()?;
            } else if let Some(result) = TaskResult::of(task) {
                // A run's output, a THINK's answer, or why it did not end well.
                print!("{}", result.stdout.unwrap_or_default());
                eprint!("{}", result.stderr.unwrap_or_default());
                if let Some(answer) = result.content {
                    println!("{answer}");
                }
                if let Some(error) = result.error {
                    eprintln!("agentos: {error}");
                }
            }
            let state = task.state.as_str();
            if state == "completed" {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("agentos: task {task_id} is {state}");
            return Ok(ExitCode::FAILURE);
        }
        TaskCommand::List {
            state,
            kind,
            limit,
            owner,
            fleet,
        } => {
            // An agent's id is a number; anything else, a name or `*`.
            let whose = owner.as_deref().map(|owner| match owner.parse::<u32>() {
                Ok(id) => TaskOwner::Agent(id),
                Err(_) => TaskOwner::Name(owner.to_owned()),
            });
            let request = TaskRequest::List(TaskList {
                state,
                kind,
                limit: Some(limit),
                before: None,
                owner: whose,
                fleet,
            });
            let raw = ask(client, &request)?;
            if json {
                raw.print()?;
            } else {
                let reply: TaskListReply = raw.decode()?;
                print!("{}", list_table(&reply, owner.is_some()));
                if let Some(next) = &reply.next {
                    eprintln!("agentos: more tasks before {next}");
                }
            }
        }
        TaskCommand::Cancel { task_id } => {
            let request = TaskRequest::Cancel(TaskRef {
                task_id: task_id.clone(),
            });
            let raw = ask(client, &request)?;
            if json {
                raw.print()?;
            } else if raw.decode::<TaskCancelReply>()?.cancelled {
                println!("cancelled {task_id}");
            } else {
                println!("{task_id} had already ended");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `task list`'s table, with each task's owner when they may be
/// another's.
fn list_table(reply: &TaskListReply, with_owner: bool) -> String {
    let heading = if with_owner { "OWNER" } else { "" };
    let mut out = format!(
        "{:<20} {:<6} {:<11} {:<24} {heading:<width$}LABEL\n",
        "TASK",
        "KIND",
        "STATE",
        "CREATED",
        width = if with_owner { 21 } else { 0 },
    );
    for task in &reply.tasks {
        let whose = if with_owner {
            format!("{:<20} ", owner_name(task.owner.as_ref()))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{:<20} {:<6} {:<11} {:<24} {whose}{}\n",
            task.task_id,
            task.kind.as_str(),
            task.state.as_str(),
            task.created_at,
            task.label.as_deref().unwrap_or(""),
        ));
    }
    out
}

/// `task status`'s text: the task's kind, label and state, its times, and
/// while it runs what it has printed so far.
fn describe(task: &TaskInfo) -> String {
    let time = |at: &Option<String>| at.as_deref().unwrap_or("-").to_owned();
    let label = task
        .label
        .as_deref()
        .map(|l| format!(" \"{l}\""))
        .unwrap_or_default();
    let mut out = format!(
        "task {}{label} ({}): {}\n",
        task.task_id,
        task.kind.as_str(),
        task.state.as_str()
    );
    out.push_str(&format!(
        "created {}, started {}, finished {}\n",
        task.created_at,
        time(&task.started_at),
        time(&task.finished_at)
    ));
    if let Some(progress) = &task.progress {
        if let Some(iteration) = progress.iteration {
            out.push_str(&format!("iteration {iteration}\n"));
        }
        if !progress.output.is_empty() {
            out.push_str("output so far:\n");
            for line in progress.output.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    if let Some(node) = &task.node {
        let attempts = task
            .attempts
            .map(|n| format!(", attempt {n}"))
            .unwrap_or_default();
        out.push_str(&format!("node {node}{attempts}\n"));
    }
    if let Some(why) = &task.waiting_for {
        out.push_str(&format!("waiting: {why}\n"));
    }
    if let Some(error) = TaskResult::of(task).and_then(|result| result.error) {
        out.push_str(&format!("error: {error}\n"));
    }
    if task.state.is_finished() {
        let id = &task.task_id;
        out.push_str(&format!("its result: agentos task wait {id}\n"));
    }
    out
}

/// One TASK request, its reply as sent (an error reply as an error).
pub fn ask(client: &mut Client, request: &impl Serialize) -> Result<Raw, CliError> {
    Ok(client.call_json(Opcode::TASK, &serde_json::to_vec(request)?)?)
}

/// A task's owner in a few characters: `uid 0`, `worker1 (7)`, `run of worker1 (7)`,
/// `key-1 of uid 0`.
pub(crate) fn owner_name(owner: Option<&PrincipalInfo>) -> String {
    match owner {
        Some(PrincipalInfo::Operator { uid }) => format!("uid {uid}"),
        Some(PrincipalInfo::Agent { id, name }) => match name {
            Some(name) => format!("{name} ({id})"),
            None => format!("agent {id}"),
        },
        Some(PrincipalInfo::Delegate { name, of }) => format!("{name} of {}", owner_name(Some(of))),
        Some(PrincipalInfo::Run { of: Some(of) }) => format!("run of {}", owner_name(Some(of))),
        Some(PrincipalInfo::Run { of: None }) => "a run".to_owned(),
        None => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_as_text_with_the_output_so_far() {
        let task: TaskInfo = serde_json::from_str(
            r#"{"task_id": "t-1", "kind": "exec", "label": "nightly", "state": "running",
                "created_at": "2026-11-26T08:00:00Z", "started_at": "2026-11-26T08:00:01Z",
                "finished_at": null, "progress": {"output": "step 1\nstep 2\n"}}"#,
        )
        .unwrap();
        let text = describe(&task);
        assert!(
            text.starts_with("task t-1 \"nightly\" (exec): running\n"),
            "{text}"
        );
        assert!(text.contains("finished -"), "{text}");
        assert!(
            text.contains("output so far:\n  step 1\n  step 2\n"),
            "{text}"
        );
        assert!(!text.contains('{'), "no JSON: {text}");
    }

    #[test]
    fn a_prompt_tasks_result_is_its_loops_unless_it_was_stopped_first() {
        let finished = |kind: &str, result: serde_json::Value| -> TaskInfo {
            serde_json::from_value(serde_json::json!({
                "task_id": "t-1", "kind": kind, "label": null, "state": "failed",
                "created_at": "2026-11-26T08:00:00Z", "started_at": null,
                "finished_at": null, "progress": null, "result": result,
            }))
            .unwrap()
        };
        let looped = finished(
            "prompt",
            serde_json::json!({"success": false, "answer": null, "iterations": [
                {"code": "1/0", "language": "python", "stdout": "", "stderr": "ZeroDivisionError",
                 "exit_code": 1}], "tokens": 9, "tool_calls": 2, "tool_bytes": 10,
                "error": "THINK failed: gone"}),
        );
        let result = TaskResult::of(&looped).unwrap();
        let iterations = result.iterations.unwrap();
        assert_eq!(
            (iterations.len(), iterations[0].language.as_str()),
            (1, "python")
        );
        assert_eq!((result.tokens, result.tool_calls), (Some(9), Some(2)));
        assert_eq!(result.error.as_deref(), Some("THINK failed: gone"));

        let stopped = serde_json::to_value(agentos_proto::payload::StoppedResult::cancelled(
            "the task was cancelled by its owner",
        ))
        .unwrap();
        let result = TaskResult::of(&finished("prompt", stopped)).unwrap();
        assert!(result.iterations.is_none() && result.tokens.is_none());
        assert_eq!(
            result.error.as_deref(),
            Some("the task was cancelled by its owner")
        );

        let run = serde_json::json!({"success": true, "stdout": "1\n", "stderr": "",
                                     "exit_code": 0, "tool_calls": 0});
        let result = TaskResult::of(&finished("exec", run)).unwrap();
        assert_eq!(result.stdout.as_deref(), Some("1\n"));
        assert!(result.iterations.is_none() && result.tool_calls.is_none());
    }

    #[test]
    fn owners_read_in_a_few_characters() {
        let agent = PrincipalInfo::Agent {
            id: 7,
            name: Some("worker1".into()),
        };
        assert_eq!(
            owner_name(Some(&PrincipalInfo::Operator { uid: 0 })),
            "uid 0"
        );
        assert_eq!(owner_name(Some(&agent)), "worker1 (7)");
        let run = PrincipalInfo::Run {
            of: Some(Box::new(agent)),
        };
        assert_eq!(owner_name(Some(&run)), "run of worker1 (7)");
        assert_eq!(owner_name(None), "?");
    }
}
