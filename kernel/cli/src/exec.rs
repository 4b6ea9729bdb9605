//! `agentos exec`: run code in a fresh sandbox (or a session's), print
//! what it printed and exit with its exit code.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentos_proto::payload::{ExecReply, ExecRequest, Language};
use agentos_proto::{Client, ErrorReply, Opcode};
use serde::Deserialize;

use crate::error::CliError;
use crate::failure::usage;
use crate::input::{millis, words_or_stdin};
use crate::policy::PolicyArgs;
use crate::raw::Raw;
use crate::volumes::VolumeArgs;

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The code (its words are joined by spaces); `-` reads it from stdin
    #[arg(
        required_unless_present = "file",
        conflicts_with = "file",
        allow_hyphen_values = true
    )]
    code: Vec<String>,
    /// Run the code in this file: bash if its name ends in .sh or .bash
    /// (or with --bash), else Python
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Run it in this session's interpreter and /workspace
    #[arg(short, long)]
    session: Option<String>,
    /// Start from this template (agentos template ls lists them)
    #[arg(long)]
    template: Option<String>,
    #[command(flatten)]
    pub volumes: VolumeArgs,
    /// The code is bash, not Python
    #[arg(long)]
    bash: bool,
    /// The run's own wall-clock limit, in seconds, enforced by the kernel
    /// [default: the kernel's]; the global --timeout is how long this
    /// command waits for the reply
    #[arg(long, value_name = "SECS")]
    pub run_timeout: Option<f64>,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// An EXEC reply: the kernel's refusal (it has a `code`), or the run's
/// own reply, which says `success: false` when the code failed.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Outcome {
    Refused(ErrorReply),
    Ran(Box<ExecReply>),
}

impl ExecArgs {
    /// Refuses code that is only the name of a file here: `agentos exec
    /// hello.py` would run the words `hello.py` as Python, which is never
    /// what was meant. Code with a space or a line break is code.
    pub fn check_code(&self) -> Result<(), CliError> {
        if let [word] = self.code.as_slice() {
            if word != "-" && !word.contains(char::is_whitespace) && Path::new(word).is_file() {
                return Err(usage(format!(
                    "`{word}` is a file here; to run its contents use --file {word}"
                )));
            }
        }
        Ok(())
    }

    /// The EXEC request: the code from the command line, stdin or the
    /// file.
    fn request(self) -> Result<ExecRequest, CliError> {
        let (code, bash) = match &self.file {
            Some(path) => {
                let code =
                    std::fs::read_to_string(path).map_err(|error| CliError::ReadingFile {
                        path: path.clone(),
                        error,
                    })?;
                (code, self.bash || is_shell_script(path))
            }
            None => (words_or_stdin(&self.code)?, self.bash),
        };
        Ok(ExecRequest {
            code,
            language: if bash {
                Language::Bash
            } else {
                Language::Python
            },
            session: self.session,
            template: self.template,
            volumes: self.volumes.mounts(),
            timeout_ms: self.run_timeout.map(millis),
            network: self.policy.network(),
            ..ExecRequest::default()
        })
    }
}

/// Whether a file's name says it is a shell script.
fn is_shell_script(path: &Path) -> bool {
    path.extension()
        .is_some_and(|extension| extension == "sh" || extension == "bash")
}

