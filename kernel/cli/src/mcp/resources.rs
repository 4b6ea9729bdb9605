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

use agentos_proto::payload::{validate_name, MAX_EXEC_PATH_LEN, MAX_LOG_LINES};
use agentos_proto::Opcode;
use base64::Engine;
use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use rmcp::ErrorData;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::kernel::{refusal_code, KernelLink, Wait};
use super::server::AgentosServer;

const SCHEME: &str = "agentos://";

/// The longest URI read: a session name and the longest path the kernel
/// collects, percent-encoded, fit well within it.
const MAX_URI_BYTES: usize = 4096;

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

const LOG_TEMPLATE: &str = "agentos://agents/{name}/log";
const FILE_TEMPLATE: &str = "agentos://sessions/{session}/{+path}";
const RESULT_TEMPLATE: &str = "agentos://tasks/{task_id}/result";

/// What an `agentos://` URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceUri {
    /// `agentos://agents/{name}/log`
    AgentLog { name: String },
    /// `agentos://sessions/{session}/{path}`: `path` under `/workspace`.
    SessionFile { session: String, path: String },
    /// `agentos://tasks/{task_id}/result`
    TaskResult { task_id: String },
}

impl ResourceUri {
    /// Reads and checks a URI a client sent: the names are the kernel's
    /// names and the path stays under `/workspace`, so nothing a client
    /// writes here reaches the kernel unless it names a resource.
    pub fn parse(uri: &str) -> Result<ResourceUri, String> {
        if uri.len() > MAX_URI_BYTES {
            return Err(format!(
                "the URI is {} bytes; at most {MAX_URI_BYTES}",
                uri.len()
            ));
        }
        let Some(rest) = uri.strip_prefix(SCHEME) else {
            return Err(format!(
                "unknown resource {}: this server's resources are {LOG_TEMPLATE}, \
                 {FILE_TEMPLATE} and {RESULT_TEMPLATE}",
                quoted_start(uri)
            ));
        };
        if rest.contains(['?', '#']) {
            return Err("a resource URI here has no query or fragment".to_owned());
        }
        let unknown = || {
            format!(
                "unknown resource {}: expected {LOG_TEMPLATE}, {FILE_TEMPLATE} or \
                 {RESULT_TEMPLATE}",
                quoted_start(uri)
            )
        };
        let (kind, rest) = rest.split_once('/').ok_or_else(unknown)?;
        match kind {
            "agents" => {
                let name = rest.strip_suffix("/log").ok_or_else(unknown)?;
                check_name("agent name", name)?;
                Ok(ResourceUri::AgentLog {
                    name: name.to_owned(),
                })
            }
            "sessions" => {
                let (session, path) = rest.split_once('/').ok_or_else(unknown)?;
                check_name("session", session)?;
                let path = percent_decode(path)?;
                check_workspace_path(&path)?;
                Ok(ResourceUri::SessionFile {
                    session: session.to_owned(),
                    path,
                })
            }
            "tasks" => {
                let task_id = rest.strip_suffix("/result").ok_or_else(unknown)?;
                check_name("task id", task_id)?;
                Ok(ResourceUri::TaskResult {
                    task_id: task_id.to_owned(),
                })
            }
            _ => Err(unknown()),
        }
    }

    /// The URI, with a file's path percent-encoded (a path may hold
    /// characters a URI may not).
    pub fn uri(&self) -> String {
        match self {
            ResourceUri::AgentLog { name } => format!("{SCHEME}agents/{name}/log"),
            ResourceUri::SessionFile { session, path } => {
                format!("{SCHEME}sessions/{session}/{}", percent_encode(path))
            }
            ResourceUri::TaskResult { task_id } => format!("{SCHEME}tasks/{task_id}/result"),
        }
    }
}

/// The start of a long URI, for an error message that does not echo a
/// megabyte back.
fn quoted_start(uri: &str) -> String {
    const SHOWN: usize = 80;
    match uri.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{:?}...", &uri[..end]),
        None => format!("{uri:?}"),
    }
}

/// A name as the kernel's names are: `[A-Za-z0-9_.-]{1,64}`, no `..`.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    validate_name(what, name).map_err(|err| format!("in the URI: {}", err.error))
}

