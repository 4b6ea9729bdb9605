//! An MCP server's stderr: logged line by line with its secrets blotted
//! out, each distinct line once however often the server restarts, and
//! read for the line that says why it failed — the error a failed
//! server's summary shows, with its exit status.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Mutex, MutexGuard};

use super::secrets::{truncate_text, Secrets};

/// Bytes of a server's stderr logged per incarnation; the rest is read and
/// dropped.
const LOG_CAP: usize = 64 << 10;
/// Longest error line kept whole.
const ERROR_LINE: usize = 512;
/// Distinct lines remembered as logged; past this, new lines are logged
/// without being remembered (the memory stays bounded).
const REMEMBERED: usize = 4096;

/// What a server's stderr has logged, across its incarnations: a server
/// that fails the same way in a restart loop logs its message once.
#[derive(Debug, Default)]
pub struct StderrLog {
    logged: HashSet<String>,
}

/// How one incarnation of a server ended, as far as is known yet.
#[derive(Debug, Default)]
pub struct Ending {
    /// Which incarnation (the supervisor's number).
    pub incarnation: u64,
    /// How it ended; `None` while it runs (or if it could not be waited
    /// for).
    pub status: Option<ExitStatus>,
    /// Whether the supervisor is done with it (`status` is final).
    pub ended: bool,
    /// Whether its stderr has closed (`error_line` is final).
    pub stderr_closed: bool,
    /// The first line of its stderr that reads as an error, else its last
    /// line that says anything; secrets blotted out.
    pub error_line: String,
}

impl Ending {
    /// A fresh record for incarnation `incarnation`.
    pub fn of(incarnation: u64) -> Ending {
        Ending {
            incarnation,
            ..Ending::default()
        }
    }

    /// Why it ended — its exit status and its error line — once both are
    /// known.
    pub fn describe(&self) -> Option<String> {
        if !(self.ended && self.stderr_closed) {
            return None;
        }
        let how = match self.status {
            Some(status) => match (status.code(), status.signal()) {
                (Some(code), _) => format!("it exited with status {code}"),
                (None, Some(signal)) => format!("it was killed by signal {signal}"),
                (None, None) => "it ended".to_owned(),
            },
            None => "it ended".to_owned(),
        };
        Some(if self.error_line.is_empty() {
            format!("{how}, printing nothing on its stderr")
        } else {
            format!("{how}: {}", self.error_line)
        })
    }
}

/// Locks a record, even one whose holder panicked (it stays consistent:
/// every update is a single assignment or insert).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads a server's stderr until it closes: logs the first [`LOG_CAP`]
/// bytes of it, redacted, skipping lines `log` has logged before (and
/// saying how many it skipped), and keeps its error line in `ending`.
/// Returns how many lines it did not log as repeats.
pub fn read_stderr(
    label: &str,
    stderr: impl Read,
    secrets: &Secrets,
    log: &Mutex<StderrLog>,
    ending: &Mutex<Ending>,
) -> u64 {
    let mut logged = 0;
    let mut repeats = 0u64;
    let mut first_error: Option<String> = None;
    let mut last_meaningful: Option<String> = None;
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // At most one line's worth held, however long the line.
        match (&mut reader)
            .take(LOG_CAP as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let text = secrets.redact(String::from_utf8_lossy(&line).trim_end());
        if text.trim().is_empty() {
            continue;
        }
        if logged < LOG_CAP {
            let mut record = lock(log);
            if record.logged.contains(&text) {
                repeats += 1;
            } else {
                logged += text.len();
                log::info!("{label}: {text}");
                if record.logged.len() < REMEMBERED {
                    record.logged.insert(text.clone());
                }
                if logged >= LOG_CAP {
                    log::info!("{label}: more on its stderr is not logged");
                }
            }
        }
        if first_error.is_none() && reads_as_error(&text) {
            first_error = Some(text);
        } else if says_something(&text) {
            last_meaningful = Some(text);
        }
    }
    if repeats > 0 {
        let lines = if repeats == 1 { "line" } else { "lines" };
        log::info!("{label}: {repeats} more {lines} of its stderr repeated what it printed before; not logged again");
    }
    let mut kept = first_error.or(last_meaningful).unwrap_or_default();
    truncate_text(&mut kept, ERROR_LINE);
    // A cut may have split a secret.
    let kept = secrets.redact(&kept);
    let mut ending = lock(ending);
    ending.error_line = kept;
    ending.stderr_closed = true;
    repeats
}

