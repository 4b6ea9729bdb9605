//! The tools for EXEC sessions: list, close, snapshot and restore them.
//! A session is made by `exec` with a `session` name.

use agentos_proto::Opcode;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::{tool, tool_router};
use serde_json::json;

use super::arguments::{read, NoArguments, SessionArguments, SnapshotArguments};
use super::kernel::Wait;
use super::results::{structured_json, CloseOutput, RestoreOutput, SessionsOutput, SnapshotOutput};
use super::server::AgentosServer;

#[tool_router(router = session_tools, vis = "pub(super)")]
impl AgentosServer {
    #[tool(
        description = "List your exec sessions, with their runs and workspace size.",
        input_schema = input_schema!(NoArguments),
        output_schema = schema_for_output::<SessionsOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn exec_sessions(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let NoArguments {} = read(arguments)?;
        self.answer::<SessionsOutput>(Opcode::EXEC, &json!({ "op": "sessions" }), Wait::Quick)
            .await
    }

    #[tool(
        description = "Close an exec session: its interpreter ends and its /workspace is removed.",
        input_schema = input_schema!(SessionArguments),
        output_schema = schema_for_output::<CloseOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn exec_close(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: SessionArguments = read(arguments)?;
        let request = json!({ "op": "close", "session": arguments.session });
        self.answer::<CloseOutput>(Opcode::EXEC, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "Save an exec session's /workspace files under a name, for exec_restore.",
        input_schema = input_schema!(SnapshotArguments),
        output_schema = schema_for_output::<SnapshotOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn exec_snapshot(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: SnapshotArguments = read(arguments)?;
        let request = json!({
            "op": "snapshot", "session": arguments.session, "name": arguments.name,
        });
        self.answer::<SnapshotOutput>(Opcode::EXEC, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "Replace a session's /workspace with a snapshot and restart its interpreter.",
        input_schema = input_schema!(SnapshotArguments),
        output_schema = schema_for_output::<RestoreOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn exec_restore(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: SnapshotArguments = read(arguments)?;
        let request = json!({
            "op": "restore", "session": arguments.session, "name": arguments.name,
        });
        self.kernel
            .request(Opcode::EXEC, &request, Wait::Quick)
            .await?;
        structured_json(&RestoreOutput {
            session: arguments.session,
            name: arguments.name,
            restored: true,
        })
    }
}