/// A path the kernel collects: relative to `/workspace`, plain names
/// only. Stricter than the kernel, which lets `a/./b` through: a resource
/// has one URI.
fn check_workspace_path(path: &str) -> Result<(), String> {
    let plain = path.len() <= MAX_EXEC_PATH_LEN
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if plain {
        Ok(())
    } else {
        Err(format!(
            "the path {:?} is not a file under /workspace (relative, without `.` or `..`, \
             at most {MAX_EXEC_PATH_LEN} bytes)",
            quoted_start(path)
        ))
    }
}

/// `%XX` escapes decoded; the result must be UTF-8, as the kernel's paths
/// are.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or("the URI has a `%` that is not followed by two hex digits")?;
            decoded.push(hex);
            at += 3;
        } else {
            decoded.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| "the URI's path is not UTF-8".to_owned())
}

/// Every byte but the URI's unreserved characters and `/` as `%XX`.
fn percent_encode(path: &str) -> String {
    let mut encoded = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The MIME type a file's extension suggests, if it is a common one.
fn mime_type_of(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let (_, extension) = name.rsplit_once('.')?;
    let mime = match extension.to_ascii_lowercase().as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "xml" => "application/xml",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/jsonl",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "js" | "mjs" => "text/javascript",
        "py" => "text/x-python",
        "sh" => "application/x-sh",
        "rs" => "text/x-rust",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        "parquet" => "application/vnd.apache.parquet",
        _ => return None,
    };
    Some(mime)
}

/// Whether a MIME type is text a client shows as such.
fn is_textual(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/jsonl"
                | "application/xml"
                | "application/yaml"
                | "application/toml"
                | "application/x-sh"
                | "image/svg+xml"
        )
}

/// A file's contents as MCP carries them: text when its type is textual
/// (or unknown) and it is UTF-8, else the bytes as base64.
fn file_contents(
    uri: String,
    path: &str,
    base64_content: String,
) -> Result<ResourceContents, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&base64_content)
        .map_err(|err| format!("the kernel sent {path} as malformed base64: {err}"))?;
    let mime = mime_type_of(path);
    let text_allowed = mime.is_none_or(is_textual);
    match String::from_utf8(bytes) {
        Ok(text) if text_allowed => {
            Ok(ResourceContents::text(text, uri).with_mime_type(mime.unwrap_or("text/plain")))
        }
        _ => Ok(ResourceContents::blob(base64_content, uri)
            .with_mime_type(mime.unwrap_or("application/octet-stream"))),
    }
}

/// A kernel refusal as a JSON-RPC error: what the kernel does not show
/// the caller (absent, or someone else's) is a resource not found.
fn kernel_error(error: String) -> ErrorData {
    match refusal_code(&error) {
        Some("not_found" | "permission_denied") => ErrorData::resource_not_found(error, None),
        Some("bad_request" | "limit_exceeded") => ErrorData::invalid_params(error, None),
        _ => ErrorData::internal_error(error, None),
    }
}

