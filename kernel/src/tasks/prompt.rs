//! The prompt-to-program loop of a `prompt` task, as a state machine the
//! kernel drives: THINK is told the task and the tools there are, and
//! answers with a fenced ```python (or ```bash) block; the code runs with
//! EXEC in the task's own session; its output (capped) or its error goes
//! back to THINK; until THINK answers without code — its answer — or the
//! iterations are spent.

use agentos_proto::payload::{
    ChatMessage, ExecReply, ExecRequest, Language, PromptRequest, ThinkReply, ThinkRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde::Serialize;

use crate::address::Answer;

/// Bytes of a run's stdout and of its stderr fed back to THINK.
const FEEDBACK_BYTES: usize = 4096;
/// A run's timeout inside the loop.
const RUN_TIMEOUT_MS: u64 = 60_000;
/// The same code block this many times in a row ends the loop. Once is a
/// run; a second time is nudged (or, if it worked, run again: code may
/// poll); a model that writes it a third time has shown a nudge does not
/// move it, and each further THINK costs a local model tens of seconds.
const SAME_CODE_IN_A_ROW_TO_STOP: usize = 3;
/// Nudges a loop gives in all before it ends: a model sent back to code
/// that already failed this often (going round between failing blocks)
/// is not converging, and the iterations left are better not spent.
const MOST_NUDGES: u32 = 3;
/// Bytes of a failed run's error quoted in a nudge.
const NUDGE_ERROR_BYTES: usize = 300;

/// What the kernel should do next for a prompt task.
#[derive(Debug)]
pub enum Step {
    /// Ask THINK.
    Think(ThinkRequest),
    /// Run the code THINK wrote.
    Exec(ExecRequest),
    /// The loop is over: the task's state is `completed` (an answer) or
    /// `failed`, with this result.
    Done {
        /// Whether THINK answered.
        answered: bool,
        /// The result (JSON).
        result: Vec<u8>,
    },
}

/// One round of the loop.
#[derive(Clone, Debug, Serialize)]
pub struct Iteration {
    /// The code THINK wrote.
    pub code: String,
    /// Its language.
    pub language: String,
    /// What it printed.
    pub stdout: String,
    /// Its errors.
    pub stderr: String,
    /// Its exit code (`null`: it was killed or never ran).
    pub exit_code: Option<i64>,
}

/// The loop's result.
#[derive(Debug, Serialize)]
struct LoopResult<'a> {
    success: bool,
    answer: Option<&'a str>,
    iterations: &'a [Iteration],
    tokens: u64,
    tool_calls: u64,
    tool_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A prompt task's loop.
#[derive(Debug)]
pub struct PromptLoop {
    request: PromptRequest,
    /// The EXEC session its code runs in.
    session: String,
    messages: Vec<ChatMessage>,
    iterations: Vec<Iteration>,
    /// The code under way (its language and text).
    running: Option<(String, String)>,
    /// Code that ran and failed, normalised, with the short error it
    /// failed with.
    failed: Vec<(Code, String)>,
    /// The last code THINK wrote, and how many times in a row it wrote it.
    last_code: Option<(Code, usize)>,
    /// Nudges given so far.
    nudges: u32,
    /// Whether an answer given before any code ran was sent back for code.
    asked_for_code: bool,
    tokens: u64,
    tool_calls: u64,
    tool_bytes: u64,
}

impl PromptLoop {
    /// A loop for `request`, whose code runs in `session`; `tools` lists
    /// the tools there are, a line each. Its first step is this THINK.
    pub fn start(
        request: PromptRequest,
        session: String,
        tools: &str,
    ) -> (PromptLoop, ThinkRequest) {
        let mut system = "You solve the user's task by writing code that the AgentOS kernel \
             runs for you.\n\
             Reply with exactly one fenced code block, ```python or ```bash, when you need to \
             run code; you will get back what it printed. When you know the answer, reply \
             with the answer alone and no code block.\n\
             The code runs in a sandbox with a /workspace that persists between your code \
             blocks. Print only what you need to see. If code fails, change it: the same code \
             fails the same way."
            .to_owned();
        // No tools named (a small model is told only of those its task
        // names): none are mentioned, or it reaches for them anyway.
        if !tools.is_empty() {
            system.push_str(&format!(
                "\n\nTools are Python functions of the `tools` module, already imported: \
                 call them as listed below, arguments by position or by name, and print what \
                 they return. Plain Python does most tasks; use a tool when the task asks for \
                 it or needs what only a tool has. `tools.search(\"words\")` finds more.\n\n\
                 Tools:\n{tools}"
            ));
        }
        if let Some(extra) = &request.system {
            system.push_str("\n\n");
            system.push_str(extra);
        }
        let messages = vec![
            ChatMessage {
                role: "system".into(),
                content: system,
            },
            ChatMessage {
                role: "user".into(),
                content: request.prompt.clone(),
            },
        ];
        let prompt = PromptLoop {
            request,
            session,
            messages,
            iterations: Vec::new(),
            running: None,
            failed: Vec::new(),
            last_code: None,
            nudges: 0,
            asked_for_code: false,
            tokens: 0,
            tool_calls: 0,
            tool_bytes: 0,
        };
        let think = prompt.think_request();
        (prompt, think)
    }

    /// Whether its code is running (the next reply is EXEC's).
    pub fn is_running_code(&self) -> bool {
        self.running.is_some()
    }

    /// The answer to the step under way: EXEC's to the code it runs,
    /// THINK's otherwise. A refusal is that step's failure.
    pub fn on_answer(&mut self, answer: Answer) -> Step {
        if self.is_running_code() {
            let reply = match answer {
                Answer::Exec(reply) => *reply,
                Answer::Error(refused) => failed_run(refused),
                other => failed_run(unexpected("EXEC", &other)),
            };
            self.on_exec(&reply)
        } else {
            let reply = match answer {
                Answer::Think(reply) => *reply,
                Answer::Error(refused) => failed_think(refused),
                other => failed_think(unexpected("THINK", &other)),
            };
            self.on_think(&reply)
        }
    }

    /// Whether its session is its own (none was named), to close when it
    /// ends.
    pub fn owns_session(&self) -> bool {
        self.request.session.is_none()
    }

    /// The session its code runs in.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The iteration under way (1 first; after the last run, the last).
    pub fn iteration(&self) -> u32 {
        (self.iterations.len() as u32 + 1).min(self.request.max_iterations)
    }

    /// THINK's reply: code to run, or the answer.
    pub fn on_think(&mut self, reply: &ThinkReply) -> Step {
        self.tokens += reply.tokens;
        if !reply.success {
            let why = reply.error.as_deref().unwrap_or("THINK failed");
            return self.done(None, Some(format!("THINK failed: {why}")));
        }
        let content = reply.content.clone();
        let Some((language, code)) = first_code_block(&content) else {
            if self.iterations.is_empty() && !self.asked_for_code {
                return self.ask_for_code(content);
            }
            return self.done(Some(answer_in(&content)), None);
        };
        if self.iterations.len() as u32 >= self.request.max_iterations {
            return self.done(
                None,
                Some(format!(
                    "THINK still wrote code after {} iterations (max_iterations)",
                    self.request.max_iterations
                )),
            );
        }
        let this = Code::new(&language, &code);
        let in_a_row = match &self.last_code {
            Some((last, times)) if *last == this => times + 1,
            _ => 1,
        };
        self.last_code = Some((this.clone(), in_a_row));
        let failed_with = self
            .failed
            .iter()
            .find(|(failed, _)| *failed == this)
            .map(|(_, error)| error.clone());
        if in_a_row >= SAME_CODE_IN_A_ROW_TO_STOP {
            let which = if failed_with.is_some() {
                "the same failing code"
            } else {
                "the same code"
            };
            return self.done(
                None,
                Some(format!(
                    "the model repeated {which} {in_a_row} times in a row"
                )),
            );
        }
        self.messages.push(ChatMessage {
            role: "assistant".into(),
            content,
        });
        if let Some(error) = failed_with {
            if self.nudges >= MOST_NUDGES {
                return self.done(
                    None,
                    Some(format!(
                        "the model kept writing code that had already failed ({} nudges)",
                        self.nudges
                    )),
                );
            }
            return self.nudge(language, code, &error);
        }
        let run = ExecRequest {
            code: code.clone(),
            language: if language == "bash" {
                Language::Bash
            } else {
                Language::Python
            },
            session: Some(self.session.clone()),
            timeout_ms: Some(RUN_TIMEOUT_MS),
            ..ExecRequest::default()
        };
        self.running = Some((language, code));
        Step::Exec(run)
    }

    /// An answer before any code ran is, from a small model, most often a
    /// guess: it is asked once to compute it instead. A second answer
    /// without code is taken.
    fn ask_for_code(&mut self, answer: String) -> Step {
        self.asked_for_code = true;
        self.messages.push(ChatMessage {
            role: "assistant".into(),
            content: answer,
        });
        self.messages.push(ChatMessage {
            role: "user".into(),
            content: "No code has run yet, so that answer is unchecked. Reply with one \
                      ```python block that computes it (calling the tools if the task \
                      names them) and prints the result; you will see what it prints."
                .into(),
        });
        self.think()
    }

    /// Code that already failed is not run again: THINK is told so, and
    /// the iteration is spent as if it had run.
    fn nudge(&mut self, language: String, code: String, error: &str) -> Step {
        self.nudges += 1;
        self.iterations.push(Iteration {
            code,
            language,
            stdout: String::new(),
            stderr: format!("not run: this exact code already failed with: {error}"),
            exit_code: None,
        });
        let mut feedback = format!(
            "This exact code already failed with: {error}\nIt was not run again. Change the \
             code to fix that error, or answer without a code block."
        );
        self.last_iteration_note(&mut feedback);
        self.messages.push(ChatMessage {
            role: "user".into(),
            content: feedback,
        });
        self.think()
    }

    /// After the last iteration, THINK is asked for its answer.
    fn last_iteration_note(&self, feedback: &mut String) {
        if self.iterations.len() as u32 >= self.request.max_iterations {
            // The last run's output still gets its answer.
            feedback.push_str("\nNo more code can run: answer now, without a code block.");
        }
    }

    /// EXEC's reply for the code under way: fed back to THINK, or the end
    /// when the iterations are spent.
    pub fn on_exec(&mut self, reply: &ExecReply) -> Step {
        let (language, code) = self.running.take().unwrap_or_default();
        self.tool_calls += reply.tool_calls;
        self.tool_bytes += reply.tool_bytes;
        let iteration = Iteration {
            code,
            language,
            stdout: reply.stdout.clone(),
            stderr: reply.stderr.clone(),
            exit_code: reply.exit_code.map(i64::from),
        };
        let mut feedback = format!(
            "Your code ran (exit code {}).\nstdout:\n{}",
            iteration
                .exit_code
                .map_or_else(|| "none".to_owned(), |c| c.to_string()),
            tail(&iteration.stdout)
        );
        if !iteration.stderr.is_empty() {
            feedback.push_str(&format!("\nstderr:\n{}", tail(&iteration.stderr)));
        }
        if let Some(error) = &reply.error {
            feedback.push_str(&format!("\nerror: {error}"));
        }
        if let Some(error) = failure(reply) {
            self.failed
                .push((Code::new(&iteration.language, &iteration.code), error));
        } else {
            // A small model that got its result often writes the same code
            // again instead of answering: say so, without refusing the run
            // (code may poll).
            if self.last_code.as_ref().is_some_and(|(_, times)| *times > 1) {
                feedback.push_str("\nThat was the same code as before, with its output above.");
            }
            feedback.push_str(
                "\nIf that answers the task, reply with the answer alone, without a code block.",
            );
        }
        self.iterations.push(iteration);
        self.last_iteration_note(&mut feedback);
        self.messages.push(ChatMessage {
            role: "user".into(),
            content: feedback,
        });
        self.think()
    }

    fn think(&self) -> Step {
        Step::Think(self.think_request())
    }

    fn think_request(&self) -> ThinkRequest {
        ThinkRequest {
            messages: Some(self.messages.clone()),
            ..ThinkRequest::default()
        }
    }

    fn done(&self, answer: Option<&str>, error: Option<String>) -> Step {
        let result = LoopResult {
            success: answer.is_some(),
            answer,
            iterations: &self.iterations,
            tokens: self.tokens,
            tool_calls: self.tool_calls,
            tool_bytes: self.tool_bytes,
            error,
        };
        Step::Done {
            answered: answer.is_some(),
            result: serde_json::to_vec(&result).unwrap_or_default(),
        }
    }
}

/// Code as the loop compares it: the same language and the same text once
/// stripped of surrounding blank space.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Code {
    language: String,
    text: String,
}

