use serde_json::Value;

use super::feedback::NUDGE_ERROR_BYTES;
use super::*;

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
        nudge.contains("This exact code already failed with: NameError: name 'x' is not defined"),
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

fn run_request(step: Step) -> ExecRequest {
    let Step::Exec(run) = step else {
        panic!("no run: {step:?}");
    };
    *run
}

#[test]
fn python_runs_print_their_last_expression_and_bare_blocks_run_only_if_code() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let python = run_request(prompt.on_think(&think("```python\nsum(range(11))\n```")));
    assert!(python.print_last_expression && python.skip_if_not_code);
    let _ = prompt.on_exec(&ran("55\n", 0));
    let bash = run_request(prompt.on_think(&think("```bash\nls\n```")));
    assert!(!bash.print_last_expression && !bash.skip_if_not_code);
    let _ = prompt.on_exec(&ran("a\n", 0));
    let bare = run_request(prompt.on_think(&think("```\nprint(open('a').read())\n```")));
    assert_eq!(bare.language, Language::Python);
    assert!(bare.print_last_expression && bare.skip_if_not_code);
    let _ = prompt.on_exec(&ran("a\n", 0));
    let shell = run_request(prompt.on_think(&think("```\n#!/bin/bash\nls\n```")));
    assert_eq!(shell.language, Language::Bash);
    assert!(!shell.skip_if_not_code);
}

#[test]
fn a_bare_block_the_sandbox_finds_is_not_code_is_the_answer_and_no_iteration() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nprint(6 * 7)\n```")));
    let _ = prompt.on_exec(&ran("42\n", 0));
    let reply = "The answer:\n```\n42\n```";
    let _ = run_request(prompt.on_think(&think(reply)));
    let not_code = ExecReply {
        not_code: Some("it only states values: nothing in it runs".into()),
        exit_code: Some(0),
        ..ExecReply::default()
    };
    let (answered, result) = result_of(prompt.on_exec(&not_code));
    assert!(answered);
    assert_eq!(result["answer"], reply);
    assert_eq!(result["iterations"].as_array().unwrap().len(), 1);
    assert_eq!(result["checked"], true, "{result}");
}

#[test]
fn a_run_that_printed_nothing_is_said_so_and_an_answer_after_it_is_sent_back_once() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nx = 55\n```")));
    let Step::Think(fed) = prompt.on_exec(&ran("", 0)) else {
        panic!("the run went nowhere");
    };
    let told = fed.messages.unwrap().pop().unwrap().content;
    assert!(told.contains("Your code printed nothing"), "{told}");
    let Step::Think(sent_back) = prompt.on_think(&think("55")) else {
        panic!("an answer after a silent run was taken");
    };
    let asked = sent_back.messages.unwrap().pop().unwrap().content;
    assert!(
        asked.contains("printed nothing") && asked.contains("```python"),
        "{asked}"
    );
    let (answered, result) = result_of(prompt.on_think(&think("55")));
    assert!(answered, "a second answer is taken");
    assert_eq!(result["checked"], false);
    assert_eq!(
        result["unchecked_reason"],
        "the last run printed nothing for the answer to come from"
    );
}

#[test]
fn an_answer_after_a_failed_run_is_sent_back_with_the_error_then_taken_unchecked() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nimport pandas\n```")));
    let _ = prompt.on_exec(&failed("ModuleNotFoundError: No module named 'pandas'"));
    let Step::Think(sent_back) = prompt.on_think(&think("ModuleNotFoundError")) else {
        panic!("the error text was taken as the answer");
    };
    let asked = sent_back.messages.unwrap().pop().unwrap().content;
    assert!(
        asked.contains("failed with: ModuleNotFoundError: No module named 'pandas'")
            && asked.contains("fixed code"),
        "{asked}"
    );
    let (answered, result) = result_of(prompt.on_think(&think("The mean is 6.")));
    assert!(answered);
    assert_eq!(result["checked"], false);
    let reason = result["unchecked_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the last run failed (ModuleNotFoundError"),
        "{reason}"
    );
}

#[test]
fn a_fixed_run_after_a_failure_makes_the_answer_checked_again() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nprint(x)\n```")));
    let _ = prompt.on_exec(&failed(TRACEBACK));
    let _ = run_request(prompt.on_think(&think("```python\nx = 55\nprint(x)\n```")));
    let _ = prompt.on_exec(&ran("55\n", 0));
    let (answered, result) = result_of(prompt.on_think(&think("55")));
    assert!(answered);
    assert_eq!(result["checked"], true, "{result}");
    assert!(result.get("unchecked_reason").is_none());
}

