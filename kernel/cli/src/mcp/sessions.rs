//! `exec_session`: list, close, snapshot, restore, pause, resume and
//! hibernate EXEC sessions, one tool with an `op`. A session is made by
//! `exec` with a `session` name, or by `restore` `into` a new one (a
//! branch of a snapshot).

use agentos_proto::payload::{
    ClosedReply, ExecCall, PauseRequest, RestoredReply, SessionPauseReply, SessionsReply,
    SnapshotReply,
};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;

use super::arguments::{SessionArguments, SessionCall, SessionOp};
use super::kernel::{KernelLink, Wait};
use super::results::{answer, structured_json, RestoreOutput};
use super::tool_error::ToolError;

/// `exec_session`: the op the arguments name, answered as the kernel
/// answers it.
pub async fn session(
    kernel: &KernelLink,
    arguments: SessionArguments,
) -> Result<CallToolResult, ToolError> {
    match arguments.call()? {
        SessionCall::List => list(kernel).await,
        SessionCall::Close { session } => close(kernel, session).await,
        SessionCall::Snapshot {
            session,
            name,
            state,
        } => snapshot(kernel, session, name, state).await,
        SessionCall::Restore {
            session,
            name,
            into,
        } => restore(kernel, session, name, into).await,
        SessionCall::Freeze { session, op } => freeze(kernel, session, op).await,
    }
}

/// PAUSE (or, `hibernate`, PAUSE with `hibernate`) or RESUME of a
/// session.
async fn freeze(
    kernel: &KernelLink,
    session: String,
    op: SessionOp,
) -> Result<CallToolResult, ToolError> {
    let request = PauseRequest {
        session: Some(session),
        hibernate: op == SessionOp::Hibernate,
        ..PauseRequest::default()
    };
    let opcode = if op == SessionOp::Resume {
        Opcode::RESUME
    } else {
        Opcode::PAUSE
    };
    answer::<SessionPauseReply>(kernel, opcode, &request, Wait::Quick).await
}

/// The caller's sessions.
async fn list(kernel: &KernelLink) -> Result<CallToolResult, ToolError> {
    answer::<SessionsReply>(
        kernel,
        Opcode::EXEC,
        &ExecCall::Sessions { usage: false },
        Wait::Quick,
    )
    .await
}

/// Ends a session's interpreter and removes its files.
async fn close(kernel: &KernelLink, session: String) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Close { session };
    answer::<ClosedReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// Saves a session's files under a name (with `state`, its interpreter's
/// globals too).
async fn snapshot(
    kernel: &KernelLink,
    session: String,
    name: String,
    state: bool,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Snapshot {
        session,
        name,
        state,
    };
    answer::<SnapshotReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// Puts a snapshot back as a session's files, or makes session `into`
/// from it.
async fn restore(
    kernel: &KernelLink,
    session: String,
    name: String,
    into: Option<String>,
) -> Result<CallToolResult, ToolError> {
    let branched = into.is_some();
    let request = ExecCall::Restore {
        session: session.clone(),
        name: name.clone(),
        into,
    };
    let reply: RestoredReply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    Ok(structured_json(&RestoreOutput {
        session: reply.session,
        name,
        restored: true,
        from: branched.then_some(session),
        left_out: reply.left_out,
    })?)
}
