//! The MCP resources: an agent's log, the files of an exec session's
//! `/workspace`, and a finished task's result, each under an `agentos://`
//! URI.
//!
//! Reading one is a kernel request as the caller, exactly like a tool
//! call, so the kernel decides what the caller may see: an agent sees its
//! own agents, sessions and tasks only, and something that is not the
//! caller's is `not_found` to it. The kernel has no file-read operation;
//! a session's file is read by an EXEC run in that session that does
//! nothing and collects the file, and a session's files are listed by a
//! run that lists them.

mod contents;
mod uri;

use agentos_proto::payload::{
    AgentInfo, ExecCall, ExecReply, ExecRequest, Language, ListRequest, LogsReply, LogsRequest,
    SessionInfo, SessionsReply, TaskInfo, TaskList, TaskListReply, TaskReply, TaskRequest,
    TaskWait, MAX_LOG_LINES,
};
use agentos_proto::{ErrorCode, Opcode};
use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use rmcp::ErrorData;
use serde::Serialize;
use tokio::task::JoinSet;

use super::kernel::{KernelError, KernelLink, Wait};
use contents::{file_contents, mime_type_of};
use uri::{
    check_workspace_path, ResourceUri, UriError, FILE_TEMPLATE, LOG_TEMPLATE, RESULT_TEMPLATE,
};

/// A listing names at most this many agents' logs, ...
const MAX_LISTED_AGENTS: usize = 100;
/// ... the files of at most this many sessions (the most recently used),
const MAX_LISTED_SESSIONS: usize = 16;
/// ... at most this many files of each (a listing's output stays well
/// within an EXEC run's 64 KiB of stdout even at the longest paths), ...
const MAX_LISTED_FILES_PER_SESSION: usize = 32;
/// ... and the results of at most this many of the newest finished tasks.
const MAX_LISTED_TASKS: usize = 50;

/// A run that reads or lists a session's files does nothing that takes
/// long; this bounds its wait behind the session's other runs too (a
/// request queued past its timeout is answered `timeout` and never runs,
/// so the session is left as it was).
const FILE_RUN_TIMEOUT_MS: u64 = 10_000;

/// Lists the regular files under `/workspace` (not following symlinks,
/// which `collect` refuses anyway) as `size path` records ending in NUL,
/// which no path contains. Bash, so the session's Python state is not
/// touched.
const LIST_FILES_SCRIPT: &str = "cd /workspace && find . -type f -printf '%s %P\\0' | head -z -n ";

/// Why a resource cannot be listed or read.
#[derive(Debug, thiserror::Error)]
enum ResourceError {
    /// The URI names no resource of this server.
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("you have no exec session {0:?}")]
    NoSession(String),
    /// The run that was to collect a file could not: its reason (no such
    /// file, not a regular one, too large).
    #[error("{0}")]
    NotCollected(String),
    #[error("task {task_id} has not finished ({state}); its result is readable once it has")]
    Unfinished {
        task_id: String,
        state: &'static str,
    },
    #[error("the kernel sent {path} as malformed base64: {error}")]
    Base64 {
        path: String,
        error: base64::DecodeError,
    },
    /// A listing run that failed (`exit_code`), or whose output was cut.
    #[error("listing session {session:?} failed (exit code {exit_code:?}) or was cut short")]
    Listing {
        session: String,
        exit_code: Option<i32>,
    },
    #[error("a session listing did not finish: {0}")]
    ListingTask(tokio::task::JoinError),
    /// A task's record could not be written as JSON.
    #[error("{0}")]
    Unwritable(serde_json::Error),
}

impl From<ResourceError> for ErrorData {
    /// What the kernel does not show the caller (absent, or someone
    /// else's) is a resource not found; a URI or request it cannot take
    /// is the client's mistake; the rest is the server's.
    fn from(error: ResourceError) -> ErrorData {
        let message = error.to_string();
        match &error {
            ResourceError::Uri(_) => ErrorData::invalid_params(message, None),
            ResourceError::NoSession(_)
            | ResourceError::NotCollected(_)
            | ResourceError::Unfinished { .. } => ErrorData::resource_not_found(message, None),
            ResourceError::Kernel(err) => match err.refusal_code() {
                Some(ErrorCode::NotFound | ErrorCode::PermissionDenied) => {
                    ErrorData::resource_not_found(message, None)
                }
                Some(ErrorCode::BadRequest | ErrorCode::LimitExceeded) => {
                    ErrorData::invalid_params(message, None)
                }
                _ => ErrorData::internal_error(message, None),
            },
            _ => ErrorData::internal_error(message, None),
        }
    }
}