impl Code {
    fn new(language: &str, text: &str) -> Code {
        Code {
            language: language.to_owned(),
            text: text.trim().to_owned(),
        }
    }
}

/// Why a run failed, short — EXEC's error (a Python exception's last
/// line: `NameError: name 'x' is not defined`), else the last line of its
/// stderr, else its exit code — or `None` if it did not fail.
fn failure(reply: &ExecReply) -> Option<String> {
    if reply.exit_code == Some(0) && reply.error.is_none() {
        return None;
    }
    let last_line = reply
        .stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty());
    let why = match (&reply.error, last_line, reply.exit_code) {
        (Some(error), _, _) => error.clone(),
        (None, Some(line), _) => line.to_owned(),
        (None, None, Some(code)) => format!("exit code {code}"),
        (None, None, None) => "no exit code".to_owned(),
    };
    Some(head(&why, NUDGE_ERROR_BYTES).to_owned())
}

/// The last [`FEEDBACK_BYTES`] of `text`, at a character boundary.
fn tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(FEEDBACK_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The first `bytes` of `text` at most, at a character boundary.
fn head(text: &str, bytes: usize) -> &str {
    let mut end = text.len().min(bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The answer in a reply without code: its text, out of the fence of a
/// block without a language if that is all there is.
fn answer_in(reply: &str) -> &str {
    let trimmed = reply.trim();
    trimmed
        .strip_prefix("```\n")
        .and_then(|inner| inner.strip_suffix("```"))
        .filter(|inner| !inner.contains("```"))
        .map_or(trimmed, str::trim)
}

/// The first fenced code block of `text` marked python, py, python3, bash,
/// sh or shell, as (language, code); a block whose first line is a shell's
/// `#!` is bash whatever its mark.
pub fn first_code_block(text: &str) -> Option<(String, String)> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(tag) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        // A block without a language is not code: models quote an error
        // or set out their answer in one.
        let language = match tag.trim().to_ascii_lowercase().as_str() {
            "python" | "py" | "python3" => "python",
            "bash" | "sh" | "shell" => "bash",
            _ => {
                // Another language's block: its closing fence opens nothing.
                lines.by_ref().find(|l| l.trim_start().starts_with("```"));
                continue;
            }
        };
        let code: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .collect();
        // A shell script fenced as Python says what it is on its first line.
        let shell = code.first().is_some_and(|first| {
            first.starts_with("#!") && (first.ends_with("sh") || first.ends_with("bash"))
        });
        let language = if shell { "bash" } else { language };
        return Some((language.to_owned(), code.join("\n")));
    }
    None
}

/// A run that could not happen, as its reply.
fn failed_run(refused: ErrorReply) -> ExecReply {
    ExecReply {
        error: Some(refused.error),
        code: Some(refused.code),
        ..ExecReply::default()
    }
}

/// A THINK that could not happen, as its reply.
fn failed_think(refused: ErrorReply) -> ThinkReply {
    ThinkReply {
        success: false,
        content: String::new(),
        tokens: 0,
        error: Some(refused.error),
        code: Some(refused.code),
        usage: None,
        model: None,
        queue_ms: None,
        latency_ms: None,
    }
}

/// A step answered with another request's kind of reply.
fn unexpected(step: &str, answer: &Answer) -> ErrorReply {
    let kind = match answer {
        Answer::Exec(_) => "EXEC",
        Answer::Think(_) => "THINK",
        Answer::Tool(_) => "TOOL",
        Answer::Error(_) | Answer::Json(_) => "another request",
    };
    ErrorReply::new(
        ErrorCode::Internal,
        format!("the loop's {step} was answered with {kind}'s reply"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn code_blocks_are_found_by_their_language() {
        let text = "Let me look.\n```python\nprint(1)\nprint(2)\n```\nthen more";
        assert_eq!(
            first_code_block(text),
            Some(("python".into(), "print(1)\nprint(2)".into()))
        );
        assert_eq!(first_code_block("```bash\nls\n```").unwrap().0, "bash");
        assert_eq!(first_code_block("```json\n{}\n```"), None);
        assert_eq!(
            first_code_block("```json\n{}\n```\n```python\nprint(2)\n```"),
            Some(("python".into(), "print(2)".into()))
        );
        assert_eq!(first_code_block("The answer is 4."), None);
        assert_eq!(
            first_code_block("```python\n#!/bin/bash\necho 1\n```")
                .unwrap()
                .0,
            "bash",
            "a shebang says what it is"
        );
        assert_eq!(
            first_code_block("```python\n#!/usr/bin/env python3\nprint(1)\n```")
                .unwrap()
                .0,
            "python"
        );
        assert_eq!(
            first_code_block("```\nNameError: name 'x' is not defined\n```"),
            None,
            "a block without a language is not code"
        );
    }

    #[test]
    fn an_answer_set_out_in_a_bare_block_is_taken_out_of_it() {
        assert_eq!(answer_in("  ```\n42\n```\n"), "42");
        assert_eq!(answer_in("It is 42."), "It is 42.");
        assert_eq!(
            answer_in("```\na\n```\nand\n```\nb\n```"),
            "```\na\n```\nand\n```\nb\n```"
        );
    }

    fn think(content: &str) -> ThinkReply {
        ThinkReply {
            success: true,
            content: content.into(),
            tokens: 10,
            ..failed_think(ErrorReply::new(ErrorCode::Internal, ""))
        }
    }

    fn ran(stdout: &str, exit_code: i32) -> ExecReply {
        ExecReply {
            stdout: stdout.into(),
            exit_code: Some(exit_code),
            ..ExecReply::default()
        }
    }

    fn request(max_iterations: u32) -> PromptRequest {
        PromptRequest {
            prompt: "sum 1..10".into(),
            max_iterations,
            system: None,
            session: None,
        }
    }

    #[test]
    fn the_last_runs_output_still_gets_an_answer() {
        let (mut prompt, _) = PromptLoop::start(request(1), "s".into(), "");
        assert!(matches!(
            prompt.on_think(&think("```python\nprint(55)\n```")),
            Step::Exec(_)
        ));
        let Step::Think(last) = prompt.on_exec(&ran("55\n", 0)) else {
            panic!("the answer was not asked for");
        };
        let messages = last.messages.unwrap();
        let asked = &messages.last().unwrap().content;
        assert!(asked.contains("answer now"), "{asked}");
        let Step::Done { answered, .. } = prompt.on_think(&think("55")) else {
            panic!("not done");
        };
        assert!(answered);
    }

    #[test]
    fn an_answer_before_any_code_ran_is_sent_back_once_for_code() {
        let (mut prompt, _) = PromptLoop::start(request(3), "s".into(), "");
        let Step::Think(asked) = prompt.on_think(&think("2")) else {
            panic!("a guess was taken as the answer");
        };
        let messages = asked.messages.unwrap();
        assert_eq!(
            messages[messages.len() - 2].content,
            "2",
            "the guess is kept"
        );
        let asked = &messages.last().unwrap().content;
        assert!(asked.contains("No code has run yet"), "{asked}");
        // Asking is not an iteration.
        assert_eq!(prompt.iteration(), 1);
        let (answered, result) = result_of(prompt.on_think(&think("Paris")));
        assert!(answered, "a second answer without code is taken");
        assert_eq!(result["answer"], "Paris");
        assert_eq!(result["iterations"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn an_answer_after_code_ran_is_taken_at_once() {
        let (mut prompt, _) = PromptLoop::start(request(3), "s".into(), "");
        let _ = prompt.on_think(&think("```python\nprint(2 + 2)\n```"));
        let Step::Think(fed) = prompt.on_exec(&ran("4\n", 0)) else {
            panic!("the output went nowhere");
        };
        let messages = fed.messages.unwrap();
        let told = &messages.last().unwrap().content;
        assert!(told.contains("reply with the answer alone"), "{told}");
        let (answered, result) = result_of(prompt.on_think(&think("4")));
        assert!(answered);
        assert_eq!(result["answer"], "4");
    }

    #[test]
    fn failing_code_twice_then_success_then_an_answer() {
        let (mut prompt, first) = PromptLoop::start(request(5), "s".into(), "- tools.x.y");
        let system = &first.messages.unwrap()[0].content;
        assert!(system.contains("- tools.x.y"), "{system}");
        for (attempt, exit_code) in [1, 1, 0].into_iter().enumerate() {
            let code = format!("```python\nprint(55) # attempt {attempt}\n```");
            let Step::Exec(run) = prompt.on_think(&think(&code)) else {
                panic!("no run");
            };
            assert_eq!(run.session.as_deref(), Some("s"));
            let reply = ExecReply {
                tool_calls: 2,
                tool_bytes: 100,
                ..ran("55\n", exit_code)
            };
            assert!(matches!(prompt.on_exec(&reply), Step::Think(_)));
        }
        let Step::Done { answered, result } = prompt.on_think(&think("It is 55.")) else {
            panic!("not done");
        };
        assert!(answered);
        let result: Value = serde_json::from_slice(&result).unwrap();
        assert_eq!(result["answer"], "It is 55.");
        assert_eq!(result["iterations"].as_array().unwrap().len(), 3);
        assert_eq!(result["tokens"], 40);
        assert_eq!(result["tool_calls"], 6);
        assert_eq!(result["tool_bytes"], 300);
    }

    #[test]
    fn a_model_that_always_writes_code_stops_at_max_iterations() {
        let (mut prompt, _) = PromptLoop::start(request(2), "s".into(), "");
        let mut runs = 0;
        let (answered, result) = loop {
            match prompt.on_think(&think("```python\nprint(1)\n```")) {
                Step::Exec(_) => {
                    runs += 1;
                    assert!(matches!(prompt.on_exec(&ran("1\n", 0)), Step::Think(_)));
                }
                Step::Done { answered, result } => break (answered, result),
                Step::Think(_) => panic!("a THINK for a THINK"),
            }
        };
        assert_eq!(runs, 2);
        assert!(!answered);
        let result: Value = serde_json::from_slice(&result).unwrap();
        assert_eq!(result["iterations"].as_array().unwrap().len(), 2);
        assert!(result["error"].as_str().unwrap().contains("max_iterations"));
    }

    fn failed(stderr: &str) -> ExecReply {
        ExecReply {
            stderr: stderr.into(),
            exit_code: Some(1),
            ..ExecReply::default()
        }
    }

    const TRACEBACK: &str = "Traceback (most recent call last):\n  File \"<run>\", line 1\n\
                             NameError: name 'x' is not defined\n";

    fn result_of(step: Step) -> (bool, Value) {
        let Step::Done { answered, result } = step else {
            panic!("not done: {step:?}");
        };
        (answered, serde_json::from_slice(&result).unwrap())
    }

    #[test]
    fn code_that_already_failed_is_not_run_again_and_the_model_is_told_why() {
        let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
        assert!(matches!(
            prompt.on_think(&think("```python\nprint(x)\n```")),
            Step::Exec(_)
        ));
        assert!(matches!(prompt.on_exec(&failed(TRACEBACK)), Step::Think(_)));
        // The same code, give or take blank space around it: not run.
        let Step::Think(nudged) = prompt.on_think(&think("Again:\n```python\n\nprint(x)  \n```"))
        else {
            panic!("the repeated code was run");
        };
        let messages = nudged.messages.unwrap();
        let nudge = &messages.last().unwrap().content;
        assert!(
            nudge.contains(
                "This exact code already failed with: NameError: name 'x' is not defined"
            ),
            "{nudge}"
        );
        assert!(nudge.contains("Change the code"), "{nudge}");
        assert!(!prompt.is_running_code());
        // The nudge is an iteration.
        assert_eq!(prompt.iteration(), 3);
        // Changed code runs.
        assert!(matches!(
            prompt.on_think(&think("```python\nx = 1\nprint(x)\n```")),
            Step::Exec(_)
        ));
        assert!(matches!(prompt.on_exec(&ran("1\n", 0)), Step::Think(_)));
        let (answered, result) = result_of(prompt.on_think(&think("1")));
        assert!(answered);
        let iterations = result["iterations"].as_array().unwrap();
        assert_eq!(iterations.len(), 3);
        assert_eq!(iterations[1]["exit_code"], Value::Null);
        assert!(iterations[1]["stderr"]
            .as_str()
            .unwrap()
            .starts_with("not run: this exact code already failed"));
    }

    #[test]
    fn the_same_failing_code_three_times_in_a_row_ends_the_loop_with_the_reason() {
        let (mut prompt, _) = PromptLoop::start(request(10), "s".into(), "");
        let same = think("```python\nprint(x)\n```");
        assert!(matches!(prompt.on_think(&same), Step::Exec(_)));
        assert!(matches!(prompt.on_exec(&failed(TRACEBACK)), Step::Think(_)));
        assert!(matches!(prompt.on_think(&same), Step::Think(_)), "nudged");
        let (answered, result) = result_of(prompt.on_think(&same));
        assert!(!answered);
        assert_eq!(
            result["error"],
            "the model repeated the same failing code 3 times in a row"
        );
        assert_eq!(result["success"], false);
        assert_eq!(result["iterations"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn going_round_between_failing_blocks_ends_after_the_most_nudges() {
        let (mut prompt, _) = PromptLoop::start(request(20), "s".into(), "");
        let blocks = [
            think("```python\nprint(a)\n```"),
            think("```python\nprint(b)\n```"),
        ];
        for block in &blocks {
            assert!(matches!(prompt.on_think(block), Step::Exec(_)));
            assert!(matches!(
                prompt.on_exec(&failed("NameError")),
                Step::Think(_)
            ));
        }
        for nudge in 0..MOST_NUDGES {
            let block = &blocks[nudge as usize % 2];
            assert!(
                matches!(prompt.on_think(block), Step::Think(_)),
                "nudge {nudge}"
            );
        }
        let (answered, result) = result_of(prompt.on_think(&blocks[MOST_NUDGES as usize % 2]));
        assert!(!answered);
        assert_eq!(
            result["error"],
            format!("the model kept writing code that had already failed ({MOST_NUDGES} nudges)")
        );
    }

    #[test]
    fn code_that_worked_runs_again_but_not_a_third_time_in_a_row() {
        let (mut prompt, _) = PromptLoop::start(request(10), "s".into(), "");
        let same = think("```python\nprint(open('/workspace/state').read())\n```");
        let mut told = Vec::new();
        for _ in 0..2 {
            assert!(matches!(prompt.on_think(&same), Step::Exec(_)));
            let Step::Think(next) = prompt.on_exec(&ran("busy\n", 0)) else {
                panic!("THINK expected");
            };
            let last = next.messages.unwrap().pop().unwrap().content;
            told.push(last.contains("That was the same code as before"));
        }
        // The second run's output comes with a word that it was the same.
        assert_eq!(told, [false, true]);
        let (answered, result) = result_of(prompt.on_think(&same));
        assert!(!answered);
        assert_eq!(
            result["error"],
            "the model repeated the same code 3 times in a row"
        );
    }

    #[test]
    fn a_failure_is_told_by_its_error_else_its_last_line_else_the_exit_code() {
        assert_eq!(failure(&ran("ok", 0)), None);
        assert_eq!(
            failure(&failed(TRACEBACK)).unwrap(),
            "NameError: name 'x' is not defined"
        );
        let timed_out = ExecReply {
            error: Some("the run timed out".into()),
            ..ExecReply::default()
        };
        assert_eq!(failure(&timed_out).unwrap(), "the run timed out");
        assert_eq!(failure(&failed("")).unwrap(), "exit code 1");
        let long = "é".repeat(NUDGE_ERROR_BYTES);
        assert!(failure(&failed(&long)).unwrap().len() <= NUDGE_ERROR_BYTES);
    }
}
