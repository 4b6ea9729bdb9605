//! The kernel's tool catalogue: search the tools of every MCP server the
//! kernel runs, and call them, so that this one server is a gateway to all.
//!
//! A call's arguments and its result are the called tool's own, JSON of
//! any shape: they pass through here as they are (`ToolsCallArguments`'
//! `arguments`, `ToolReply`'s `result` and `content`), never read.

use agentos_proto::payload::{
    Detail, ToolCall, ToolDescription, ToolReply, ToolSearchReply, DEFAULT_SEARCH_LIMIT,
};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::arguments::{ToolsCallArguments, ToolsSearchArguments};
use super::kernel::{KernelLink, Wait};
use super::results::answer;
use super::tool_error::ToolError;
use super::trace::CallerTrace;

/// `tools_search`: the tools that best match the words, best first.
pub async fn search(
    kernel: &KernelLink,
    arguments: ToolsSearchArguments,
) -> Result<CallToolResult, ToolError> {
    let request = ToolCall::Search {
        query: arguments.query,
        detail: if arguments.detail {
            Detail::Full
        } else {
            Detail::Summary
        },
        limit: arguments.limit.map_or(DEFAULT_SEARCH_LIMIT, u64::from),
    };
    answer::<ToolSearchReply>(kernel, Opcode::TOOL, &request, Wait::Quick).await
}

/// `tools_call`: one call of one of the kernel's tools.
pub async fn call(
    kernel: &KernelLink,
    arguments: ToolsCallArguments,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ToolError> {
    let request = ToolCall::Call {
        server: arguments.server,
        tool: arguments.tool,
        arguments: arguments.arguments,
        timeout_ms: arguments.timeout_ms,
        trace: CallerTrace::of(context).traceparent(),
    };
    // The kernel ends the call at its timeout.
    answer::<ToolReply>(kernel, Opcode::TOOL, &request, Wait::AsLongAsTheKernel).await
}

/// The kernel's tool that `name` names, with `-` and `_` taken as one (a
/// model writes `get_sum` for `get-sum`), if the caller may use one.
pub async fn named(kernel: &KernelLink, name: &str) -> Option<ToolDescription> {
    let words = name.replace(['-', '_'], " ");
    let request = ToolCall::Search {
        query: words.clone(),
        detail: Detail::Summary,
        limit: DEFAULT_SEARCH_LIMIT,
    };
    let found: ToolSearchReply = kernel
        .request(Opcode::TOOL, &request, Wait::Quick)
        .await
        .ok()?;
    found
        .tools
        .into_iter()
        .find(|tool| tool.name.replace(['-', '_'], " ") == words)
}