/// What a failed read's error carries besides its message.
#[derive(Serialize)]
struct ReadFailed<'a> {
    /// The URI, which tells a client that reads many at once which one
    /// failed.
    uri: &'a str,
}

/// resources/templates/list: the three kinds of resource.
pub fn templates() -> ListResourceTemplatesResult {
    let templates = vec![
        ResourceTemplate::new(LOG_TEMPLATE, "agent-log")
            .with_title("An agent's log")
            .with_description("The last 256 KiB of what an agent wrote to stdout and stderr.")
            .with_mime_type("text/plain"),
        ResourceTemplate::new(FILE_TEMPLATE, "session-file")
            .with_title("A file in an exec session")
            .with_description(
                "A file under an exec session's /workspace; the MIME type follows \
                 its extension, binary files come as base64 blobs.",
            ),
        ResourceTemplate::new(RESULT_TEMPLATE, "task-result")
            .with_title("A finished task")
            .with_description("A finished task as task_wait gives it, its result included.")
            .with_mime_type("application/json"),
    ];
    ListResourceTemplatesResult::with_all_items(templates)
}

/// resources/list: the caller's agents' logs, the files of its exec
/// sessions, and its finished tasks' results, each bounded.
pub async fn list(kernel: &KernelLink) -> Result<ListResourcesResult, ErrorData> {
    let (logs, files, results) = tokio::join!(
        listed_logs(kernel),
        listed_files(kernel),
        listed_results(kernel)
    );
    let mut resources = logs?;
    resources.extend(files?);
    resources.extend(results?);
    // One page holds everything: the listing is bounded, and what it
    // leaves out stays readable by URI. It is the caller's own and
    // changes with every run, so it is not to be cached.
    Ok(ListResourcesResult::with_all_items(resources)
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private))
}

/// resources/read.
pub async fn read(kernel: &KernelLink, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let contents = read_contents(kernel, uri).await.map_err(|error| {
        let mut error = ErrorData::from(error);
        if error.data.is_none() {
            error.data = serde_json::to_value(ReadFailed { uri }).ok();
        }
        error
    })?;
    Ok(ReadResourceResult::new(vec![contents]))
}

async fn read_contents(kernel: &KernelLink, uri: &str) -> Result<ResourceContents, ResourceError> {
    let resource = ResourceUri::parse(uri)?;
    match &resource {
        ResourceUri::AgentLog { name } => read_log(kernel, resource.uri(), name).await,
        ResourceUri::SessionFile { session, path } => {
            read_file(kernel, resource.uri(), session, path).await
        }
        ResourceUri::TaskResult { task_id } => read_result(kernel, resource.uri(), task_id).await,
    }
}

async fn read_log(
    kernel: &KernelLink,
    uri: String,
    name: &str,
) -> Result<ResourceContents, ResourceError> {
    let request = LogsRequest {
        name: Some(name.to_owned()),
        lines: Some(MAX_LOG_LINES),
        ..LogsRequest::default()
    };
    let reply: LogsReply = kernel.request(Opcode::LOGS, &request, Wait::Quick).await?;
    Ok(ResourceContents::text(reply.text, uri).with_mime_type("text/plain"))
}

async fn read_file(
    kernel: &KernelLink,
    uri: String,
    session: &str,
    path: &str,
) -> Result<ResourceContents, ResourceError> {
    // A run names its session into being: make sure it is there, so
    // that reading a file never creates a session.
    let sessions = caller_sessions(kernel).await?;
    if !sessions.iter().any(|known| known.session == session) {
        return Err(ResourceError::NoSession(session.to_owned()));
    }
    let request = ExecRequest {
        code: "pass".to_owned(),
        session: Some(session.to_owned()),
        collect: vec![path.to_owned()],
        timeout_ms: Some(FILE_RUN_TIMEOUT_MS),
        ..ExecRequest::default()
    };
    let mut reply: ExecReply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    match reply.files.remove(path) {
        Some(content) => file_contents(uri, path, content).map_err(|error| ResourceError::Base64 {
            path: path.to_owned(),
            error,
        }),
        // The run says why it could not collect the file (no such
        // file, not a regular one, too large).
        None => Err(ResourceError::NotCollected(
            reply
                .error
                .unwrap_or_else(|| "the file could not be read".to_owned()),
        )),
    }
}

