//! The tools for EXEC sessions: list, close, snapshot and restore them.
//! A session is made by `exec` with a `session` name.

use agentos_proto::payload::{ClosedReply, ExecCall, RestoredReply, SessionsReply, SnapshotReply};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;

use super::arguments::{SessionArguments, SnapshotArguments};
use super::kernel::{KernelLink, Wait};
use super::results::{answer, structured_json, RestoreOutput};
use super::tool_error::ToolError;

/// `exec_sessions`: the caller's sessions.
pub async fn list(kernel: &KernelLink) -> Result<CallToolResult, ToolError> {
    answer::<SessionsReply>(kernel, Opcode::EXEC, &ExecCall::Sessions, Wait::Quick).await
}

/// `exec_close`: ends a session's interpreter and removes its files.
pub async fn close(
    kernel: &KernelLink,
    arguments: SessionArguments,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Close {
        session: arguments.session,
    };
    answer::<ClosedReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// `exec_snapshot`: saves a session's `/workspace` under a name.
pub async fn snapshot(
    kernel: &KernelLink,
    arguments: SnapshotArguments,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Snapshot {
        session: arguments.session,
        name: arguments.name,
    };
    answer::<SnapshotReply>(kernel, Opcode::EXEC, &request, Wait::Quick).await
}

/// `exec_restore`: puts a snapshot back as a session's `/workspace`.
pub async fn restore(
    kernel: &KernelLink,
    arguments: SnapshotArguments,
) -> Result<CallToolResult, ToolError> {
    let request = ExecCall::Restore {
        session: arguments.session.clone(),
        name: arguments.name.clone(),
    };
    let reply: RestoredReply = kernel.request(Opcode::EXEC, &request, Wait::Quick).await?;
    Ok(structured_json(&RestoreOutput {
        session: arguments.session,
        name: arguments.name,
        restored: true,
        left_out: reply.left_out,
    })?)
}
