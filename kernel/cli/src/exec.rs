//! `agentos exec`: run code in a fresh sandbox (or a session's), print
//! what it printed and exit with its exit code.

use std::process::ExitCode;

use agentos_proto::payload::{ExecReply, ExecRequest, Language};
use agentos_proto::{Client, ErrorReply, Opcode};
use serde::Deserialize;

use crate::error::CliError;
use crate::input::{millis, words_or_stdin};
use crate::policy::PolicyArgs;
use crate::raw::Raw;

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The code (its words are joined by spaces); `-` reads it from stdin
    #[arg(required = true, allow_hyphen_values = true)]
    code: Vec<String>,
    /// Run it in this session's interpreter and /workspace
    #[arg(short, long)]
    session: Option<String>,
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

pub fn exec(client: &mut Client, args: ExecArgs, json: bool) -> Result<ExitCode, CliError> {
    let request = ExecRequest {
        code: words_or_stdin(&args.code)?,
        language: if args.bash {
            Language::Bash
        } else {
            Language::Python
        },
        session: args.session,
        timeout_ms: args.run_timeout.map(millis),
        network: args.policy.network(),
        ..ExecRequest::default()
    };
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
