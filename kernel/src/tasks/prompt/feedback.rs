//! What THINK is told of a run: the tail of what it printed, its error,
//! and, when it failed, why in a line (which a nudge quotes).

use agentos_proto::payload::ExecReply;

/// Bytes of a run's stdout and of its stderr fed back to THINK.
const FEEDBACK_BYTES: usize = 4096;
/// Bytes of a failed run's error quoted in a nudge.
pub const NUDGE_ERROR_BYTES: usize = 300;

/// What THINK is told of the run `reply` answers: its exit code, the tail
/// of its stdout (or that it printed nothing) and, if any, of its stderr,
/// and its error.
pub fn of_run(reply: &ExecReply) -> String {
    let exit_code = reply
        .exit_code
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    let mut feedback = format!("Your code ran (exit code {exit_code}).");
    if reply.stdout.trim().is_empty() {
        feedback.push_str(
            "\nYour code printed nothing. print() what you need to see, or end with the \
             expression whose value you need.",
        );
    } else {
        feedback.push_str(&format!("\nstdout:\n{}", tail(&reply.stdout)));
    }
    if !reply.stderr.is_empty() {
        feedback.push_str(&format!("\nstderr:\n{}", tail(&reply.stderr)));
    }
    if let Some(error) = &reply.error {
        feedback.push_str(&format!("\nerror: {error}"));
        if error.starts_with("ModuleNotFoundError") {
            // Small models reach for pandas and numpy first, and write the
            // same import again when told only that it failed.
            feedback
                .push_str("\nOnly the standard library is installed: do it without that module.");
        }
    }
    feedback
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
