//! What the CLI says when something goes wrong, in its own terms: which
//! command to run next, not the protocol's error codes. Exit codes: 0 ok,
//! 1 the operation failed, 2 the command line was wrong.

use std::error::Error;
use std::process::ExitCode;

use agentos_proto::{ClientError, ErrorCode};

use crate::error::{in_cli_terms, CliError};

/// A usage error: the command line asked for something that cannot be
/// sent.
pub fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

/// No agent by that name or id among those the caller may see.
pub fn no_such_agent(agent: &str) -> CliError {
    match agent.parse::<u32>() {
        Ok(id) => CliError::NoAgentWithId(id),
        Err(_) => CliError::NoAgentNamed(agent.to_owned()),
    }
}

/// A kernel refusal about `agent`, in the CLI's words.
pub fn about_agent(agent: &str, err: ClientError) -> CliError {
    match &err {
        ClientError::Remote(reply) if reply.code == ErrorCode::NotFound => no_such_agent(agent),
        _ => err.into(),
    }
}

/// Prints `err` for a person and gives the exit code it deserves.
pub fn report(err: &CliError) -> ExitCode {
    if err.is_usage() {
        eprintln!("agentos: {err}");
        eprintln!("Try 'agentos --help' for more information.");
        return ExitCode::from(2);
    }
    match (err.refusal(), err.kernel()) {
        (Some(reply), _) => eprintln!("agentos: {}", in_cli_terms(reply)),
        (None, Some(ClientError::Io(io))) if is_timeout(io) => {
            eprintln!("agentos: no reply from the kernel in time; --timeout SECS waits longer")
        }
        _ => eprintln!("agentos: {}", with_causes(err)),
    }
    ExitCode::FAILURE
}

/// The error's sentence followed by each cause's, `: `-separated.
fn with_causes(err: &CliError) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

fn is_timeout(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentos_proto::ErrorReply;

    use super::*;

    #[test]
    fn a_missing_agent_is_named_with_the_command_that_lists_agents() {
        let refused = ClientError::Remote(ErrorReply::new(ErrorCode::NotFound, "nope"));
        let said = about_agent("w1", refused).to_string();
        assert_eq!(said, "no agent named 'w1' (agentos ps -a lists them)");
        assert!(!said.contains("not_found"));
        let by_id = about_agent("7", ClientError::Closed).to_string();
        assert_eq!(
            by_id, "the kernel closed the connection",
            "other errors stand"
        );
    }

    #[test]
    fn usage_errors_exit_2_and_failures_1() {
        assert_eq!(report(&usage("bad")), ExitCode::from(2));
        assert_eq!(report(&CliError::DenyWithoutPolicy), ExitCode::FAILURE);
    }

    #[test]
    fn a_failure_is_said_with_its_causes_and_a_refusal_in_the_cli_terms() {
        let still = CliError::StillStopping {
            agent: "w1".to_owned(),
            cause: Box::new(CliError::StillIn {
                state: "running",
                waited: Duration::from_secs(3),
            }),
        };
        assert_eq!(
            with_causes(&still),
            "agent 'w1' is still stopping: still running after 3 s (--timeout SECS waits longer)"
        );
        let refused = CliError::StillStopping {
            agent: "w1".to_owned(),
            cause: Box::new(CliError::Kernel(ClientError::Remote(ErrorReply::new(
                ErrorCode::Busy,
                "queue full",
            )))),
        };
        let reply = refused.refusal().expect("the refusal inside");
        assert_eq!(
            in_cli_terms(reply),
            "queue full: the kernel is busy; try again shortly"
        );
    }
}
