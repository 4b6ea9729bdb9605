//! Why a command failed: one type for every command, so that `failure`
//! can report it and pick the exit code by what failed, never by reading
//! a message; and a kernel refusal in the CLI's words, which `failure`
//! prints and a failed tool call carries.

use std::time::Duration;

use agentos_proto::{ClientError, ErrorCode, ErrorReply};
use nix::errno::Errno;

use crate::mcp::ServeError;
use crate::mcp_servers::ImportError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line asks for something that cannot be sent: exit
    /// code 2, as clap's own usage errors.
    #[error("{0}")]
    Usage(String),
    /// A `key=value` of `agentos call` whose value the tool's input schema
    /// does not take: a usage error too.
    #[error("{tool}'s argument `{key}` {why}")]
    ToolArgument {
        tool: String,
        key: String,
        why: NotOfType,
    },
    /// Talking to the kernel failed, or the kernel refused.
    #[error(transparent)]
    Kernel(#[from] ClientError),
    /// The kernel's refusal, found in a reply the command reads itself.
    #[error(transparent)]
    Refused(ErrorReply),
    /// A template build failed, or a template named is not there.
    #[error("{0}")]
    Template(String),
    /// A volume the kernel does not know as the caller's.
    #[error("volume '{volume}': {message} (agentos volume ls lists yours)")]
    NoSuchVolume {
        volume: String,
        /// The kernel's own words.
        message: String,
    },
    /// No agent with this id among those the caller may see.
    #[error("no agent with id {0} (agentos ps -a lists them)")]
    NoAgentWithId(u32),
    /// No such key in the state store (among those the caller sees).
    #[error("no key '{0}' (agentos kv ls lists yours)")]
    NoKey(String),
    /// No agent of this name among those the caller may see.
    #[error("no agent named '{0}' (agentos ps -a lists them)")]
    NoAgentNamed(String),
    /// Waiting for a stopped agent to end failed.
    #[error("agent '{agent}' is still stopping")]
    StillStopping {
        agent: String,
        #[source]
        cause: Box<CliError>,
    },
    /// An agent waited on did not get there in time.
    #[error(
        "still {state} after {:.0} s (--timeout SECS waits longer)",
        .waited.as_secs_f64()
    )]
    StillIn {
        /// The state it is still in.
        state: &'static str,
        waited: Duration,
    },
    /// An agent went from the list while it restarted.
    #[error("agent '{0}' was removed while restarting")]
    RemovedWhileRestarting(String),
    /// An agent ended as soon as it had restarted.
    #[error(
        "agent '{agent}' ended right after its restart: {state} ({ending}; agentos logs {agent})"
    )]
    EndedAfterRestart {
        agent: String,
        state: &'static str,
        /// Its exit code, `sigN` or `OOM`.
        ending: String,
    },
    /// `rm` of a name one of whose agents still runs, without `-f`.
    #[error(
        "agent '{agent}' (id {id}) is {state}; stop it first (agentos stop {agent}), or use \
         agentos rm -f"
    )]
    StillLive {
        agent: String,
        id: u32,
        state: &'static str,
    },
    /// `net --deny` without the rest of a policy.
    #[error("--deny goes with --allow or --cut: give the whole new policy")]
    DenyWithoutPolicy,
    /// An EXEC session the kernel does not know as the caller's.
    #[error("session '{session}': {message} (agentos sessions lists yours)")]
    NoSuchSession {
        session: String,
        /// The kernel's own words.
        message: String,
    },
    /// A snapshot the kernel does not know among the session's (or a
    /// session it does not know as the caller's): its words say which.
    #[error(
        "{message} (agentos sessions lists yours, agentos snapshot ls {session} its snapshots)"
    )]
    NoSuchSnapshot {
        session: String,
        /// The kernel's own words.
        message: String,
    },
    /// `agentos run` followed its task for as long as it was asked to.
    #[error(
        "task {task_id} is still {state} after {:.0} s; it goes on: agentos task wait {task_id} \
         (--timeout SECS waits longer)",
        .waited.as_secs_f64()
    )]
    TaskStillRunning {
        task_id: String,
        state: String,
        waited: Duration,
    },
    /// THINK refused as unavailable: the kernel has no LLM provider it can
    /// use, which is not the same as a kernel without THINK.
    #[error("the kernel's LLM provider cannot answer: {reason} (agentos hello shows its state)")]
    LlmUnavailable {
        /// The kernel's own words.
        reason: String,
    },
    /// The file given for the code could not be read.
    #[error("reading {}", .path.display())]
    ReadingFile {
        path: std::path::PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// A tool call the kernel or the tool refused.
    #[error("{tool}: {}", in_cli_terms(.refusal))]
    ToolFailed { tool: String, refusal: ErrorReply },
    /// `top` could not read the LIST reply.
    #[error("reading the LIST reply")]
    ReadingList(#[source] ClientError),
    /// A NOOP's echo differed from what was sent.
    #[error("NOOP {index} came back altered ({len} bytes)")]
    AlteredEcho { index: usize, len: usize },
    /// JSON that could not be written or read.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Reading stdin, writing stdout, or a path made absolute.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The terminal of `agentos top` would not take the view's mode, or
    /// give its keys (`doing`: what failed, as `reading the terminal's
    /// mode`).
    #[error("{doing}")]
    Terminal {
        doing: &'static str,
        #[source]
        error: Errno,
    },
    /// `agentos mcp`.
    #[error(transparent)]
    Mcp(#[from] ServeError),
    /// `agentos mcp-servers import`.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// `agentos e2b`.
    #[error(transparent)]
    E2b(#[from] crate::e2b::E2bCliError),
}

impl CliError {
    /// Whether the command line was wrong (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, CliError::Usage(_) | CliError::ToolArgument { .. })
    }

    /// The kernel error this failure is, seen through the context it was
    /// given.
    pub fn kernel(&self) -> Option<&ClientError> {
        match self {
            CliError::Kernel(err) | CliError::ReadingList(err) => Some(err),
            CliError::StillStopping { cause, .. } => cause.kernel(),
            _ => None,
        }
    }

    /// The kernel's refusal this failure is, if that is what it is.
    pub fn refusal(&self) -> Option<&ErrorReply> {
        match (self, self.kernel()) {
            (CliError::Refused(reply), _) => Some(reply),
            (_, Some(ClientError::Remote(reply))) => Some(reply),
            _ => None,
        }
    }
}

/// A `key=value`'s value that is not of the type the tool's input schema
/// gives its key; it holds the value as given.
#[derive(Debug, thiserror::Error)]
pub enum NotOfType {
    #[error("is an integer, not {0:?}")]
    Integer(String),
    #[error("is a number, not {0:?}")]
    Number(String),
    #[error("is true or false, not {0:?}")]
    Boolean(String),
    /// Not a JSON `kind` (object or array).
    #[error("is a JSON {kind}, not {text:?}")]
    Json { kind: &'static str, text: String },
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
