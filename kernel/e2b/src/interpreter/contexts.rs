//! Code contexts: each is a process of the sandbox's session running
//! `context_server.py`, tagged `e2b-ctx:ID:LANGUAGE` (`:default` after
//! for a language's default context), so the kernel's process list is
//! the list of contexts, after a face restart too.

use agentos_proto::payload::{ProcStart, ProcState, ProcessInfo, Signal};
use serde::{Deserialize, Serialize};

use crate::envd::connect::ConnectError;
use crate::envd::process::{resolve, HOME};
use crate::envd::session::{Named, Session};

/// What a context's process runs.
const SERVER: &str = include_str!("context_server.py");

/// A context's tag starts so.
const TAG_PREFIX: &str = "e2b-ctx:";
/// And a default context's ends so.
const DEFAULT_SUFFIX: &str = ":default";

/// The languages a context may speak: Python keeps its globals, bash its
/// variables, functions and directory.
pub const LANGUAGES: [&str; 2] = ["python", "bash"];

/// A context, as the code interpreter's API lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    #[serde(skip)]
    pub default: bool,
    #[serde(skip)]
    pub pid: u32,
    #[serde(skip)]
    pub offset: u64,
}

impl Context {
    /// The context a process is, if it is one (and still running).
    fn of(process: &ProcessInfo) -> Option<Context> {
        if process.state != ProcState::Running {
            return None;
        }
        let rest = process.tag.as_deref()?.strip_prefix(TAG_PREFIX)?;
        let (rest, default) = match rest.strip_suffix(DEFAULT_SUFFIX) {
            Some(rest) => (rest, true),
            None => (rest, false),
        };
        let (id, language) = rest.split_once(':')?;
        Some(Context {
            id: id.to_owned(),
            language: language.to_owned(),
            cwd: process.cwd.clone(),
            default,
            pid: process.pid,
            offset: process.offset,
        })
    }

    fn tag(&self) -> String {
        let suffix = if self.default { DEFAULT_SUFFIX } else { "" };
        format!("{TAG_PREFIX}{}:{}{suffix}", self.id, self.language)
    }
}

/// `POST /contexts`'s body.
#[derive(Debug, Default, Deserialize)]
pub struct NewContext {
    pub language: Option<String>,
    pub cwd: Option<String>,
}

/// `language` as the code interpreter names it (none is python), if a
/// context may speak it.
pub fn language_of(language: Option<&str>) -> Result<String, ConnectError> {
    let language = language.unwrap_or("python").trim().to_ascii_lowercase();
    let language = if language.is_empty() {
        "python".to_owned()
    } else {
        language
    };
    if LANGUAGES.contains(&language.as_str()) {
        return Ok(language);
    }
    Err(ConnectError::invalid(format!(
        "language '{language}' is not supported by agentos e2b (it runs {})",
        LANGUAGES.join(", ")
    )))
}

/// The sandbox's contexts.
pub async fn list(session: &Session) -> Result<Vec<Context>, ConnectError> {
    Ok(session
        .processes()
        .await?
        .iter()
        .filter_map(Context::of)
        .collect())
}

/// The context `id`, if the sandbox has it.
pub async fn find(session: &Session, id: &str) -> Result<Option<Context>, ConnectError> {
    Ok(list(session)
        .await?
        .into_iter()
        .find(|context| context.id == id))
}

/// The default context of `language`, started if there is none.
pub async fn default_of(session: &Session, language: &str) -> Result<Context, ConnectError> {
    let found = list(session)
        .await?
        .into_iter()
        .find(|context| context.default && context.language == language);
    if let Some(context) = found {
        return Ok(context);
    }
    start(session, new_id()?, language, HOME, true).await
}

/// A new context.
pub async fn create(session: &Session, asked: NewContext) -> Result<Context, ConnectError> {
    let language = language_of(asked.language.as_deref())?;
    let cwd = resolve(asked.cwd.as_deref().unwrap_or(HOME));
    start(session, new_id()?, &language, &cwd, false).await
}

/// Starts a context's process.
async fn start(
    session: &Session,
    id: String,
    language: &str,
    cwd: &str,
    default: bool,
) -> Result<Context, ConnectError> {
    let mut context = Context {
        id,
        language: language.to_owned(),
        cwd: cwd.to_owned(),
        default,
        pid: 0,
        offset: 0,
    };
    let mut argv: Vec<String> = vec!["python3".into(), "-u".into(), "-c".into(), SERVER.into()];
    if language == "bash" {
        argv.push("bash".into());
    }
    let start = ProcStart {
        session: String::new(),
        argv,
        env: [("MPLBACKEND".to_owned(), "Agg".to_owned())].into(),
        cwd: Some(context.cwd.clone()),
        stdin: true,
        pty: None,
        tag: Some(context.tag()),
        timeout_ms: None,
    };
    let started = session.start(start).await?;
    context.pid = started.pid;
    Ok(context)
}

/// Ends a context's process, and answers once it is no longer listed (a
/// context removed is gone when the call returns).
pub async fn kill(session: &Session, context: &Context) -> Result<(), ConnectError> {
    session
        .signal(&Named::Pid(context.pid), Signal::SIGKILL)
        .await?;
    for _ in 0..100 {
        if find(session, &context.id).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(ConnectError::new(
        "deadline_exceeded",
        format!("context {} did not end", context.id),
    ))
}

/// Starts a context again, with the same id, language and directory: its
/// globals are gone.
pub async fn restart(session: &Session, context: &Context) -> Result<(), ConnectError> {
    // The tag is free once the old process has ended.
    kill(session, context).await?;
    start(
        session,
        context.id.clone(),
        &context.language,
        &context.cwd,
        context.default,
    )
    .await?;
    Ok(())
}

/// A new context id: 32 lower-case hex digits.
fn new_id() -> Result<String, ConnectError> {
    let random = agentos_http::random::bytes::<16>()
        .map_err(|err| ConnectError::new("internal", format!("reading random bytes: {err}")))?;
    Ok(agentos_http::random::hex(&random))
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::ProcEnd;

    use super::*;

    fn process(tag: &str, state: ProcState) -> ProcessInfo {
        ProcessInfo {
            pid: 4,
            tag: Some(tag.to_owned()),
            argv: vec!["python3".into()],
            cwd: "/home/user".into(),
            pty: false,
            stdin: true,
            state,
            end: ProcEnd::default(),
            started_at: String::new(),
            ended_at: None,
            offset: 9,
            dropped: 0,
        }
    }

    #[test]
    fn a_contexts_tag_names_it_and_other_processes_are_none() {
        let context = Context::of(&process("e2b-ctx:ab12:python:default", ProcState::Running))
            .expect("a context");
        assert_eq!(
            (context.id.as_str(), context.language.as_str()),
            ("ab12", "python")
        );
        assert!(context.default);
        assert_eq!(context.tag(), "e2b-ctx:ab12:python:default");
        assert!(Context::of(&process("e2b-ctx:ab12:python", ProcState::Ended)).is_none());
        assert!(Context::of(&process("web", ProcState::Running)).is_none());
        assert_eq!(language_of(None).unwrap(), "python");
        assert_eq!(language_of(Some(" Python ")).unwrap(), "python");
        assert_eq!(language_of(Some("bash")).unwrap(), "bash");
        assert!(language_of(Some("r"))
            .unwrap_err()
            .message
            .contains("not supported"));
    }
}
