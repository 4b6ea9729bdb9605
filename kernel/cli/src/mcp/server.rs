//! The MCP server: every tool, each reading its arguments and handing
//! them to the module of its concern (`agents`, `exec`, `think`,
//! `sessions`, `tasks`, `catalogue`, `prompt`), and the handler that
//! serves the tools, the resources (`resources`) and the task handles
//! (`long_work`). A kernel refusal becomes a tool error (`isError`) with
//! the kernel's message, so the model sees why and can try again.

use std::borrow::Cow;
use std::sync::Arc;

use agentos_proto::payload::{
    ClosedReply, ExecReply, HelloReply, HelloRequest, KillReply, LogsReply, PromptRequest,
    PromptResult, SessionsReply, SnapshotReply, SpawnReply, TaskCancelReply, TaskDispatchReply,
    TaskListReply, TaskReply, ThinkReply, ToolReply, ToolSearchReply,
};
use agentos_proto::Opcode;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolResponse, CallToolResult, CancelTaskParams, DiscoverResult, GetTaskParams,
    GetTaskResult, Implementation, JsonObject, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};

use super::arguments::{
    read, AgentLogsArguments, ExecArguments, KillArguments, ListAgentsArguments, NoArguments,
    SessionArguments, SnapshotArguments, SpawnArguments, TaskArguments, TaskDispatchArguments,
    TaskListArguments, TaskWaitArguments, ThinkArguments, ToolsCallArguments, ToolsSearchArguments,
};
use super::kernel::{KernelLink, Wait};
use super::results::{answer, AgentsOutput, RestoreOutput};
use super::tool_error::ToolError;
use super::{
    agents, catalogue, exec, long_work, prompt, resources, schema, sessions, tasks, think,
};

/// The newest MCP revision this server implements: 2026-07-28, stateless,
/// where a client may start with `server/discover` and every request
/// carries its own protocol version. Every older revision is served too.
const NEWEST_REVISION: ProtocolVersion = ProtocolVersion::V_2026_07_28;

/// What `initialize` answers a client that asks for a revision without
/// the handshake (or one this server does not know): the newest revision
/// that has it.
const NEWEST_HANDSHAKE_REVISION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// How long a client may cache the tool list and the discovery result
/// (2026-07-28's `ttlMs`). Both are fixed for a given `agentos` binary
/// and the same for every caller; the bound is for an upgrade.
const LISTS_FRESH_FOR_MS: u64 = 5 * 60 * 1000;

#[derive(Debug, Clone)]
pub struct AgentosServer {
    kernel: KernelLink,
    /// Every tool, built once: rmcp's handler looks a call's tool up in
    /// it, and building it (every tool's schemas and routes) per call cost
    /// more than the rest of the server's part of the call.
    tools: Arc<ToolRouter<AgentosServer>>,
    /// What `initialize` tells the client (`kernel_check`).
    instructions: Arc<str>,
}

#[tool_router]
impl AgentosServer {
    /// A server whose calls reach `kernel`, telling clients
    /// `instructions`.
    pub fn new(kernel: KernelLink, instructions: String) -> AgentosServer {
        AgentosServer {
            kernel,
            tools: Arc::new(Self::tool_router()),
            instructions: instructions.into(),
        }
    }

