//! `exec_session`: list, close, snapshot and restore EXEC sessions, one
//! tool with an `op`. A session is made by `exec` with a `session` name.

use agentos_proto::payload::{ClosedReply, ExecCall, RestoredReply, SessionsReply, SnapshotReply};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;

use super::arguments::{SessionArguments, SessionCall};
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
        SessionCall::Snapshot { session, name } => snapshot(kernel, session, name).await,
        SessionCall::Restore { session, name } => restore(kernel, session, name).await,
    }
}

/// The caller's sessions.
async fn list(kernel: &KernelLink) -> Result<CallToolResult, ToolError> {
    answer::<SessionsReply>(kernel, Opcode::EXEC, &ExecCall::Sessions, Wait::Quick).await
}

/// Ends a session's interpreter and removes its files.
async fn close(kernel: &KernelLink, session: String) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Close { session };
    answer::<ClosedReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// Saves a session's `/workspace` under a name.
async fn snapshot(
    kernel: &KernelLink,
    session: String,
    name: String,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Snapshot { session, name };
    answer::<SnapshotReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// Puts a snapshot back as a session's `/workspace`.
async fn restore(
    kernel: &KernelLink,
    session: String,
    name: String,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Restore {
        session: session.clone(),
        name: name.clone(),
    };
    let reply: RestoredReply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    Ok(structured_json(&RestoreOutput {
        session,
        name,
        restored: true,
        left_out: reply.left_out,
    })?)
}
