//! The `think` tool: one question to the kernel's LLM.

use agentos_proto::payload::{ThinkReply, ThinkRequest};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::arguments::ThinkArguments;
use super::kernel::{KernelLink, Wait};
use super::results::structured;
use super::tool_error::ToolError;
use super::trace::CallerTrace;

/// `think`: the LLM's answer to the prompt.
pub async fn think(
    kernel: &KernelLink,
    arguments: ThinkArguments,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ToolError> {
    let request = ThinkRequest {
        prompt: Some(arguments.prompt),
        max_tokens: arguments.max_tokens,
        trace: CallerTrace::of(context).traceparent(),
        ..ThinkRequest::default()
    };
    // A THINK still queued when the client cancels is dropped with its
    // connection, and never reaches the model.
    let reply: ThinkReply = kernel
        .request_until(
            Opcode::THINK,
            &request,
            Wait::AsLongAsTheKernel,
            context.ct.cancelled(),
        )
        .await?;
    let text = reply.content.clone();
    Ok(structured(&reply, text)?)
}
