//! What the CLI says when something goes wrong, in its own terms: which
//! command to run next, not the protocol's error codes. Exit codes: 0 ok,
//! 1 the operation failed, 2 the command line was wrong.

use std::process::ExitCode;

use agentos_proto::{ClientError, ErrorCode, ErrorReply};

/// The command line asked for something that cannot be sent: exit code 2,
/// as clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// A usage error, as an `anyhow::Error` to return.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Usage(message.into()).into()
}

/// No agent by that name or id among those the caller may see.
pub fn no_such_agent(agent: &str) -> anyhow::Error {
    match agent.parse::<u32>() {
        Ok(id) => anyhow::anyhow!("no agent with id {id} (agentos ps -a lists them)"),
        Err(_) => anyhow::anyhow!("no agent named '{agent}' (agentos ps -a lists them)"),
    }
}

/// A kernel refusal about `agent`, in the CLI's words.
pub fn about_agent(agent: &str, err: anyhow::Error) -> anyhow::Error {
    match remote(&err).map(|reply| reply.code) {
        Some(ErrorCode::NotFound) => no_such_agent(agent),
        _ => err,
    }
}

/// The kernel's refusal inside `err`, if that is what it is.
pub fn remote(err: &anyhow::Error) -> Option<&ErrorReply> {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Remote(reply)) => Some(reply),
        _ => err.downcast_ref::<ErrorReply>(),
    }
}

/// Prints `err` for a person and gives the exit code it deserves.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if err.downcast_ref::<Usage>().is_some() {
        eprintln!("agentos: {err}");
        eprintln!("Try 'agentos --help' for more information.");
        return ExitCode::from(2);
    }
    match (remote(err), err.downcast_ref::<ClientError>()) {
        (Some(reply), _) => eprintln!("agentos: {}", in_cli_terms(reply)),
        (None, Some(ClientError::Io(io))) if is_timeout(io) => {
            eprintln!("agentos: no reply from the kernel in time; --timeout SECS waits longer")
        }
        _ => eprintln!("agentos: {err:#}"),
    }
    ExitCode::FAILURE
}

fn is_timeout(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A refusal's sentence, with what to do about it where the code says.
pub fn in_cli_terms(reply: &ErrorReply) -> String {
    let hint = match reply.code {
        ErrorCode::PermissionDenied => "not allowed",
        ErrorCode::Busy => "the kernel is busy; try again shortly",
        ErrorCode::Timeout => "timed out",
        ErrorCode::Unavailable => "not available on this kernel (agentos hello shows what is)",
        ErrorCode::LimitExceeded => "over a limit",
        _ => return reply.error.clone(),
    };
    format!("{}: {hint}", reply.error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_agent_is_named_with_the_command_that_lists_agents() {
        let refused = ClientError::Remote(ErrorReply::new(ErrorCode::NotFound, "nope"));
        let said = about_agent("w1", refused.into()).to_string();
        assert_eq!(said, "no agent named 'w1' (agentos ps -a lists them)");
        assert!(!said.contains("not_found"));
        let by_id = about_agent("7", ClientError::Closed.into()).to_string();
        assert_eq!(
            by_id, "the kernel closed the connection",
            "other errors stand"
        );
    }

    #[test]
    fn usage_errors_exit_2_and_failures_1() {
        assert_eq!(report(&usage("bad")), ExitCode::from(2));
        assert_eq!(report(&anyhow::anyhow!("failed")), ExitCode::FAILURE);
    }
}