impl AgentosServer {
    /// resources/templates/list: the three kinds of resource.
    pub(super) fn resource_templates() -> ListResourceTemplatesResult {
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
    pub(super) async fn list_resources_of_caller(&self) -> Result<ListResourcesResult, ErrorData> {
        let (logs, files, results) = tokio::join!(
            self.listed_logs(),
            self.listed_files(),
            self.listed_results()
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
    pub(super) async fn read_resource_at(
        &self,
        uri: &str,
    ) -> Result<ReadResourceResult, ErrorData> {
        let contents = self.read_contents(uri).await.map_err(|mut error| {
            // The URI in the error's data tells a client that reads many
            // at once which one failed.
            error.data.get_or_insert_with(|| json!({ "uri": uri }));
            error
        })?;
        Ok(ReadResourceResult::new(vec![contents]))
    }

    async fn read_contents(&self, uri: &str) -> Result<ResourceContents, ErrorData> {
        let resource =
            ResourceUri::parse(uri).map_err(|message| ErrorData::invalid_params(message, None))?;
        match &resource {
            ResourceUri::AgentLog { name } => self.read_log(resource.uri(), name).await,
            ResourceUri::SessionFile { session, path } => {
                self.read_file(resource.uri(), session, path).await
            }
            ResourceUri::TaskResult { task_id } => self.read_result(resource.uri(), task_id).await,
        }
    }

    async fn read_log(&self, uri: String, name: &str) -> Result<ResourceContents, ErrorData> {
        let request = json!({ "name": name, "lines": MAX_LOG_LINES });
        let reply = self
            .kernel
            .request(Opcode::LOGS, &request, Wait::Quick)
            .await
            .map_err(kernel_error)?;
        let text = reply["text"].as_str().ok_or_else(|| {
            ErrorData::internal_error(
                format!("unexpected LOGS reply from the kernel: {reply}"),
                None,
            )
        })?;
        Ok(ResourceContents::text(text, uri).with_mime_type("text/plain"))
    }

    async fn read_file(
        &self,
        uri: String,
        session: &str,
        path: &str,
    ) -> Result<ResourceContents, ErrorData> {
        // A run names its session into being: make sure it is there, so
        // that reading a file never creates a session.
        let sessions = caller_sessions(&self.kernel).await.map_err(kernel_error)?;
        if !sessions.iter().any(|known| known["session"] == session) {
            return Err(ErrorData::resource_not_found(
                format!("you have no exec session {session:?}"),
                None,
            ));
        }
        let request = json!({
            "code": "pass",
            "session": session,
            "collect": [path],
            "timeout_ms": FILE_RUN_TIMEOUT_MS,
        });
        let mut reply = self
            .kernel
            .request(Opcode::EXEC, &request, Wait::Quick)
            .await
            .map_err(kernel_error)?;
        match reply["files"][path].take() {
            Value::String(content) => file_contents(uri, path, content)
                .map_err(|message| ErrorData::internal_error(message, None)),
            // The run says why it could not collect the file (no such
            // file, not a regular one, too large).
            _ => Err(ErrorData::resource_not_found(
                reply["error"]
                    .as_str()
                    .unwrap_or("the file could not be read")
                    .to_owned(),
                None,
            )),
        }
    }

    async fn read_result(&self, uri: String, task_id: &str) -> Result<ResourceContents, ErrorData> {
        // A wait of no time: the task as it is, its result once finished.
        let request = json!({ "op": "wait", "task_id": task_id, "timeout_ms": 0 });
        let reply = self
            .kernel
            .request(Opcode::TASK, &request, Wait::Quick)
            .await
            .map_err(kernel_error)?;
        let task = &reply["task"];
        let state = task["state"].as_str().unwrap_or("unknown");
        if !is_finished(state) {
            return Err(ErrorData::resource_not_found(
                format!(
                    "task {task_id} has not finished ({state}); its result is readable once it has"
                ),
                None,
            ));
        }
        let text = serde_json::to_string_pretty(task)
            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
        Ok(ResourceContents::text(text, uri).with_mime_type("application/json"))
    }

    async fn listed_logs(&self) -> Result<Vec<Resource>, ErrorData> {
        let reply = self
            .kernel
            .request(Opcode::LIST, &Value::Null, Wait::Quick)
            .await
            .map_err(kernel_error)?;
        let Value::Array(agents) = reply else {
            return Err(ErrorData::internal_error(
                format!("unexpected LIST reply from the kernel: {reply}"),
                None,
            ));
        };
        // The log by name is the live agent's, else the latest one's: one
        // resource per name.
        let mut names: Vec<&str> = agents.iter().filter_map(|a| a["name"].as_str()).collect();
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

    async fn listed_files(&self) -> Result<Vec<Resource>, ErrorData> {
        let mut sessions = unless_unavailable(caller_sessions(&self.kernel).await)?;
        sessions.sort_by(|a, b| {
            let used = |s: &Value| s["last_used_at"].as_str().unwrap_or("").to_owned();
            used(b).cmp(&used(a))
        });
        let mut listings = JoinSet::new();
        for (order, session) in sessions
            .iter()
            .filter_map(|s| s["session"].as_str())
            .take(MAX_LISTED_SESSIONS)
            .enumerate()
        {
            let kernel = self.kernel.clone();
            let session = session.to_owned();
            listings.spawn(async move {
                let files = session_files(&kernel, &session).await;
                (order, session, files)
            });
        }
        let mut listed = Vec::new();
        while let Some(joined) = listings.join_next().await {
            let (order, session, files) = joined.map_err(|err| {
                ErrorData::internal_error(format!("a session listing did not finish: {err}"), None)
            })?;
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

    async fn listed_results(&self) -> Result<Vec<Resource>, ErrorData> {
        let request = json!({ "op": "list", "limit": 2 * MAX_LISTED_TASKS });
        let reply = unless_unavailable(
            self.kernel
                .request(Opcode::TASK, &request, Wait::Quick)
                .await,
        )?;
        let tasks = reply["tasks"].as_array().cloned().unwrap_or_default();
        Ok(tasks
            .iter()
            .filter(|task| task["state"].as_str().is_some_and(is_finished))
            .filter_map(|task| {
                let task_id = task["task_id"].as_str()?;
                let kind = task["kind"].as_str().unwrap_or("a");
                let title = match task["label"].as_str() {
                    Some(label) => format!("Result of {kind} task {task_id} ({label})"),
                    None => format!("Result of {kind} task {task_id}"),
                };
                let uri = ResourceUri::TaskResult {
                    task_id: task_id.to_owned(),
                }
                .uri();
                Some(
                    Resource::new(uri, format!("tasks/{task_id}/result"))
                        .with_title(title)
                        .with_mime_type("application/json"),
                )
            })
            .take(MAX_LISTED_TASKS)
            .collect())
    }
}

/// A kernel reply, or for a subsystem this host does not have (EXEC
/// without namespaces, TASK without its store) nothing: the caller has
/// none of its resources, and the others are still listed.
fn unless_unavailable<T: Default>(reply: Result<T, String>) -> Result<T, ErrorData> {
    match reply {
        Ok(reply) => Ok(reply),
        Err(error) if refusal_code(&error) == Some("unavailable") => Ok(T::default()),
        Err(error) => Err(kernel_error(error)),
    }
}

/// Whether a task in this state has ended (and has its result).
fn is_finished(state: &str) -> bool {
    !matches!(state, "queued" | "running" | "unknown")
}

/// The caller's exec sessions as the kernel lists them.
async fn caller_sessions(kernel: &KernelLink) -> Result<Vec<Value>, String> {
    let reply = kernel
        .request(Opcode::EXEC, &json!({ "op": "sessions" }), Wait::Quick)
        .await?;
    match reply {
        Value::Object(mut reply) => match reply.remove("sessions") {
            Some(Value::Array(sessions)) => Ok(sessions),
            _ => Err("unexpected EXEC sessions reply from the kernel".to_owned()),
        },
        _ => Err("unexpected EXEC sessions reply from the kernel".to_owned()),
    }
}

/// A session's files, as (size, path under /workspace), at most
/// [`MAX_LISTED_FILES_PER_SESSION`] of them.
async fn session_files(kernel: &KernelLink, session: &str) -> Result<Vec<(u64, String)>, String> {
    let request = json!({
        "code": format!("{LIST_FILES_SCRIPT}{MAX_LISTED_FILES_PER_SESSION}"),
        "language": "bash",
        "session": session,
        "timeout_ms": FILE_RUN_TIMEOUT_MS,
    });
    let reply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    if reply["exit_code"] != 0 || reply["truncated"]["stdout"].as_u64().unwrap_or(0) > 0 {
        return Err(format!("listing session {session:?} failed: {reply}"));
    }
    let stdout = reply["stdout"].as_str().unwrap_or("");
    Ok(parse_listing(stdout))
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
    use super::*;

    #[test]
    fn uris_name_a_log_a_file_or_a_result() {
        assert_eq!(
            ResourceUri::parse("agentos://agents/worker-1/log"),
            Ok(ResourceUri::AgentLog {
                name: "worker-1".into()
            })
        );
        assert_eq!(
            ResourceUri::parse("agentos://sessions/s1/out/data%20file.csv"),
            Ok(ResourceUri::SessionFile {
                session: "s1".into(),
                path: "out/data file.csv".into()
            })
        );
        assert_eq!(
            ResourceUri::parse("agentos://tasks/t-00ff/result"),
            Ok(ResourceUri::TaskResult {
                task_id: "t-00ff".into()
            })
        );
    }

    #[test]
    fn a_uri_round_trips_through_its_encoding() {
        for path in ["a.txt", "dir/with space/ü.json", "odd%name#1?.bin"] {
            let resource = ResourceUri::SessionFile {
                session: "s".into(),
                path: path.into(),
            };
            assert_eq!(ResourceUri::parse(&resource.uri()), Ok(resource));
        }
    }

    #[test]
    fn paths_that_leave_the_workspace_are_refused() {
        for uri in [
            "agentos://sessions/s/../../etc/passwd",
            "agentos://sessions/s/%2E%2E/%2e%2e/etc/passwd",
            "agentos://sessions/s//etc/passwd",
            "agentos://sessions/s/a/./b",
            "agentos://sessions/s/",
            "agentos://sessions/s/a%00b",
            "agentos://sessions/s/a%2",
            "agentos://sessions/s/%FF",
        ] {
            assert!(ResourceUri::parse(uri).is_err(), "{uri}");
        }
    }

    #[test]
    fn other_uris_are_refused_with_what_is_served() {
        for uri in [
            "file:///etc/passwd",
            "agentos://agents/../log",
            "agentos://agents/a/b/log",
            "agentos://agents/a",
            "agentos://tasks/t-1",
            "agentos://tasks/t-1/result?x=1",
            "agentos://elsewhere/x",
            "agentos://sessions/../x",
            "",
        ] {
            let err = ResourceUri::parse(uri).unwrap_err();
            assert!(!err.is_empty(), "{uri}");
        }
        let err = ResourceUri::parse("https://example.com/").unwrap_err();
        assert!(err.contains(LOG_TEMPLATE), "{err}");
        let huge = format!("agentos://sessions/s/{}", "a".repeat(1 << 20));
        let err = ResourceUri::parse(&huge).unwrap_err();
        assert!(err.contains("at most 4096"), "{err}");
        assert!(err.len() < 200, "{err}");
    }

    #[test]
    fn text_comes_as_text_and_binary_as_base64() {
        let engine = base64::engine::general_purpose::STANDARD;
        let text = file_contents("u".into(), "notes.md", engine.encode("# hi")).unwrap();
        assert_eq!(
            text,
            ResourceContents::text("# hi", "u").with_mime_type("text/markdown")
        );
        let unknown = file_contents("u".into(), "README", engine.encode("hi")).unwrap();
        assert_eq!(
            unknown,
            ResourceContents::text("hi", "u").with_mime_type("text/plain")
        );
        let png = engine.encode([0x89, b'P', b'N', b'G']);
        let image = file_contents("u".into(), "plot.png", png.clone()).unwrap();
        assert_eq!(
            image,
            ResourceContents::blob(png, "u").with_mime_type("image/png")
        );
        let bytes = engine.encode([0xff, 0xfe, 0x00]);
        let binary = file_contents("u".into(), "data", bytes.clone()).unwrap();
        assert_eq!(
            binary,
            ResourceContents::blob(bytes, "u").with_mime_type("application/octet-stream")
        );
    }

    #[test]
    fn what_the_kernel_hides_is_not_found_and_bad_requests_are_invalid() {
        let code = |error: &str| kernel_error(error.to_owned()).code;
        let not_found = rmcp::model::ErrorCode::RESOURCE_NOT_FOUND;
        assert_eq!(code("no agent named \"x\" (not_found)"), not_found);
        assert_eq!(code("not yours (permission_denied)"), not_found);
        assert_eq!(
            code("TASK field `task_id`: bad (bad_request)"),
            rmcp::model::ErrorCode::INVALID_PARAMS
        );
        // Not reaching the kernel is no refusal of it.
        assert_eq!(
            code("cannot connect: No such file or directory (os error 2)"),
            rmcp::model::ErrorCode::INTERNAL_ERROR
        );
    }

    #[test]
    fn a_subsystem_the_host_lacks_lists_nothing() {
        let absent: Result<Vec<Value>, String> = Err("EXEC is off (unavailable)".to_owned());
        assert_eq!(unless_unavailable(absent), Ok(vec![]));
        let refused: Result<Vec<Value>, String> = Err("no (permission_denied)".to_owned());
        assert!(unless_unavailable(refused).is_err());
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
