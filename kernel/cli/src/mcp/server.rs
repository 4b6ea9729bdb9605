//! The MCP tools: each reads its arguments, makes one kernel request and
//! shapes the reply. A kernel refusal becomes a tool error (`isError`)
//! with the kernel's message, so the model sees why and can try again.

use std::borrow::Cow;
use std::sync::Arc;

use agentos_proto::payload::TaskKind;
use agentos_proto::Opcode;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
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
use serde_json::{json, Value};

use super::arguments::{
    read, AgentLogsArguments, ExecArguments, KillArguments, ListAgentsArguments, NoArguments,
    SpawnArguments, ThinkArguments,
};
use super::kernel::{KernelLink, Wait};
use super::long_work::{self, Answer};
use super::results::{
    from_reply, structured, structured_json, AgentLogsOutput, AgentsOutput, ExecOutput, KillOutput,
    SpawnOutput, StatusOutput, ThinkOutput,
};
use super::trace::CallerTrace;

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
    pub(super) kernel: KernelLink,
    /// Every tool, built once: rmcp's handler looks a call's tool up in
    /// it, and building it (every tool's schemas and routes) per call cost
    /// more than the rest of the server's part of the call.
    tools: Arc<ToolRouter<AgentosServer>>,
}

impl AgentosServer {
    /// Sends `request` and answers the tool call with the kernel's reply,
    /// read as `T`, as structured content.
    pub(super) async fn answer<T>(
        &self,
        opcode: Opcode,
        request: &Value,
        wait: Wait,
    ) -> Result<CallToolResult, String>
    where
        T: for<'de> serde::Deserialize<'de> + serde::Serialize,
    {
        let reply = self.kernel.request(opcode, request, wait).await?;
        structured_json(&from_reply::<T>(reply)?)
    }
}

#[tool_router]
impl AgentosServer {
    pub fn new(kernel: KernelLink) -> AgentosServer {
        AgentosServer {
            kernel,
            tools: Arc::new(Self::all_tools()),
        }
    }

    /// Every tool: these, and those of the other tool modules.
    fn all_tools() -> ToolRouter<AgentosServer> {
        Self::tool_router()
            + Self::session_tools()
            + Self::task_tools()
            + Self::catalogue_tools()
            + Self::prompt_tools()
    }

