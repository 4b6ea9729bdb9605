//! `agentos run`: the prompt-to-program loop as a command. It dispatches
//! a prompt task and follows it to its end, with a progress line on a
//! terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    PromptRequest, TaskDispatch, TaskDispatchReply, TaskKind, TaskRef, TaskReply, TaskRequest,
    TaskWait, DEFAULT_ITERATIONS,
};
use agentos_proto::Client;

use crate::error::CliError;
use crate::input::words_or_stdin;
use crate::task::{ask, or_null, TaskResult, Waited};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// What to do (its words are joined by spaces); `-` reads it from stdin
    #[arg(required = true)]
    prompt: Vec<String>,
    /// Rounds of code and output at most
    #[arg(long, value_name = "N")]
    max_iterations: Option<u32>,
    /// A system instruction added to the kernel's own
    #[arg(long)]
    system: Option<String>,
    /// Run the code in this EXEC session, whose interpreter and /workspace
    /// outlive the task [default: one of the task's own, closed with it]
    #[arg(short, long, value_name = "NAME")]
    session: Option<String>,
}

/// The prompt task the command line asks for.
fn dispatch(args: RunArgs) -> Result<TaskRequest, CliError> {
    let request = PromptRequest {
        prompt: words_or_stdin(&args.prompt)?,
        max_iterations: args.max_iterations.unwrap_or(DEFAULT_ITERATIONS),
        system: args.system,
        session: args.session,
    };
    Ok(TaskRequest::Dispatch(TaskDispatch::new(
        TaskKind::Prompt,
        serde_json::to_value(request)?,
    )))
}

/// `wait_for` is how long it follows the task: the global `--timeout`.
pub fn run_prompt(
    client: &mut Client,
    args: RunArgs,
    wait_for: Duration,
    json: bool,
) -> Result<ExitCode, CliError> {
    let task_id = ask(client, &dispatch(args)?)?
        .decode::<TaskDispatchReply>()?
        .task_id;
    let live = std::io::stderr().is_terminal();
    let deadline = Instant::now() + wait_for;
    let (raw, task) = loop {
        // Short waits, so a terminal sees where the loop is meanwhile.
        let wait = TaskRequest::Wait(TaskWait {
            task_id: task_id.clone(),
            timeout_ms: Some(500),
        });
        let raw = ask(client, &wait)?;
        let task = raw.decode::<TaskReply>()?.task;
        if task.result.is_some() {
            break (raw, task);
        }
        if Instant::now() >= deadline {
            if live {
                eprint!("\r\x1b[2K");
            }
            return Err(CliError::TaskStillRunning {
                state: task.state.as_str().to_owned(),
                task_id,
                waited: wait_for,
            });
        }
        if live {
            let status = TaskRequest::Status(TaskRef {
                task_id: task_id.clone(),
            });
            let progress = ask(client, &status)?.decode::<TaskReply>()?.task.progress;
            let iteration = progress.as_ref().and_then(|p| p.iteration).unwrap_or(1);
            let last = progress
                .as_ref()
                .and_then(|p| p.output.lines().last())
                .unwrap_or("");
            let line: String = format!("iteration {iteration}: {last}")
                .chars()
                .take(70)
                .collect();
            eprint!("\r\x1b[2K[{task_id}] {line}");
        }
    };
    if live {
        eprint!("\r\x1b[2K");
    }
    let result = TaskResult::of(&task).unwrap_or_default();
    if json {
        raw.decode::<Waited>()?.task.print()?;
    } else if let Some(answer) = &result.answer {
        println!("{answer}");
    }
    let iterations = result.iterations.as_deref().unwrap_or_default();
    if !json {
        // The transcript in brief: what each round ran and how it ended.
        for (n, iteration) in iterations.iter().enumerate() {
            let code = &iteration.code;
            let first = code.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            eprintln!(
                "agentos: iteration {}: {} line(s) of {}, exit {}, starting `{}`",
                n + 1,
                code.lines().count(),
                iteration.language,
                or_null(iteration.exit_code),
                first.chars().take(60).collect::<String>()
            );
        }
    }
    eprintln!(
        "agentos: {} in {} iteration(s), {} tokens, {} tool calls",
        task.state.as_str(),
        iterations.len(),
        or_null(result.tokens),
        or_null(result.tool_calls)
    );
    if task.state.as_str() == "completed" {
        if let Some(why) = &result.unchecked {
            eprintln!("agentos: the answer is unchecked: {why}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(error) = &result.error {
        eprintln!("agentos: {error}");
    }
    Ok(ExitCode::FAILURE)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        run: RunArgs,
    }

    /// The prompt request `agentos run ARGS` dispatches.
    fn dispatched(args: &[&str]) -> PromptRequest {
        let line = Line::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .expect("a valid command line");
        let TaskRequest::Dispatch(dispatch) = dispatch(line.run).expect("a request") else {
            panic!("run dispatches a task");
        };
        assert_eq!(dispatch.kind, TaskKind::Prompt);
        serde_json::from_value(dispatch.request).expect("a prompt request")
    }

    #[test]
    fn session_names_the_exec_session_the_prompt_task_runs_its_code_in() {
        let request = dispatched(&["--session", "s1", "sum", "1..10"]);
        assert_eq!(request.session.as_deref(), Some("s1"));
        assert_eq!(request.prompt, "sum 1..10");
        assert_eq!(
            dispatched(&["-s", "s2", "x"]).session.as_deref(),
            Some("s2")
        );
    }

    #[test]
    fn without_session_the_task_uses_one_of_its_own() {
        let request = dispatched(&["sum"]);
        assert_eq!(request.session, None);
        assert_eq!(request.max_iterations, DEFAULT_ITERATIONS);
    }
}