#[test]
fn an_answer_stating_a_number_no_run_printed_is_sent_back_once_then_unchecked() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nprint(open('n').read())\n```")));
    let _ = prompt.on_exec(&ran("3\n11\n19\n", 0));
    let Step::Think(sent_back) = prompt.on_think(&think("The file has 4 lines.")) else {
        panic!("a number no run printed was taken at once");
    };
    let asked = sent_back.messages.unwrap().pop().unwrap().content;
    assert!(
        asked.contains("Your answer states 4, which your code did not print")
            && asked.contains("```python"),
        "{asked}"
    );
    let (answered, result) = result_of(prompt.on_think(&think("The file has 4 lines.")));
    assert!(answered);
    assert_eq!(result["checked"], false);
    assert_eq!(
        result["unchecked_reason"],
        "the answer states 4, which no run printed"
    );
}

#[test]
fn an_answer_with_no_run_at_all_is_unchecked() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    assert!(matches!(prompt.on_think(&think("Paris")), Step::Think(_)));
    let (answered, result) = result_of(prompt.on_think(&think("Paris")));
    assert!(answered);
    assert_eq!(result["checked"], false);
    assert_eq!(
        result["unchecked_reason"],
        "no code ran: the answer is the model's own"
    );
}

#[test]
fn the_system_text_says_what_is_installed_how_to_print_and_what_lasts() {
    let (_, first) = PromptLoop::start(request(5), "s".into(), "");
    let system = &first.messages.unwrap()[0].content;
    for told in [
        "only the standard library",
        "print()",
        "last bare expression",
        "/workspace",
        "one block per step",
    ] {
        assert!(system.contains(told), "{told}: {system}");
    }
    assert!(system.len() < 900, "{} bytes", system.len());
}

fn not_code(why: &str) -> ExecReply {
    ExecReply {
        not_code: Some(why.into()),
        exit_code: Some(0),
        success: true,
        ..ExecReply::default()
    }
}

#[test]
fn values_set_out_as_a_python_block_are_an_answer_not_a_run() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\n{'content': 'made up'}\n```")));
    let Step::Think(sent_back) =
        prompt.on_exec(&not_code("it only states values: nothing in it runs"))
    else {
        panic!("values the model made up were taken as a run");
    };
    let asked = sent_back.messages.unwrap().pop().unwrap().content;
    assert!(asked.contains("No code has run yet"), "{asked}");
    assert_eq!(prompt.iteration(), 1, "not an iteration");
    let _ = run_request(prompt.on_think(&think("```python\n3.0\n```")));
    let (answered, result) =
        result_of(prompt.on_exec(&not_code("it only states values: nothing in it runs")));
    assert!(answered);
    assert_eq!(result["answer"], "3.0", "out of its fence");
    assert_eq!(result["checked"], false);
    assert_eq!(result["iterations"].as_array().unwrap().len(), 0);
}

#[test]
fn a_python_block_that_does_not_parse_is_a_failed_run_to_fix() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let _ = run_request(prompt.on_think(&think("```python\nprint(1\n```")));
    let why = "not Python: SyntaxError: '(' was never closed (<exec>, line 1)";
    let Step::Think(fed) = prompt.on_exec(&not_code(why)) else {
        panic!("the syntax error went nowhere");
    };
    let told = fed.messages.unwrap().pop().unwrap().content;
    assert!(
        told.contains("Your code failed (exit code 1)")
            && told.contains("SyntaxError: '(' was never closed")
            && told.ends_with("Reply with one ```python block of fixed code."),
        "{told}"
    );
    assert!(!told.contains("printed nothing"), "{told}");
    assert_eq!(prompt.iteration(), 2, "an iteration");
    let Step::Think(sent_back) = prompt.on_think(&think("1")) else {
        panic!("an answer after a failed run was taken");
    };
    let asked = sent_back.messages.unwrap().pop().unwrap().content;
    assert!(asked.contains("failed with: SyntaxError"), "{asked}");
}

