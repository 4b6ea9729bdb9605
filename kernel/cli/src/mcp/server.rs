//! The MCP server: every tool, each reading its arguments and handing
//! them to the module of its concern (`agents`, `exec`, `think`,
//! `sessions`, `tasks`, `catalogue`, `prompt`), and the handler that
//! serves the tools, the resources (`resources`) and the task handles
//! (`long_work`). A kernel refusal becomes a tool error (`isError`) with
//! the kernel's message, so the model sees why and can try again.
//!
//! A tool's annotations write a hint only where it is not MCP's default
//! (`readOnlyHint` false, `destructiveHint` true, `idempotentHint` false,
//! `openWorldHint` true), which a client assumes of a hint left out:
//! every client reads them all, so `annotations()` says "may change,
//! destroy, and have an effect again" in two bytes.

use std::borrow::Cow;
use std::sync::Arc;

use agentos_proto::payload::{HelloReply, HelloRequest, PromptRequest, ToolDescription};
use agentos_proto::Opcode;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    DiscoverResult, GetTaskParams, GetTaskResult, Implementation, JsonObject,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};

use super::arguments::{
    read, AgentLogsArguments, ExecArguments, KillArguments, ListAgentsArguments, MessagesArguments,
    NoArguments, SessionArguments, SpawnArguments, StateArguments, TaskArguments,
    TaskDispatchArguments, TaskListArguments, TaskWaitArguments, ThinkArguments,
    ToolsCallArguments, ToolsSearchArguments,
};
use super::kernel::{KernelLink, Wait};
use super::results::answer;
use super::tool_error::ToolError;
use super::{
    agents, catalogue, exec, long_work, prompt, resources, schema, sessions, tasks, think, together,
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
        description = "Run Python (default) or bash in a sandbox. Python has `tools` pre-imported: tools.<server>.<tool>(arg=value) calls an MCP server's tool (- in names is _); tools.search(\"words\") finds them.",
        input_schema = schema::input::<ExecArguments>(),
        output_schema = schema::output(),
        annotations(destructive_hint = false)
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
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false)
    )]
    async fn think(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        think::think(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "The kernel's LLM writes and runs code until it can answer.",
        input_schema = schema::input_undescribed::<PromptRequest>(),
        output_schema = schema::output(),
        annotations(destructive_hint = false)
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
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn list_agents(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::list(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Run a script or a command as an agent in its own sandbox.",
        input_schema = schema::input::<SpawnArguments>(),
        output_schema = schema::output(),
        annotations(destructive_hint = false)
    )]
    async fn spawn(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::spawn(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Stop an agent, by name or id.",
        input_schema = schema::input::<KillArguments>(),
        output_schema = schema::output(),
        annotations(idempotent_hint = true)
    )]
    async fn kill(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::kill(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "An agent's last output lines, by name or id.",
        input_schema = schema::input::<AgentLogsArguments>(),
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn agent_logs(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        agents::logs(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "The kernel's version, features, LLM and who you are to it.",
        input_schema = schema::input::<NoArguments>(),
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn status(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        let NoArguments {} = read(arguments)?;
        answer::<HelloReply>(&self.kernel, Opcode::HELLO, &HelloRequest {}, Wait::Quick).await
    }

    // One set of hints for every op, the most cautious of theirs: close
    // and restore destroy, snapshot does not repeat without effect.
    #[tool(
        description = "List, close, snapshot (state: globals too), restore (into: branch).",
        input_schema = schema::input::<SessionArguments>(),
        output_schema = schema::output(),
        annotations()
    )]
    async fn exec_session(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        sessions::session(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Run code (as exec) or a prompt (as think) as a task.",
        input_schema = schema::input::<TaskDispatchArguments>(),
        output_schema = schema::output(),
        annotations(destructive_hint = false)
    )]
    async fn task_dispatch(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::dispatch(&self.kernel, read(arguments)?, &context).await
    }

    #[tool(
        description = "A task, its result once ended; waits up to timeout_ms (none: no wait).",
        input_schema = schema::input::<TaskWaitArguments>(),
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_wait(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::wait(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Cancel a task.",
        input_schema = schema::input::<TaskArguments>(),
        output_schema = schema::output(),
        annotations(idempotent_hint = true)
    )]
    async fn task_cancel(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::cancel(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "List your tasks, newest first (before: older than a task_id).",
        input_schema = schema::input::<TaskListArguments>(),
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_list(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        tasks::list(&self.kernel, read(arguments)?).await
    }

    // One set of hints for every op, the most cautious: delete destroys.
    #[tool(
        description = "Keys with JSON values shared with your agents: op get, set, delete, list.",
        input_schema = schema::input::<StateArguments>(),
        output_schema = schema::output(),
        annotations()
    )]
    async fn state(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        together::state(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Message an agent (op send: to, message) or read yours (op recv).",
        input_schema = schema::input::<MessagesArguments>(),
        output_schema = schema::output(),
        annotations(destructive_hint = false)
    )]
    async fn messages(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        together::messages(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Find MCP tools by words (detail: with schemas).",
        input_schema = schema::input::<ToolsSearchArguments>(),
        output_schema = schema::output(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn tools_search(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, ToolError> {
        catalogue::search(&self.kernel, read(arguments)?).await
    }

    #[tool(
        description = "Call a tool found by tools_search.",
        input_schema = schema::input::<ToolsCallArguments>(),
        output_schema = schema::output(),
        annotations()
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

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tools.has_route(&request.name) {
            // A model told of the kernel's MCP servers often calls their
            // tools by name here: say how they are reached.
            let kernel_tool = catalogue::named(&self.kernel, &request.name).await;
            return Err(ErrorData::invalid_params(
                unknown_tool(&request.name, kernel_tool.as_ref()),
                None,
            ));
        }
        self.tools
            .call(ToolCallContext::new(self, request, context))
            .await
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

/// What a call of a tool this server does not have is told: the name is
/// not one of its tools, and how the kernel's MCP servers' tools are
/// reached — the very call, when `name` is one of them — or that code is
/// run with exec.
fn unknown_tool(name: &str, kernel_tool: Option<&ToolDescription>) -> String {
    match kernel_tool {
        Some(tool) => format!(
            "no tool {name:?} here: it is the {server} server's tool {tool_name:?}. Call it \
             with tools_call(server={server:?}, tool={tool_name:?}, arguments={{...}}), or \
             from exec's Python as tools.{server}.{python_name}(...)",
            server = tool.server,
            tool_name = tool.name,
            python_name = tool.name.replace('-', "_"),
        ),
        None => format!(
            "no tool {name:?} here. To compute something, run Python with exec. The \
             kernel's MCP servers' tools are called with tools_call (server, tool, \
             arguments; tools_search finds them), or from exec's Python as \
             tools.<server>.<tool>(...)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::Value;

    use super::*;

    /// The most bytes the tools/list answer may take, as one JSON-RPC
    /// line at the newest revision (whose cache hints make it the longer).
    /// Its floor, with every tool's output schema and annotations, is
    /// about 2 500 bytes before any name, description or argument; the
    /// seventeen tools (`state` and `messages` the latest, then `exec`'s
    /// `volumes`, then `exec_session`'s `state` and `into` and its `pause`,
    /// `resume` and `hibernate`) take some 6 996. Removing a snapshot is
    /// left to the CLI and the SDK: it would not fit.
    const TOOL_LIST_BUDGET: usize = 7_000;

    /// Every tool, and its hints with MCP's defaults applied: read-only,
    /// destructive, idempotent.
    const TOOLS: [(&str, bool, bool, bool); 17] = [
        ("agent_logs", true, false, true),
        ("exec", false, false, false),
        ("exec_session", false, true, false),
        ("kill", false, true, true),
        ("list_agents", true, false, true),
        ("messages", false, false, false),
        ("run_prompt", false, false, false),
        ("spawn", false, false, false),
        ("state", false, true, false),
        ("status", true, false, true),
        ("task_cancel", false, true, true),
        ("task_dispatch", false, false, false),
        ("task_list", true, false, true),
        ("task_wait", true, false, true),
        ("think", true, false, false),
        ("tools_call", false, true, false),
        ("tools_search", true, false, true),
    ];

    fn server() -> AgentosServer {
        AgentosServer::new(
            crate::mcp::kernel::link(PathBuf::from("/nonexistent")),
            String::new(),
        )
    }

    /// Every tool's schemas are objects whose properties are objects
    /// (MCP 2025-11-25 requires it of an output schema, and the
    /// TypeScript SDK's clients refuse the whole list otherwise), the
    /// output schema nothing more, and neither says what is left to the
    /// server's reading of a call.
    #[test]
    fn every_schema_is_an_object_of_object_properties_said_once() {
        let tools = server().tools.list_all();
        let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
        let expected: Vec<&str> = TOOLS.iter().map(|(name, ..)| *name).collect();
        assert_eq!(names, expected);
        for tool in tools {
            let output = tool.output_schema.expect("an output schema");
            let output = serde_json::to_string(&output).expect("JSON");
            assert_eq!(output, r#"{"type":"object"}"#, "{}", tool.name);
            let input = &tool.input_schema;
            let text = serde_json::to_string(input).expect("JSON");
            assert_eq!(
                input.get("type").and_then(Value::as_str),
                Some("object"),
                "{}: {text}",
                tool.name
            );
            let properties = input.get("properties").and_then(Value::as_object);
            for (name, property) in properties.into_iter().flatten() {
                assert!(property.is_object(), "{}.{name}: {text}", tool.name);
            }
            for left_out in [
                "$schema",
                "$defs",
                "\"format\"",
                "```",
                "\"null\"",
                "additionalProperties",
                "\"minimum\"",
                "\"maximum\"",
                "\"default\"",
            ] {
                assert!(!text.contains(left_out), "{}: {text}", tool.name);
            }
        }
    }

    /// Every tool has annotations, which write a hint only where it is not
    /// MCP's default (a client reads a hint left out as the default), and
    /// whose hints, defaults applied, are the tool's.
    #[test]
    fn every_tool_writes_only_the_hints_that_differ_from_the_defaults() {
        for tool in server().tools.list_all() {
            let hints = tool.annotations.expect("annotations");
            let (_, read_only, destructive, idempotent) = TOOLS
                .iter()
                .find(|(name, ..)| *name == tool.name)
                .expect("a known tool");
            for (hint, default) in [
                (hints.read_only_hint, false),
                (hints.destructive_hint, true),
                (hints.idempotent_hint, false),
                (hints.open_world_hint, true),
            ] {
                assert_ne!(hint, Some(default), "{}: {hints:?}", tool.name);
            }
            let applied = (
                hints.read_only_hint.unwrap_or(false),
                hints.destructive_hint.unwrap_or(true),
                hints.idempotent_hint.unwrap_or(false),
            );
            assert_eq!(
                applied,
                (*read_only, *destructive, *idempotent),
                "{}",
                tool.name
            );
            assert_eq!(hints.open_world_hint, None, "{}", tool.name);
        }
    }

    /// The whole tools/list answer, as one JSON-RPC line, stays small:
    /// many clients put all of it before their model at every turn.
    #[test]
    fn the_tool_list_fits_in_its_budget() {
        let listed = ListToolsResult::with_all_items(server().tools.list_all())
            .with_ttl_ms(LISTS_FRESH_FOR_MS)
            .with_cache_scope(CacheScope::Public);
        let line = serde_json::json!({"jsonrpc": "2.0", "id": 2, "result": listed});
        let bytes = serde_json::to_string(&line).expect("JSON").len() + 1;
        assert!(bytes <= TOOL_LIST_BUDGET, "tools/list is {bytes} bytes");
    }

    /// `exec`'s description teaches the `tools` module a run has.
    #[test]
    fn exec_says_how_its_python_calls_and_finds_tools() {
        let tools = server().tools.list_all();
        let exec = tools
            .iter()
            .find(|tool| tool.name == "exec")
            .and_then(|tool| tool.description.as_deref())
            .expect("exec's description");
        for form in ["pre-imported", "tools.<server>.<tool>(", "tools.search(\""] {
            assert!(exec.contains(form), "{form}: {exec}");
        }
    }
}
