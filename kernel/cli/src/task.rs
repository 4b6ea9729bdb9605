//! `agentos task ...`: background tasks.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::{Client, Opcode};
use clap::Subcommand;
use serde_json::Value;

use crate::format::print_json;
use crate::words_or_stdin;

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
        #[arg(long, value_name = "SECS")]
        run_timeout: Option<f64>,
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
        #[arg(long)]
        state: Option<String>,
        /// Only tasks of this kind (exec, think)
        #[arg(long)]
        kind: Option<String>,
        /// Most tasks shown
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// Another owner's tasks (operators only): an agent's id or name,
        /// or `*` for everyone's
        #[arg(long)]
        owner: Option<String>,
    },
    /// Stop a queued or running task
    Cancel {
        /// The task's id
        task_id: String,
    },
}

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
}

/// `agentos run`: dispatches a prompt task and follows it to its end, with
/// a progress line on a terminal.
/// `wait_for` is how long it follows the task: the global `--timeout`.
pub fn run_prompt(
    client: &mut Client,
    args: RunArgs,
    wait_for: Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use serde_json::json;
    use std::io::IsTerminal;
    let prompt = words_or_stdin(&args.prompt)?;
    let mut request = json!({"prompt": prompt});
    if let Some(n) = args.max_iterations {
        request["max_iterations"] = n.into();
    }
    if let Some(system) = args.system {
        request["system"] = system.into();
    }
    let mut call = |body: Value| task_call(client, &body);
    let task_id = call(json!({"op": "dispatch", "kind": "prompt", "request": request}))?["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let live = std::io::stderr().is_terminal();
    let deadline = Instant::now() + wait_for;
    let task = loop {
        // Short waits, so a terminal sees where the loop is meanwhile.
        let body = json!({"op": "wait", "task_id": task_id, "timeout_ms": 500});
        let task = call(body)?["task"].clone();
        if task.get("result").is_some() {
            break task;
        }
        if Instant::now() >= deadline {
            if live {
                eprint!("\r\x1b[2K");
            }
            anyhow::bail!(
                "task {task_id} is still {} after {:.0} s; it goes on: agentos task wait {task_id} \
                 (--timeout SECS waits longer)",
                task["state"].as_str().unwrap_or("running"),
                wait_for.as_secs_f64()
            );
        }
        if live {
            let status = call(json!({"op": "status", "task_id": task_id}))?["task"].clone();
            let iteration = status["progress"]["iteration"].as_u64().unwrap_or(1);
            let last = status["progress"]["output"]
                .as_str()
                .and_then(|o| o.lines().last())
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
    let result = &task["result"];
    if json {
        print_json(&task)?;
    } else if let Some(answer) = result["answer"].as_str() {
        println!("{answer}");
    }
    let iterations = result["iterations"].as_array().map_or(0, Vec::len);
    if !json {
        // The transcript in brief: what each round ran and how it ended.
        for (n, iteration) in result["iterations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let code = iteration["code"].as_str().unwrap_or_default();
            let first = code.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            eprintln!(
                "agentos: iteration {}: {} line(s) of {}, exit {}, starting `{}`",
                n + 1,
                code.lines().count(),
                iteration["language"].as_str().unwrap_or("?"),
                iteration["exit_code"],
                first.chars().take(60).collect::<String>()
            );
        }
    }
    eprintln!(
        "agentos: {} in {iterations} iteration(s), {} tokens, {} tool calls",
        task["state"].as_str().unwrap_or("?"),
        result["tokens"],
        result["tool_calls"]
    );
    if task["state"] == "completed" {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(error) = result["error"].as_str() {
        eprintln!("agentos: {error}");
    }
    Ok(ExitCode::FAILURE)
}

/// `wait_for` is how long `wait` waits: the global `--timeout`.
pub fn task(
    client: &mut Client,
    command: TaskCommand,
    wait_for: Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use serde_json::json;
    let mut call = |body: Value| task_call(client, &body);
    match command {
        TaskCommand::Dispatch {
            text,
            think,
            bash,
            label,
            run_timeout,
        } => {
            let text = words_or_stdin(&text)?;
            let (kind, mut request) = if think {
                ("think", json!({"prompt": text}))
            } else {
                let language = if bash { "bash" } else { "python" };
                ("exec", json!({"code": text, "language": language}))
            };
            if let Some(secs) = run_timeout {
                crate::seconds("--run-timeout", secs)?;
                request["timeout_ms"] = ((secs * 1e3).round() as u64).into();
            }
            let mut body = json!({"op": "dispatch", "kind": kind, "request": request});
            if let Some(label) = label {
                body["label"] = label.into();
            }
            let reply = call(body)?;
            if json {
                print_json(&reply)?;
            } else {
                println!("{}", reply["task_id"].as_str().unwrap_or_default());
            }
        }
        TaskCommand::Status { task_id } => {
            let reply = call(json!({"op": "status", "task_id": task_id}))?;
            if json {
                print_json(&reply)?;
            } else {
                print!("{}", describe(&reply["task"]));
            }
        }
        TaskCommand::Wait { task_id } => {
            // In steps the kernel accepts, until the task ends or the wait
            // asked for is over.
            let deadline = Instant::now() + wait_for;
            let reply = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let step = left.min(WAIT_STEP);
                let timeout_ms = step.as_millis() as u64;
                let body = json!({"op": "wait", "task_id": task_id, "timeout_ms": timeout_ms});
                let reply = call(body)?;
                let state = reply["task"]["state"].as_str().unwrap_or("");
                if !matches!(state, "queued" | "running") || left <= step {
                    break reply;
                }
            };
            let task = &reply["task"];
            if json {
                print_json(task)?;
            } else if let Some(result) = task.get("result") {
                // A run's output, a THINK's answer, or why it did not end well.
                print!("{}", result["stdout"].as_str().unwrap_or_default());
                eprint!("{}", result["stderr"].as_str().unwrap_or_default());
                if let Some(answer) = result["content"].as_str() {
                    println!("{answer}");
                }
                if let Some(error) = result["error"].as_str() {
                    eprintln!("agentos: {error}");
                }
            }
            let state = task["state"].as_str().unwrap_or("?");
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
        } => {
            let mut body = json!({"op": "list", "limit": limit});
            if let Some(state) = state {
                body["state"] = state.into();
            }
            if let Some(kind) = kind {
                body["kind"] = kind.into();
            }
            if let Some(owner) = &owner {
                // An agent's id is a number; anything else, a name or `*`.
                body["owner"] = owner
                    .parse::<u32>()
                    .map_or_else(|_| owner.as_str().into(), Into::into);
            }
            let reply = call(body)?;
            if json {
                print_json(&reply)?;
            } else {
                // Whose each task is, when they may be another's.
                let whose = |task: &serde_json::Value| match owner {
                    Some(_) => format!("{:<20} ", owner_name(&task["owner"])),
                    None => String::new(),
                };
                let heading = if owner.is_some() { "OWNER" } else { "" };
                println!(
                    "{:<20} {:<6} {:<11} {:<24} {heading:<width$}LABEL",
                    "TASK",
                    "KIND",
                    "STATE",
                    "CREATED",
                    width = if owner.is_some() { 21 } else { 0 },
                );
                for task in reply["tasks"].as_array().into_iter().flatten() {
                    println!(
                        "{:<20} {:<6} {:<11} {:<24} {}{}",
                        task["task_id"].as_str().unwrap_or("?"),
                        task["kind"].as_str().unwrap_or("?"),
                        task["state"].as_str().unwrap_or("?"),
                        task["created_at"].as_str().unwrap_or("?"),
                        whose(task),
                        task["label"].as_str().unwrap_or(""),
                    );
                }
                if let Some(next) = reply["next"].as_str() {
                    eprintln!("agentos: more tasks before {next}");
                }
            }
        }
        TaskCommand::Cancel { task_id } => {
            let reply = call(json!({"op": "cancel", "task_id": task_id}))?;
            if json {
                print_json(&reply)?;
            } else if reply["cancelled"] == true {
                println!("cancelled {task_id}");
            } else {
                println!("{task_id} had already ended");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `task status`'s text: the task's kind, label and state, its times, and
/// while it runs what it has printed so far.
fn describe(task: &Value) -> String {
    let text = |field: &str| task[field].as_str().unwrap_or("-").to_owned();
    let label = task["label"]
        .as_str()
        .map(|l| format!(" \"{l}\""))
        .unwrap_or_default();
    let mut out = format!(
        "task {}{label} ({}): {}\n",
        text("task_id"),
        text("kind"),
        text("state")
    );
    out.push_str(&format!(
        "created {}, started {}, finished {}\n",
        text("created_at"),
        text("started_at"),
        text("finished_at")
    ));
    let progress = &task["progress"];
    if let Some(iteration) = progress["iteration"].as_u64() {
        out.push_str(&format!("iteration {iteration}\n"));
    }
    if let Some(output) = progress["output"].as_str().filter(|o| !o.is_empty()) {
        out.push_str("output so far:\n");
        for line in output.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    if let Some(error) = task["result"]["error"].as_str() {
        out.push_str(&format!("error: {error}\n"));
    }
    if task["state"] != "queued" && task["state"] != "running" {
        let id = text("task_id");
        out.push_str(&format!("its result: agentos task wait {id}\n"));
    }
    out
}

/// One TASK request, its reply as JSON (an error reply as an error).
fn task_call(client: &mut Client, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    Ok(client.call_json(Opcode::TASK, &serde_json::to_vec(body)?)?)
}

/// A task's owner in a few characters: `uid 0`, `worker1 (7)`, `run of worker1 (7)`.
fn owner_name(owner: &serde_json::Value) -> String {
    match owner["kind"].as_str() {
        Some("operator") => format!("uid {}", owner["uid"]),
        Some("agent") => match owner["name"].as_str() {
            Some(name) => format!("{name} ({})", owner["id"]),
            None => format!("agent {}", owner["id"]),
        },
        Some("run") if owner["of"].is_object() => format!("run of {}", owner_name(&owner["of"])),
        Some("run") => "a run".to_owned(),
        _ => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_as_text_with_the_output_so_far() {
        let task = serde_json::json!({
            "task_id": "t-1", "kind": "exec", "label": "nightly", "state": "running",
            "created_at": "2026-11-26T08:00:00Z", "started_at": "2026-11-26T08:00:01Z",
            "finished_at": null, "progress": {"output": "step 1\nstep 2\n"}});
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
}