/// Whether a line reads as an error message: it starts with a word ending
/// in `Error` or `Exception` (`Error [ERR_MODULE_NOT_FOUND]: ...`,
/// `ModuleNotFoundError: ...`, `error: ...`), or is npm's or a fatal
/// error's.
fn reads_as_error(line: &str) -> bool {
    let line = line.trim_start();
    let head = line
        .split([':', ' ', '['])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    head.ends_with("error")
        || head.ends_with("exception")
        || head == "fatal"
        || line.starts_with("npm error")
        || line.starts_with("npm ERR!")
}

/// Whether a line says anything beyond a stack trace's furniture: not
/// only punctuation (`}`, `^`), not a stack frame (`at ...`), not node's
/// version banner.
fn says_something(line: &str) -> bool {
    let line = line.trim();
    line.chars().any(char::is_alphanumeric)
        && !line.starts_with("at ")
        && !line.starts_with("Node.js v")
        && !line.starts_with("node:internal")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, log: &Mutex<StderrLog>) -> String {
        read_counting(text, log).0
    }

    /// The error line and the lines not logged as repeats.
    fn read_counting(text: &str, log: &Mutex<StderrLog>) -> (String, u64) {
        let ending = Mutex::new(Ending::of(1));
        let repeats = read_stderr(
            "mcp-test",
            text.as_bytes(),
            &Secrets::default(),
            log,
            &ending,
        );
        let ending = lock(&ending);
        assert!(ending.stderr_closed);
        (ending.error_line.clone(), repeats)
    }

    #[test]
    fn nodes_missing_module_is_named_not_its_version_banner() {
        let stderr = "node:internal/modules/esm/resolve:873\n  \
                      throw new ERR_MODULE_NOT_FOUND(packageName, fileURLToPath(base), null);\n  \
                      ^\n\n\
                      Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod' imported from /srv/x/dist/index.js\n    \
                      at packageResolve (node:internal/modules/esm/resolve:873:9) {\n  \
                      code: 'ERR_MODULE_NOT_FOUND'\n}\n\nNode.js v20.20.2\n";
        assert_eq!(
            read(stderr, &Mutex::default()),
            "Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'zod' imported from \
             /srv/x/dist/index.js"
        );
    }

    #[test]
    fn pythons_exception_is_named_and_without_one_the_last_words_are() {
        let traceback = "Traceback (most recent call last):\n  File \"/srv/s.py\", line 1, in \
                         <module>\n    import nothing\nModuleNotFoundError: No module named \
                         'nothing'\n";
        assert_eq!(
            read(traceback, &Mutex::default()),
            "ModuleNotFoundError: No module named 'nothing'"
        );
        assert_eq!(
            read("starting\nlistening on stdio\n}\n", &Mutex::default()),
            "listening on stdio"
        );
    }

    #[test]
    fn an_exit_status_and_the_error_line_make_the_error() {
        let mut ending = Ending::of(3);
        ending.error_line = "Error: no key".into();
        ending.stderr_closed = true;
        assert_eq!(ending.describe(), None, "the status is not known yet");
        ending.status = Some(ExitStatus::from_raw(1 << 8));
        ending.ended = true;
        assert_eq!(
            ending.describe().unwrap(),
            "it exited with status 1: Error: no key"
        );
        ending.status = Some(ExitStatus::from_raw(9));
        ending.error_line.clear();
        assert_eq!(
            ending.describe().unwrap(),
            "it was killed by signal 9, printing nothing on its stderr"
        );
    }

    #[test]
    fn a_line_repeated_by_every_restart_is_logged_once() {
        let log = Mutex::default();
        let crash = "Error: boom\n    at main\n}\n";
        assert_eq!(read_counting(crash, &log), ("Error: boom".into(), 0));
        for _ in 0..3 {
            assert_eq!(read_counting(crash, &log), ("Error: boom".into(), 3));
        }
        assert_eq!(read_counting("Error: other\n", &log).1, 0);
        assert_eq!(lock(&log).logged.len(), 4);
    }
}