    #[tool(
        description = "Run Python or bash in an isolated sandbox; MCP tools are importable Python modules there.",
        input_schema = input_schema!(ExecArguments),
        output_schema = schema_for_output::<ExecOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn exec(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, String> {
        let arguments: ExecArguments = read(arguments)?;
        let mut request = json!({
            "code": arguments.code,
            "language": arguments.language.as_str(),
        });
        if let Some(session) = arguments.session {
            request["session"] = session.into();
        }
        if let Some(timeout_ms) = arguments.timeout_ms {
            request["timeout_ms"] = timeout_ms.into();
        }
        if !arguments.env.is_empty() {
            request["env"] = json!(arguments.env);
        }
        if let Some(network) = &arguments.network {
            request["network"] = network.to_request();
        }
        let trace = CallerTrace::of(&context);
        let answer = Answer::asked_for(&context);
        if !matches!(answer, Answer::AtTheEnd) {
            match long_work::dispatch(&self.kernel, TaskKind::Exec, request.clone(), &trace).await {
                Ok(task_id) => {
                    return long_work::answer_for(&self.kernel, &task_id, answer, &context).await
                }
                // Without tasks the run still runs: as a plain EXEC,
                // without a task handle or progress.
                Err(err) if long_work::tasks_refused(&err) => {}
                Err(err) => return Err(err),
            }
        }
        // The fast path, one EXEC. A client that cancels the call closes
        // its connection, and the kernel kills the run.
        trace.add_to(&mut request);
        let reply = self
            .kernel
            .request_until(
                Opcode::EXEC,
                &request,
                Wait::AsLongAsTheKernel,
                context.ct.cancelled(),
            )
            .await?;
        let output: ExecOutput = from_reply(reply)?;
        let text = output.text();
        structured(&output, text).map(CallToolResponse::from)
    }

    #[tool(
        description = "Ask the kernel's LLM.",
        input_schema = input_schema!(ThinkArguments),
        output_schema = schema_for_output::<ThinkOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = false)
    )]
    async fn think(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let arguments: ThinkArguments = read(arguments)?;
        let mut request = json!({ "prompt": arguments.prompt });
        if let Some(max_tokens) = arguments.max_tokens {
            request["max_tokens"] = max_tokens.into();
        }
        CallerTrace::of(&context).add_to(&mut request);
        // A THINK still queued when the client cancels is dropped with its
        // connection, and never reaches the model.
        let reply = self
            .kernel
            .request_until(
                Opcode::THINK,
                &request,
                Wait::AsLongAsTheKernel,
                context.ct.cancelled(),
            )
            .await?;
        let output: ThinkOutput = from_reply(reply)?;
        let text = output.content.clone();
        structured(&output, text)
    }

    #[tool(
        description = "List your agents (all: ended ones too).",
        input_schema = input_schema!(ListAgentsArguments),
        output_schema = schema_for_output::<AgentsOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn list_agents(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: ListAgentsArguments = read(arguments)?;
        let reply = self
            .kernel
            .request(Opcode::LIST, &Value::Null, Wait::Quick)
            .await?;
        let Value::Array(agents) = reply else {
            return Err(format!("unexpected LIST reply from the kernel: {reply}"));
        };
        let agents = agents
            .into_iter()
            .filter(|agent| arguments.all || agent["running"] == true)
            .collect();
        structured_json(&AgentsOutput { agents })
    }

    #[tool(
        description = "Start an agent in its own sandbox from a Python script or a command.",
        input_schema = input_schema!(SpawnArguments),
        output_schema = schema_for_output::<SpawnOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn spawn(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: SpawnArguments = read(arguments)?;
        let request = spawn_request(arguments)?;
        self.answer::<SpawnOutput>(Opcode::SPAWN, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "Stop an agent (SIGTERM, then SIGKILL after a grace).",
        input_schema = input_schema!(KillArguments),
        output_schema = schema_for_output::<KillOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn kill(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: KillArguments = read(arguments)?;
        let request = match (arguments.name, arguments.id) {
            (Some(name), None) => json!({ "name": name }),
            (None, Some(id)) => json!({ "id": id }),
            _ => return Err("give exactly one of the arguments name and id".to_owned()),
        };
        self.answer::<KillOutput>(Opcode::KILL, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "The kernel's version, features, LLM, and who you are to it.",
        input_schema = input_schema!(NoArguments),
        output_schema = schema_for_output::<StatusOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn status(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let NoArguments {} = read(arguments)?;
        self.answer::<StatusOutput>(Opcode::HELLO, &Value::Null, Wait::Quick)
            .await
    }

    #[tool(
        description = "The last lines of an agent's log (what it wrote to stdout and stderr).",
        input_schema = input_schema!(AgentLogsArguments),
        output_schema = schema_for_output::<AgentLogsOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn agent_logs(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: AgentLogsArguments = read(arguments)?;
        let mut request = match (arguments.name, arguments.id) {
            (Some(name), None) => json!({ "name": name }),
            (None, Some(id)) => json!({ "id": id }),
            _ => return Err("give exactly one of the arguments name and id".to_owned()),
        };
        if let Some(lines) = arguments.lines {
            request["lines"] = lines.into();
        }
        let reply = self
            .kernel
            .request(Opcode::LOGS, &request, Wait::Quick)
            .await?;
        let output: AgentLogsOutput = from_reply(reply)?;
        let text = output.text.clone();
        structured(&output, text)
    }
}

/// The SPAWN request for `arguments`, in the kernel's terms.
fn spawn_request(arguments: SpawnArguments) -> Result<Value, String> {
    let mut request = json!({ "name": arguments.name });
    match (arguments.script, arguments.command) {
        (Some(script), None) => {
            // The kernel resolves nothing against this server's directory,
            // so a relative script path is made absolute here, as the CLI
            // does.
            let script =
                std::path::absolute(&script).map_err(|err| format!("argument script: {err}"))?;
            request["script"] = json!(script);
            request["args"] = json!(arguments.args);
        }
        (None, Some(command)) => {
            if command.is_empty() {
                return Err("argument command: give the program to run".to_owned());
            }
            if !arguments.args.is_empty() {
                return Err(
                    "argument args: goes with script; put a command's arguments in command"
                        .to_owned(),
                );
            }
            request["command"] = json!(command);
        }
        _ => return Err("give exactly one of the arguments script and command".to_owned()),
    }
    if let Some(limits) = arguments.limits {
        let mut kernel_limits = serde_json::Map::new();
        if let Some(memory) = limits.memory_bytes {
            kernel_limits.insert("memory".into(), memory.into());
        }
        if let Some(cpus) = limits.cpus {
            if !(cpus > 0.0 && cpus.is_finite()) {
                return Err("argument limits.cpus: must be a positive number".to_owned());
            }
            // The kernel takes a CFS quota per period, as the CLI's --cpus.
            kernel_limits.insert("cpu_period".into(), 100_000.into());
            kernel_limits.insert(
                "cpu_quota".into(),
                ((cpus * 100_000.0).round() as u64).into(),
            );
        }
        if let Some(max_pids) = limits.max_pids {
            kernel_limits.insert("max_pids".into(), max_pids.into());
        }
        request["limits"] = kernel_limits.into();
    }
    if let Some(network) = &arguments.network {
        request["network"] = network.to_request();
    }
    Ok(request)
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
            .with_instructions(
                "AgentOS: isolated code execution (exec, exec_* for sessions), agents \
                 (spawn, list_agents, kill, agent_logs), the kernel's LLM (think, and \
                 run_prompt: it writes and runs code until it can answer), \
                 background tasks (task_*), and the kernel's MCP tools (tools_search, \
                 tools_call). Calls act as the user who started this server.",
            )
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
        let mut result = self.list_resources_of_caller().await?;
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
        let mut result = Self::resource_templates();
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
        Ok(self.read_resource_at(&request.uri).await?.into())
    }
}

/// Whether the request's revision has cache hints on list results: they
/// exist from 2026-07-28 on, and older clients get results without them.
fn has_cache_hints(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= NEWEST_REVISION)
}
