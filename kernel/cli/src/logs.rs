//! `agentos logs NAME [-f] [-n N]`: an agent's log, like `tail`.

use std::io::Write;

use agentos_proto::payload::{LogsReply, LogsRequest};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;

/// How long each follow request waits for output: well inside the
/// client's own timeout.
const FOLLOW_WAIT_MS: u64 = 10_000;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// Agent name, or id
    agent: String,
    /// Keep printing what the agent writes until it ends
    #[arg(short, long)]
    follow: bool,
    /// How many of the last lines to print first
    #[arg(short = 'n', long, value_name = "N", default_value_t = 100)]
    lines: u64,
}

pub fn logs(client: &mut Client, args: LogsArgs, json: bool) -> Result<(), CliError> {
    let (id, name) = crate::agents::id_or_name(&args.agent);
    let mut request = LogsRequest {
        id,
        name,
        lines: Some(args.lines),
        ..LogsRequest::default()
    };
    let mut stdout = std::io::stdout().lock();
    loop {
        let reply: LogsReply = client
            .call_json(Opcode::LOGS, &serde_json::to_vec(&request)?)
            .map_err(|err| crate::failure::about_agent(&args.agent, err))?;
        if json {
            // One reply per line, so that a follower reads them as they come.
            writeln!(stdout, "{}", serde_json::to_string(&reply)?)?;
        } else if reply.truncated {
            eprintln!(
                "agentos: the log of {} was cut; going on from its start",
                reply.name
            );
        }
        if !json {
            stdout.write_all(reply.text.as_bytes())?;
        }
        stdout.flush()?;
        if !args.follow || reply.ended {
            return Ok(());
        }
        // By id from here on: a new agent taking the name is another log.
        request = LogsRequest {
            id: Some(reply.id),
            after: Some(reply.offset),
            follow: true,
            wait_ms: Some(FOLLOW_WAIT_MS),
            ..LogsRequest::default()
        };
    }
}
