//! The prompt-to-program loop of a `prompt` task, as a state machine the
//! kernel drives: THINK is told the task and the tools there are, and
//! answers with a fenced ```python (or ```bash) block; the code runs with
//! EXEC in the task's own session; its output (capped) or its error goes
//! back to THINK; until THINK answers without code — its answer — or the
//! iterations are spent. An answer is `checked` only when the last run
//! worked and printed, and the answer states no number no run printed;
//! otherwise the result says why it is not.

use agentos_proto::payload::{
    ChatMessage, ExecReply, ExecRequest, Language, PromptIteration, PromptRequest, PromptResult,
    ThinkReply, ThinkRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::Answer;
use checked::{ask_for_code, Unchecked};
use code::{answer_in, code_block, unfenced_code, with_blocks_closed, Block, Code};
use feedback::failure;

mod checked;
mod code;
mod feedback;

/// What THINK is told first, before the tools and the task's own system
/// text: short, for a small model's context.
const SYSTEM: &str = "You solve the user's task by writing code that the AgentOS kernel runs \
     for you.\n\
     To run code, reply with one fenced ```python block (or ```bash); you get back what it \
     printed. Do what the task says in its order, one block per step, and run code it gives \
     as given. When a run has printed \
     what answers the task, reply with the answer alone, in one short sentence, without a code \
     block.\n\
     The code runs in a sandbox: Python 3 with only the standard library (no pandas, numpy or \
     sympy). print() what you need to see, briefly (a count, not thousands of lines); a last \
     bare expression is printed too. Files in /workspace and your Python variables stay from \
     one code block to the next. If code fails, read the error and fix the code.";

/// Said after the task itself. Told only the system text, a small model
/// answers most tasks at once from memory (Qwen2.5-Coder-1.5B: code first
/// for 4 of 23 tasks); with this after the task, it writes code first
/// (23 of 23), and without comments, fewer tokens. Asked for more —
/// "code only", "short code" — the 0.5B model writes the same code again
/// after its output, or code too short to compute anything (`print(20)`
/// for 20 factorial).
const CODE_FIRST: &str = "\n\n(Reply with the code first, without comments.)";
/// Where THINK's reply ends early: a closing fence and a blank line, after
/// which models sum up the code, or guess what it will print, at the
/// cost of a local model's tens of tokens a second.
const END_OF_BLOCK: &str = "```\n\n";

/// How the sandbox's `not_code` begins when the code does not parse.
const NOT_PYTHON: &str = "not Python:";

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

/// What the kernel should do next for a prompt task.
#[derive(Debug)]
pub enum Step {
    /// Ask THINK.
    Think(ThinkRequest),
    /// Run the code THINK wrote (boxed: far larger than the rest).
    Exec(Box<ExecRequest>),
    /// The loop is over: the task's state is `completed` (an answer) or
    /// `failed`, with this result.
    Done {
        /// Whether THINK answered.
        answered: bool,
        /// The result (JSON).
        result: Vec<u8>,
    },
}

/// A prompt task's loop.
#[derive(Debug)]
pub struct PromptLoop {
    request: PromptRequest,
    /// The EXEC session its code runs in.
    session: String,
    messages: Vec<ChatMessage>,
    /// The result so far: the rounds run and the tokens and tool use they
    /// cost. It is written as it stands when the loop ends, answered or
    /// not.
    result: PromptResult,
    /// The block under way, and the reply it came in (which is the
    /// answer if the block turns out not to be code).
    running: Option<(Block, String)>,
    /// How the last run went.
    last_run: LastRun,
    /// Whether an answer was sent back for code since the last run.
    sent_back: bool,
    /// Code that ran and failed, normalised, with the short error it
    /// failed with.
    failed: Vec<(Code, String)>,
    /// The last code THINK wrote, and how many times in a row it wrote it.
    last_code: Option<(Code, usize)>,
    /// Nudges given so far.
    nudges: u32,
}

/// How the loop's last run went, for what an answer after it is worth.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LastRun {
    /// No code has run.
    None,
    /// It failed, with this short error.
    Failed(String),
    /// It worked and printed nothing.
    Silent,
    /// It worked and printed something.
    Printed,
}