pub fn exec(client: &mut Client, args: ExecArgs, json: bool) -> Result<ExitCode, CliError> {
    let request = args.request()?;
    let reply = client.call(Opcode::EXEC, &serde_json::to_vec(&request)?)?;
    let raw = Raw::parse(&reply.payload)?;
    if json {
        raw.print()?;
    }
    let reply = match raw.decode::<Outcome>()? {
        Outcome::Refused(refusal) => return Err(CliError::Refused(refusal)),
        Outcome::Ran(reply) => reply,
    };
    if !json {
        print!("{}", reply.stdout);
        eprint!("{}", reply.stderr);
        if reply.tool_calls > 0 {
            // What programmatic tool calling saved: tool results stayed in
            // the sandbox, only the output came back.
            let returned = reply.stdout.len() + reply.stderr.len();
            eprintln!(
                "agentos: {} tool calls brought {} bytes into the run; {returned} bytes came \
                 back",
                reply.tool_calls, reply.tool_bytes
            );
        }
        if reply.timed_out {
            eprintln!("agentos: {}", reply.error.as_deref().unwrap_or("timed out"));
        }
    }
    let status = match (reply.exit_code, reply.signal) {
        (Some(code), _) => i64::from(code),
        (None, Some(signal)) => 128 + i64::from(signal),
        (None, None) => 1,
    };
    Ok(ExitCode::from(u8::try_from(status & 0xff).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        exec: ExecArgs,
    }

    fn parsed(args: &[&str]) -> ExecArgs {
        Line::try_parse_from(std::iter::once("exec").chain(args.iter().copied()))
            .expect("a valid command line")
            .exec
    }

    fn in_dir(dir: &Path, file: &str) -> String {
        dir.join(file).display().to_string()
    }

    #[test]
    fn file_runs_the_files_code_in_the_language_its_name_says() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("hello.py"), "print('hi')\n").expect("written");
        std::fs::write(dir.path().join("hello.sh"), "echo hi\n").expect("written");
        let python = parsed(&["--file", &in_dir(dir.path(), "hello.py")])
            .request()
            .expect("a request");
        assert_eq!(
            (python.code.as_str(), python.language),
            ("print('hi')\n", Language::Python)
        );
        let bash = parsed(&["--file", &in_dir(dir.path(), "hello.sh")])
            .request()
            .expect("a request");
        assert_eq!(
            (bash.code.as_str(), bash.language),
            ("echo hi\n", Language::Bash)
        );
        let forced = parsed(&["--bash", "--file", &in_dir(dir.path(), "hello.py")])
            .request()
            .expect("a request");
        assert_eq!(forced.language, Language::Bash);
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let missing = in_dir(dir.path(), "missing.py");
        let err = parsed(&["--file", &missing]).request().unwrap_err();
        assert!(err.to_string().contains(&missing), "{err}");
        assert!(!err.is_usage());
    }

    #[test]
    fn each_volume_given_is_mounted_by_the_run() {
        let request = parsed(&[
            "--volume",
            "data:/data",
            "--volume",
            "refs:/mnt/refs:ro",
            "print(1)",
        ])
        .request()
        .expect("a request");
        let mounts: Vec<(&str, &str, bool)> = request
            .volumes
            .iter()
            .map(|m| (m.name.as_str(), m.path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [("data", "/data", false), ("refs", "/mnt/refs", true)]
        );
        assert!(Line::try_parse_from(["exec", "--volume", "data", "print(1)"]).is_err());
    }

    #[test]
    fn code_and_file_go_one_at_a_time() {
        assert!(Line::try_parse_from(["exec", "--file", "a.py", "print(1)"]).is_err());
        assert!(Line::try_parse_from(["exec"]).is_err());
    }

    #[test]
    fn code_that_is_only_a_files_name_is_refused_with_the_flag_to_use() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = in_dir(dir.path(), "hello.py");
        std::fs::write(&path, "print('hi')\n").expect("written");
        let err = parsed(&[&path]).check_code().unwrap_err();
        assert!(err.is_usage());
        assert_eq!(
            err.to_string(),
            format!("`{path}` is a file here; to run its contents use --file {path}")
        );
        // Code is code, even when a file of some of its words exists.
        parsed(&[&format!("print(open('{path}').read())")])
            .check_code()
            .expect("code with no file of its name");
        parsed(&["cat", &path]).check_code().expect("two words");
        parsed(&["print(1)"]).check_code().expect("no such file");
        parsed(&["-"]).check_code().expect("stdin");
        parsed(&["--file", &path])
            .check_code()
            .expect("the file given");
    }
}