async fn read_result(
    kernel: &KernelLink,
    uri: String,
    task_id: &str,
) -> Result<ResourceContents, ResourceError> {
    // A wait of no time: the task as it is, its result once finished.
    let request = TaskRequest::Wait(TaskWait {
        task_id: task_id.to_owned(),
        timeout_ms: Some(0),
    });
    let reply: TaskReply = kernel.request(Opcode::TASK, &request, Wait::Quick).await?;
    let task = reply.task;
    if !task.state.is_finished() {
        return Err(ResourceError::Unfinished {
            task_id: task_id.to_owned(),
            state: task.state.as_str(),
        });
    }
    let text = serde_json::to_string_pretty(&task).map_err(ResourceError::Unwritable)?;
    Ok(ResourceContents::text(text, uri).with_mime_type("application/json"))
}

async fn listed_logs(kernel: &KernelLink) -> Result<Vec<Resource>, ResourceError> {
    let agents: Vec<AgentInfo> = kernel
        .request(Opcode::LIST, &ListRequest {}, Wait::Quick)
        .await?;
    // The log by name is the live agent's, else the latest one's: one
    // resource per name.
    let mut names: Vec<&str> = agents.iter().map(|agent| agent.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Ok(names
        .into_iter()
        .take(MAX_LISTED_AGENTS)
        .map(|name| {
            let uri = ResourceUri::AgentLog {
                name: name.to_owned(),
            }
            .uri();
            Resource::new(uri, format!("agents/{name}/log"))
                .with_title(format!("Log of agent {name}"))
                .with_mime_type("text/plain")
        })
        .collect())
}

async fn listed_files(kernel: &KernelLink) -> Result<Vec<Resource>, ResourceError> {
    let mut sessions = unless_unavailable(caller_sessions(kernel).await)?;
    sessions.sort_by(|a, b| b.last_used_at.cmp(&a.last_used_at));
    let mut listings = JoinSet::new();
    for (order, session) in sessions
        .into_iter()
        .map(|info| info.session)
        .take(MAX_LISTED_SESSIONS)
        .enumerate()
    {
        let kernel = kernel.clone();
        listings.spawn(async move {
            let files = session_files(&kernel, &session).await;
            (order, session, files)
        });
    }
    let mut listed = Vec::new();
    while let Some(joined) = listings.join_next().await {
        let (order, session, files) = joined.map_err(ResourceError::ListingTask)?;
        // A session busy with a long run, or whose listing failed,
        // is left out rather than failing every other resource; its
        // files stay readable by URI.
        if let Ok(files) = files {
            listed.push((order, session, files));
        }
    }
    listed.sort_by_key(|(order, _, _)| *order);
    let mut resources = Vec::new();
    for (_, session, files) in listed {
        for (size, path) in files {
            let uri = ResourceUri::SessionFile {
                session: session.clone(),
                path: path.clone(),
            }
            .uri();
            let mut resource = Resource::new(uri, format!("sessions/{session}/{path}"))
                .with_title(format!("{path} in exec session {session}"))
                .with_size(size);
            if let Some(mime) = mime_type_of(&path) {
                resource = resource.with_mime_type(mime);
            }
            resources.push(resource);
        }
    }
    Ok(resources)
}

async fn listed_results(kernel: &KernelLink) -> Result<Vec<Resource>, ResourceError> {
    let request = TaskRequest::List(TaskList {
        limit: Some(2 * MAX_LISTED_TASKS as u64),
        ..TaskList::default()
    });
    let reply = kernel.request::<TaskListReply>(Opcode::TASK, &request, Wait::Quick);
    let tasks: Vec<TaskInfo> = unless_unavailable(
        reply
            .await
            .map(|reply| reply.tasks)
            .map_err(ResourceError::from),
    )?;
    Ok(tasks
        .iter()
        .filter(|task| task.state.is_finished())
        .map(|task| {
            let (task_id, kind) = (&task.task_id, task.kind.as_str());
            let title = match &task.label {
                Some(label) => format!("Result of {kind} task {task_id} ({label})"),
                None => format!("Result of {kind} task {task_id}"),
            };
            let uri = ResourceUri::TaskResult {
                task_id: task_id.clone(),
            }
            .uri();
            Resource::new(uri, format!("tasks/{task_id}/result"))
                .with_title(title)
                .with_mime_type("application/json")
        })
        .take(MAX_LISTED_TASKS)
        .collect())
}

/// A kernel reply, or for a subsystem this host does not have (EXEC
/// without namespaces, TASK without its store) nothing: the caller has
/// none of its resources, and the others are still listed.
fn unless_unavailable<T: Default>(reply: Result<T, ResourceError>) -> Result<T, ResourceError> {
    match reply {
        Err(ResourceError::Kernel(err)) if err.refusal_code() == Some(ErrorCode::Unavailable) => {
            Ok(T::default())
        }
        reply => reply,
    }
}

/// The caller's exec sessions as the kernel lists them.
async fn caller_sessions(kernel: &KernelLink) -> Result<Vec<SessionInfo>, ResourceError> {
    let reply: SessionsReply = kernel
        .request(
            Opcode::EXEC,
            &ExecCall::Sessions { usage: false },
            Wait::Quick,
        )
        .await?;
    Ok(reply.sessions)
}

/// A session's files, as (size, path under /workspace), at most
/// [`MAX_LISTED_FILES_PER_SESSION`] of them.
async fn session_files(
    kernel: &KernelLink,
    session: &str,
) -> Result<Vec<(u64, String)>, ResourceError> {
    let request = ExecRequest {
        code: format!("{LIST_FILES_SCRIPT}{MAX_LISTED_FILES_PER_SESSION}"),
        language: Language::Bash,
        session: Some(session.to_owned()),
        timeout_ms: Some(FILE_RUN_TIMEOUT_MS),
        ..ExecRequest::default()
    };
    let reply: ExecReply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    if reply.exit_code != Some(0) || reply.truncated.stdout > 0 {
        return Err(ResourceError::Listing {
            session: session.to_owned(),
            exit_code: reply.exit_code,
        });
    }
    Ok(parse_listing(&reply.stdout))
}

/// `size path` records ending in NUL; a record that is not one (the
/// session's own code cannot write into this run's output, but a path the
/// kernel would refuse to collect is of no use either) is left out.
fn parse_listing(stdout: &str) -> Vec<(u64, String)> {
    stdout
        .split_terminator('\0')
        .filter_map(|record| {
            let (size, path) = record.split_once(' ')?;
            let size = size.parse().ok()?;
            check_workspace_path(path).ok()?;
            Some((size, path.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use agentos_proto::{ClientError, ErrorReply};

    use super::*;

    fn refused(code: ErrorCode, message: &str) -> ResourceError {
        KernelError::Refused(ErrorReply::new(code, message)).into()
    }

    #[test]
    fn what_the_kernel_hides_is_not_found_and_bad_requests_are_invalid() {
        let code = |error: ResourceError| ErrorData::from(error).code;
        let not_found = rmcp::model::ErrorCode::RESOURCE_NOT_FOUND;
        assert_eq!(
            code(refused(ErrorCode::NotFound, "no agent named \"x\"")),
            not_found
        );
        assert_eq!(
            code(refused(ErrorCode::PermissionDenied, "not yours")),
            not_found
        );
        assert_eq!(
            code(refused(ErrorCode::BadRequest, "TASK field `task_id`: bad")),
            rmcp::model::ErrorCode::INVALID_PARAMS
        );
        // Not reaching the kernel is no refusal of it.
        let unreached = KernelError::from(ClientError::Closed).into();
        assert_eq!(code(unreached), rmcp::model::ErrorCode::INTERNAL_ERROR);
        let said = ErrorData::from(refused(ErrorCode::NotFound, "no task t-1"));
        assert_eq!(said.message, "no task t-1 (not_found)");
    }

    #[test]
    fn a_subsystem_the_host_lacks_lists_nothing() {
        let absent =
            unless_unavailable::<Vec<String>>(Err(refused(ErrorCode::Unavailable, "EXEC is off")));
        assert!(absent.is_ok_and(|listed| listed.is_empty()));
        let denied = Err(refused(ErrorCode::PermissionDenied, "no"));
        assert!(unless_unavailable::<Vec<String>>(denied).is_err());
    }

    #[test]
    fn a_listing_gives_sizes_and_plain_paths() {
        let listed = parse_listing("12 a.txt\u{0}0 dir/b c.bin\u{0}x bad\u{0}3 ../out\u{0}");
        assert_eq!(
            listed,
            vec![(12, "a.txt".to_owned()), (0, "dir/b c.bin".to_owned())]
        );
    }
}