    #[tool(
        description = "Run Python or bash in an isolated sandbox; MCP tools are importable Python modules there.",
        input_schema = schema::input::<ExecArguments>(),
        output_schema = schema::output::<ExecReply>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn exec(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ToolError> {
        exec::exec(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "Ask the kernel's LLM.",
        input_schema = schema::input::<ThinkArguments>(),
        output_schema = schema::output::<ThinkReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = false)
    )]
    async fn think(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        think::think(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "Have the kernel's LLM solve a task by writing and running code until it can answer.",
        input_schema = schema::input::<PromptRequest>(),
        output_schema = schema::output::<PromptResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn run_prompt(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ToolError> {
        prompt::run_prompt(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "List your agents (all: ended ones too).",
        input_schema = schema::input::<ListAgentsArguments>(),
        output_schema = schema::output::<AgentsOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn list_agents(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::list(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Start an agent in its own sandbox from a Python script or a command.",
        input_schema = schema::input::<SpawnArguments>(),
        output_schema = schema::output::<SpawnReply>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn spawn(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::spawn(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Stop an agent (SIGTERM, then SIGKILL after a grace).",
        input_schema = schema::input::<KillArguments>(),
        output_schema = schema::output::<KillReply>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn kill(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::kill(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "The last lines of an agent's log (what it wrote to stdout and stderr).",
        input_schema = schema::input::<AgentLogsArguments>(),
        output_schema = schema::output::<LogsReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn agent_logs(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::logs(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "The kernel's version, features, LLM, and who you are to it.",
        input_schema = schema::input::<NoArguments>(),
        output_schema = schema::output::<HelloReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn status(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        let NoArguments {} = read(arguments)?;
        answer::<HelloReply>(&self.kernel, Opcode::HELLO, &HelloRequest {}, Wait::Quick).await
    }

    #[tool(
        description = "List your exec sessions, with their runs and workspace size.",
        input_schema = schema::input::<NoArguments>(),
        output_schema = schema::output::<SessionsReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn exec_sessions(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        let NoArguments {} = read(arguments)?;
        sessions::list(&self.kernel).await
    }

    #[tool(
        description = "Close an exec session: its interpreter ends and its /workspace is removed.",
        input_schema = schema::input::<SessionArguments>(),
        output_schema = schema::output::<ClosedReply>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn exec_close(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        sessions::close(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Save an exec session's /workspace files under a name, for exec_restore.",
        input_schema = schema::input::<SnapshotArguments>(),
        output_schema = schema::output::<SnapshotReply>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn exec_snapshot(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        sessions::snapshot(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Replace a session's /workspace with a snapshot and restart its interpreter.",
        input_schema = schema::input::<SnapshotArguments>(),
        output_schema = schema::output::<RestoreOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn exec_restore(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        sessions::restore(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Start code (exec) or a prompt (think) as a background task; returns its task_id.",
        input_schema = schema::input::<TaskDispatchArguments>(),
        output_schema = schema::output::<TaskDispatchReply>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn task_dispatch(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::dispatch(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "A task's state and progress.",
        input_schema = schema::input::<TaskArguments>(),
        output_schema = schema::output::<TaskReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_status(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::status(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Wait up to timeout_ms for a task to finish; the task, with its result once finished.",
        input_schema = schema::input::<TaskWaitArguments>(),
        output_schema = schema::output::<TaskReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_wait(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::wait(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Cancel a task: its running code is killed, a queued think withdrawn.",
        input_schema = schema::input::<TaskArguments>(),
        output_schema = schema::output::<TaskCancelReply>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn task_cancel(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::cancel(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "List your tasks, newest first (filter by state or kind; page with before).",
        input_schema = schema::input::<TaskListArguments>(),
        output_schema = schema::output::<TaskListReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_list(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::list(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Search the kernel's MCP tools by words: names and descriptions, full schemas with detail.",
        input_schema = schema::input::<ToolsSearchArguments>(),
        output_schema = schema::output::<ToolSearchReply>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn tools_search(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        catalogue::search(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Call a tool of one of the kernel's MCP servers (found with tools_search).",
        input_schema = schema::input::<ToolsCallArguments>(),
        output_schema = schema::output::<ToolReply>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn tools_call(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        catalogue::call(&self.kernel, read(arguments)?, &context).await
    }
}

#[tool_handler(router = self.tools)]
impl ServerHandler for AgentosServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("agentos", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(NEWEST_HANDSHAKE_REVISION)
            .with_instructions(self.instructions.as_ref())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        long_work::get(&self.kernel, request).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        long_work::cancel(&self.kernel, request).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        long_work::update(&self.kernel, request).await
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&NEWEST_REVISION))
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        )
        .with_ttl_ms(LISTS_FRESH_FOR_MS)
        .with_cache_scope(CacheScope::Public))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut result = ListToolsResult::with_all_items(self.tools.list_all());
        if has_cache_hints(&context) {
            result.ttl_ms = Some(LISTS_FRESH_FOR_MS);
            result.cache_scope = Some(CacheScope::Public);
        }
        Ok(result)
    }

    // Resources (resources.rs): the caller's agents' logs, exec session
    // files and finished tasks' results.

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut result = resources::list(&self.kernel).await?;
        // The caller's own agents, sessions and tasks change from one
        // moment to the next: a client should ask again, and never share
        // the answer with another user.
        if has_cache_hints(&context) {
            result.ttl_ms = Some(0);
            result.cache_scope = Some(CacheScope::Private);
        }
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut result = resources::templates();
        if has_cache_hints(&context) {
            result.ttl_ms = Some(LISTS_FRESH_FOR_MS);
            result.cache_scope = Some(CacheScope::Public);
        }
        Ok(result)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Ok(resources::read(&self.kernel, &request.uri).await?.into())
    }
}

/// Whether the request's revision has cache hints on list results: they
/// exist from 2026-07-28 on, and older clients get results without them.
fn has_cache_hints(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= NEWEST_REVISION)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::Value;

    use super::*;

    /// Every tool's schemas are objects whose properties are objects
    /// (MCP 2025-11-25 requires it of an output schema, and the
    /// TypeScript SDK's clients refuse the whole list otherwise), and none
    /// repeats what the list says once.
    #[test]
    fn every_schema_is_an_object_of_object_properties_said_once() {
        let server = AgentosServer::new(
            KernelLink::new(PathBuf::from("/nonexistent")),
            String::new(),
        );
        let tools = server.tools.list_all();
        assert_eq!(tools.len(), 19);
        for tool in tools {
            let output = tool.output_schema.expect("an output schema");
            for schema in [tool.input_schema, output] {
                let text = serde_json::to_string(&schema).expect("JSON");
                assert_eq!(
                    schema.get("type").and_then(Value::as_str),
                    Some("object"),
                    "{}: {text}",
                    tool.name
                );
                let properties = schema.get("properties").and_then(Value::as_object);
                for (name, property) in properties.into_iter().flatten() {
                    assert!(property.is_object(), "{}.{name}: {text}", tool.name);
                }
                for repeated in ["$schema", "\"format\"", "```", "\"success\""] {
                    assert!(!text.contains(repeated), "{}: {text}", tool.name);
                }
            }
        }
    }
}