#[test]
fn a_missing_module_is_answered_with_what_is_installed() {
    let reply = ExecReply {
        error: Some("ModuleNotFoundError: No module named 'pandas'".into()),
        exit_code: Some(1),
        ..ExecReply::default()
    };
    let told = feedback::of_run(&reply);
    assert!(
        told.contains("Only Python's standard library is installed, not pandas"),
        "{told}"
    );
    assert!(!feedback::of_run(&failed("NameError")).contains("standard library"));
}

#[test]
fn a_name_imported_from_tools_is_answered_with_how_tools_are_called() {
    let told = feedback::of_run(&failed(
        "Traceback (most recent call last):\nImportError: cannot import name 'time_convert_time' \
         from 'tools' (/tools/tools.py)\n",
    ));
    assert!(told.contains("tools.<server>.<tool>(...)"), "{told}");
    let submodule = feedback::of_run(&failed(
        "ModuleNotFoundError: No module named 'tools.time'; 'tools' is not a package\n",
    ));
    assert!(
        submodule.contains("tools.<server>.<tool>(...)") && !submodule.contains("standard library"),
        "{submodule}"
    );
    let other = failed("ImportError: cannot import name 'x' from 'json'\n");
    assert!(!feedback::of_run(&other).contains("tools.<server>"));
}

#[test]
fn a_long_output_is_shown_by_its_start_and_end() {
    let short = "1\n2\n3\n";
    assert_eq!(feedback::shown(short), short);
    let long: String = (1..=100).map(|n| format!("{n}\n")).collect();
    let shown = feedback::shown(&long);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 12 + 1 + 6, "{shown}");
    assert_eq!((lines[0], lines[11], lines[18]), ("1", "12", "100"));
    assert!(lines[12].contains("82 lines not shown"), "{shown}");
    let wide = format!("{}\n", "é".repeat(2000));
    let shown = feedback::shown(&wide);
    assert!(
        shown.len() < 400 && shown.contains("more bytes]"),
        "{shown}"
    );
    let told = feedback::of_run(&ran(&long, 0));
    assert!(told.contains("82 lines not shown"), "{told}");
}

#[test]
fn the_task_asks_for_code_first_and_a_reply_ends_with_its_block() {
    let (mut prompt, first) = PromptLoop::start(request(5), "s".into(), "");
    let messages = first.messages.as_ref().unwrap();
    assert!(
        messages[1].content.starts_with("sum 1..10") && messages[1].content.ends_with(CODE_FIRST),
        "{}",
        messages[1].content
    );
    assert_eq!(first.stop, [END_OF_BLOCK]);
    // Cut at END_OF_BLOCK: the block is run, and the history shows it
    // closed.
    let run = run_request(prompt.on_think(&think("```python\nprint(4)")));
    assert_eq!(run.code, "print(4)");
    let Step::Think(next) = prompt.on_exec(&ran("4\n", 0)) else {
        panic!("the run's output went nowhere");
    };
    assert_eq!(next.stop, [END_OF_BLOCK]);
    let history = next.messages.unwrap();
    assert_eq!(history[2].content, "```python\nprint(4)\n```");
}

#[test]
fn code_written_without_a_fence_runs_and_prose_that_does_not_parse_is_the_answer() {
    let (mut prompt, _) = PromptLoop::start(request(5), "s".into(), "");
    let run = run_request(prompt.on_think(&think("print(30 + 4321)")));
    assert_eq!(run.code, "print(30 + 4321)");
    assert!(
        run.skip_if_not_code,
        "the sandbox decides whether it is code"
    );
    let _ = prompt.on_exec(&ran("4351\n", 0));
    let reply = "print(x) shows 4351.";
    let _ = run_request(prompt.on_think(&think(reply)));
    let (answered, result) = result_of(prompt.on_exec(&not_code(NOT_PYTHON)));
    assert!(answered);
    assert_eq!(result["answer"], reply);
    assert_eq!(result["iterations"].as_array().unwrap().len(), 1);
    assert_eq!(result["checked"], true, "{result}");
}
