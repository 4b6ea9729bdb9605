//! The kernel's tool catalogue: search the tools of every MCP server the
//! kernel runs, and call them, so that this one server is a gateway to all.

use agentos_proto::Opcode;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use serde_json::json;

use super::arguments::{read, ToolsCallArguments, ToolsSearchArguments};
use super::kernel::Wait;
use super::results::{ToolsCallOutput, ToolsSearchOutput};
use super::server::AgentosServer;
use super::trace::CallerTrace;

#[tool_router(router = catalogue_tools, vis = "pub(super)")]
impl AgentosServer {
    #[tool(
        description = "Search the kernel's MCP tools by words: names and descriptions, full schemas with detail.",
        input_schema = input_schema!(ToolsSearchArguments),
        output_schema = schema_for_output::<ToolsSearchOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn tools_search(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: ToolsSearchArguments = read(arguments)?;
        let detail = if arguments.detail { "full" } else { "summary" };
        let mut request = json!({ "op": "search", "query": arguments.query, "detail": detail });
        if let Some(limit) = arguments.limit {
            request["limit"] = limit.into();
        }
        self.answer::<ToolsSearchOutput>(Opcode::TOOL, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "Call a tool of one of the kernel's MCP servers (found with tools_search).",
        input_schema = input_schema!(ToolsCallArguments),
        output_schema = schema_for_output::<ToolsCallOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn tools_call(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let arguments: ToolsCallArguments = read(arguments)?;
        let mut request = json!({
            "op": "call",
            "server": arguments.server,
            "tool": arguments.tool,
            "arguments": arguments.arguments,
        });
        if let Some(timeout_ms) = arguments.timeout_ms {
            request["timeout_ms"] = timeout_ms.into();
        }
        CallerTrace::of(&context).add_to(&mut request);
        // The kernel ends the call at its timeout.
        self.answer::<ToolsCallOutput>(Opcode::TOOL, &request, Wait::AsLongAsTheKernel)
            .await
    }
}
