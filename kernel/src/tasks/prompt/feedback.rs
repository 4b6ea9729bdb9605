//! What THINK is told of a run: what it printed (a long output cut to its
//! start and end), and, when it failed, its traceback and a hint for the
//! mistakes small models make over and over; and why it failed in a line
//! (which a nudge quotes).

use agentos_proto::payload::ExecReply;

/// Lines of a run's output shown whole; a longer output is cut.
const SHOWN_LINES: usize = 24;
/// Bytes of a run's output shown whole; a longer output is cut.
const SHOWN_BYTES: usize = 1536;
/// Lines shown from the start, and from the end, of an output that is cut.
const HEAD_LINES: usize = 12;
const TAIL_LINES: usize = 6;
/// Bytes of one line shown at most.
const LINE_BYTES: usize = 240;
/// Bytes of a failed run's stderr fed back (the end of a traceback).
const STDERR_BYTES: usize = 2048;
/// Bytes of a failed run's error quoted in a nudge.
pub const NUDGE_ERROR_BYTES: usize = 300;

/// What THINK is told of the run `reply` answers. A run that worked:
/// what it printed, or that it printed nothing. One that failed: its
/// output, the end of its traceback, and a hint when the error is one a
/// small model repeats.
pub fn of_run(reply: &ExecReply) -> String {
    let exit_code = reply
        .exit_code
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    let failed = failure(reply);
    let mut told = match failed {
        None => format!("Your code ran (exit code {exit_code})."),
        Some(_) => format!("Your code failed (exit code {exit_code})."),
    };
    if !reply.stdout.trim().is_empty() {
        told.push_str(&format!("\nstdout:\n{}", shown(&reply.stdout)));
    } else if failed.is_none() {
        told.push_str(
            "\nYour code printed nothing. print() what you need to see, or end with the \
             expression whose value you need.",
        );
    }
    if !reply.stderr.trim().is_empty() {
        told.push_str(&format!("\nstderr:\n{}", tail(&reply.stderr, STDERR_BYTES)));
    } else if let Some(why) = &failed {
        told.push_str(&format!("\nerror: {why}"));
    }
    if let Some(hint) = failed.as_deref().and_then(hint) {
        told.push('\n');
        told.push_str(&hint);
    }
    told
}

/// What to do about an error a small model otherwise repeats: told only
/// that `import pandas` failed, it writes `import pandas` again.
fn hint(error: &str) -> Option<String> {
    // `from tools import time_convert_time`, `from tools.time import ...`.
    let from_tools = (error.starts_with("ImportError: cannot import name")
        && error.contains("from 'tools'"))
        || error.starts_with("ModuleNotFoundError: No module named 'tools.");
    if from_tools {
        return Some(
            "A tool is called as tools.<server>.<tool>(...), as listed; no other name is \
             imported from tools."
                .to_owned(),
        );
    }
    let module = error.strip_prefix("ModuleNotFoundError: No module named '")?;
    let module = module.split(['\'', '.']).next().unwrap_or(module);
    Some(format!(
        "Only Python's standard library is installed, not {module}: rewrite the code with it \
         (csv, statistics, math and json are there)."
    ))
}

/// Why a run failed, short — EXEC's error (a Python exception's last
/// line: `NameError: name 'x' is not defined`), else the last line of its
/// stderr, else its exit code — or `None` if it did not fail.
pub fn failure(reply: &ExecReply) -> Option<String> {
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

/// A run's output as THINK is shown it: whole when short; else its first
/// and last lines, each cut to [`LINE_BYTES`], and how many lines are
/// left out between. A small model reads its prompt at tens of tokens a
/// second, and answers a count by reading a long output, not computing.
pub fn shown(output: &str) -> String {
    let lines: Vec<&str> = output.trim_end_matches('\n').lines().collect();
    if lines.len() <= SHOWN_LINES && output.len() <= SHOWN_BYTES {
        return output.to_owned();
    }
    let cut = |line: &str| {
        let kept = head(line, LINE_BYTES);
        if kept.len() < line.len() {
            format!("{kept} [… {} more bytes]", line.len() - kept.len())
        } else {
            kept.to_owned()
        }
    };
    let (start, end) = if lines.len() > HEAD_LINES + TAIL_LINES {
        (&lines[..HEAD_LINES], &lines[lines.len() - TAIL_LINES..])
    } else {
        (&lines[..], &lines[..0])
    };
    let mut shown: Vec<String> = start.iter().map(|line| cut(line)).collect();
    let left_out = lines.len() - start.len() - end.len();
    if left_out > 0 {
        shown.push(format!(
            "[… {left_out} lines not shown: print only what answers the task …]"
        ));
    }
    shown.extend(end.iter().map(|line| cut(line)));
    shown.join("\n") + "\n"
}

/// The last `bytes` of `text` at most, at a character boundary.
fn tail(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
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