impl PromptLoop {
    /// A loop for `request`, whose code runs in `session`; `tools` lists
    /// the tools there are, a line each. Its first step is this THINK.
    pub fn start(
        request: PromptRequest,
        session: String,
        tools: &str,
    ) -> (PromptLoop, ThinkRequest) {
        let mut system = SYSTEM.to_owned();
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
                content: format!("{}{CODE_FIRST}", request.prompt),
            },
        ];
        let prompt = PromptLoop {
            request,
            session,
            messages,
            result: PromptResult::default(),
            running: None,
            last_run: LastRun::None,
            sent_back: false,
            failed: Vec::new(),
            last_code: None,
            nudges: 0,
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
        (self.result.iterations.len() as u32 + 1).min(self.request.max_iterations)
    }

    /// THINK's reply: code to run, or the answer.
    pub fn on_think(&mut self, reply: &ThinkReply) -> Step {
        self.result.tokens += reply.tokens;
        if !reply.success {
            let why = reply.error.as_deref().unwrap_or("THINK failed");
            return self.done(None, Some(format!("THINK failed: {why}")));
        }
        // A reply cut at END_OF_BLOCK lacks its closing fence.
        let content = with_blocks_closed(reply.content.clone());
        self.messages.push(ChatMessage {
            role: "assistant".into(),
            content: content.clone(),
        });
        match code_block(&content).or_else(|| unfenced_code(&content)) {
            Some(block) => self.on_code(block, content),
            None => self.on_answer_text(&content),
        }
    }

    /// A reply without code to run: the answer, unless it is unchecked
    /// and sent back once for code (nothing has run yet; the last run
    /// failed or printed nothing; or the answer states a number no run
    /// printed), and more code may run.
    fn on_answer_text(&mut self, content: &str) -> Step {
        let answer = answer_in(content).to_owned();
        let unchecked = self.why_unchecked(&answer);
        if let (Some(why), true, false) = (&unchecked, self.may_run(), self.sent_back) {
            self.sent_back = true;
            self.messages.push(ChatMessage {
                role: "user".into(),
                content: ask_for_code(why),
            });
            return self.think();
        }
        self.result.checked = unchecked.is_none();
        self.result.unchecked_reason = unchecked.map(|why| why.to_string());
        self.done(Some(&answer), None)
    }

    /// Why `answer` is not checked, or `None` if it is.
    fn why_unchecked(&self, answer: &str) -> Option<Unchecked> {
        match &self.last_run {
            LastRun::None => return Some(Unchecked::NothingRan),
            LastRun::Failed(error) => return Some(Unchecked::Failed(error.clone())),
            LastRun::Silent => return Some(Unchecked::Silent),
            LastRun::Printed => {}
        }
        let printed: Vec<&str> = self
            .result
            .iterations
            .iter()
            .filter(|i| i.exit_code == Some(0))
            .map(|i| i.stdout.as_str())
            .collect();
        checked::unprinted_number(answer, &printed, &self.request.prompt).map(Unchecked::Unprinted)
    }

    /// A block to run, unless it is the same as before or already failed.
    fn on_code(&mut self, block: Block, content: String) -> Step {
        if !self.may_run() {
            return self.done(
                None,
                Some(format!(
                    "THINK still wrote code after {} iterations (max_iterations)",
                    self.request.max_iterations
                )),
            );
        }
        let this = Code::new(&block.language, &block.code);
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
            return self.nudge(block.language, block.code, &error);
        }
        let python = block.language != "bash";
        let run = ExecRequest {
            code: block.code.clone(),
            language: if python {
                Language::Python
            } else {
                Language::Bash
            },
            session: Some(self.session.clone()),
            timeout_ms: Some(RUN_TIMEOUT_MS),
            print_last_expression: python,
            // A model also sets out its answer as code (`3.0`, a dict it
            // made up): the sandbox says so rather than run it.
            skip_if_not_code: python,
            ..ExecRequest::default()
        };
        self.running = Some((block, content));
        Step::Exec(Box::new(run))
    }

    /// Code that already failed is not run again: THINK is told so, and
    /// the iteration is spent as if it had run.
    fn nudge(&mut self, language: String, code: String, error: &str) -> Step {
        self.nudges += 1;
        self.result.iterations.push(PromptIteration {
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

    /// Whether an iteration is left for more code.
    fn may_run(&self) -> bool {
        (self.result.iterations.len() as u32) < self.request.max_iterations
    }

    /// After the last iteration, THINK is asked for its answer.
    fn last_iteration_note(&self, feedback: &mut String) {
        if !self.may_run() {
            // The last run's output still gets its answer.
            feedback.push_str("\nNo more code can run: answer now, without a code block.");
        }
    }

    /// EXEC's reply for the code under way: fed back to THINK, or the end
    /// when the iterations are spent. A block the sandbox found only
    /// states values, or a bare block that is not Python, was the reply's
    /// text: an answer, and no iteration.
    pub fn on_exec(&mut self, reply: &ExecReply) -> Step {
        let Some((block, content)) = self.running.take() else {
            return self.done(None, Some("EXEC answered with no code running".into()));
        };
        if let Some(why) = &reply.not_code {
            let unparsable = why.starts_with(NOT_PYTHON);
            if block.untagged || !unparsable {
                // Text after all (a bare block that is not Python, or only
                // values set out as code), and no iteration.
                self.last_code = None;
                return self.on_answer_text(&content);
            }
            // A block marked Python that does not parse is code to fix.
            let error = why.trim_start_matches(NOT_PYTHON).trim().to_owned();
            let failed = ExecReply {
                stderr: format!("{error}\n"),
                error: Some(error),
                exit_code: Some(1),
                ..reply.clone()
            };
            return self.on_exec_ran(block, &failed);
        }
        self.on_exec_ran(block, reply)
    }

    /// A run's reply, fed back.
    fn on_exec_ran(&mut self, block: Block, reply: &ExecReply) -> Step {
        self.result.tool_calls += reply.tool_calls;
        self.result.tool_bytes += reply.tool_bytes;
        let iteration = PromptIteration {
            code: block.code,
            language: block.language,
            stdout: reply.stdout.clone(),
            stderr: reply.stderr.clone(),
            exit_code: reply.exit_code.map(i64::from),
        };
        let mut feedback = feedback::of_run(reply);
        self.sent_back = false;
        if let Some(error) = failure(reply) {
            let code = Code::new(&iteration.language, &iteration.code);
            self.failed.push((code, error.clone()));
            self.last_run = LastRun::Failed(error);
        } else if reply.stdout.trim().is_empty() {
            self.last_run = LastRun::Silent;
        } else {
            self.last_run = LastRun::Printed;
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
        self.result.iterations.push(iteration);
        if self.may_run() && matches!(self.last_run, LastRun::Failed(_)) {
            feedback.push_str("\nReply with one ```python block of fixed code.");
        }
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
            stop: vec![END_OF_BLOCK.to_owned()],
            ..ThinkRequest::default()
        }
    }

    /// The loop ends with `answer`, or without one because of `error`.
    /// The result is written in place, not moved out: the task's last
    /// iteration is read from its rounds after the end.
    fn done(&mut self, answer: Option<&str>, error: Option<String>) -> Step {
        self.result.success = answer.is_some();
        self.result.answer = answer.map(str::to_owned);
        self.result.error = error;
        Step::Done {
            answered: self.result.success,
            result: serde_json::to_vec(&self.result).unwrap_or_default(),
        }
    }
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
mod tests;
