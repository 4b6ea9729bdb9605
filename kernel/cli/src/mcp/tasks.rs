//! The tools for TASK: background exec runs and think prompts, which
//! outlive the call (and the server) that dispatched them.

use agentos_proto::Opcode;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use serde_json::{json, Value};

use super::arguments::{
    read, TaskArguments, TaskDispatchArguments, TaskListArguments, TaskWaitArguments,
};
use super::kernel::Wait;
use super::results::{CancelOutput, DispatchOutput, TaskListOutput, TaskOutput};
use super::server::AgentosServer;
use super::trace::CallerTrace;

#[tool_router(router = task_tools, vis = "pub(super)")]
impl AgentosServer {
    #[tool(
        description = "Start code (exec) or a prompt (think) as a background task; returns its task_id.",
        input_schema = input_schema!(TaskDispatchArguments),
        output_schema = schema_for_output::<DispatchOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn task_dispatch(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let arguments: TaskDispatchArguments = read(arguments)?;
        let mut request = dispatch_request(arguments)?;
        CallerTrace::of(&context).add_to(&mut request);
        self.answer::<DispatchOutput>(Opcode::TASK, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "A task's state and progress.",
        input_schema = input_schema!(TaskArguments),
        output_schema = schema_for_output::<TaskOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_status(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: TaskArguments = read(arguments)?;
        let request = json!({ "op": "status", "task_id": arguments.task_id });
        self.answer::<TaskOutput>(Opcode::TASK, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "Wait up to timeout_ms for a task to finish; the task, with its result once finished.",
        input_schema = input_schema!(TaskWaitArguments),
        output_schema = schema_for_output::<TaskOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_wait(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: TaskWaitArguments = read(arguments)?;
        let mut request = json!({ "op": "wait", "task_id": arguments.task_id });
        if let Some(timeout_ms) = arguments.timeout_ms {
            request["timeout_ms"] = timeout_ms.into();
        }
        // The kernel ends the wait at timeout_ms (or its own default).
        self.answer::<TaskOutput>(Opcode::TASK, &request, Wait::AsLongAsTheKernel)
            .await
    }

    #[tool(
        description = "Cancel a task: its running code is killed, a queued think withdrawn.",
        input_schema = input_schema!(TaskArguments),
        output_schema = schema_for_output::<CancelOutput>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn task_cancel(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: TaskArguments = read(arguments)?;
        let request = json!({ "op": "cancel", "task_id": arguments.task_id });
        self.answer::<CancelOutput>(Opcode::TASK, &request, Wait::Quick)
            .await
    }

    #[tool(
        description = "List your tasks, newest first (filter by state or kind; page with before).",
        input_schema = input_schema!(TaskListArguments),
        output_schema = schema_for_output::<TaskListOutput>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true)
    )]
    async fn task_list(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
    ) -> Result<CallToolResult, String> {
        let arguments: TaskListArguments = read(arguments)?;
        let mut request = json!({ "op": "list" });
        if let Some(state) = arguments.state {
            request["state"] = state.into();
        }
        if let Some(kind) = arguments.kind {
            request["kind"] = kind.into();
        }
        if let Some(limit) = arguments.limit {
            request["limit"] = limit.into();
        }
        if let Some(before) = arguments.before {
            request["before"] = before.into();
        }
        self.answer::<TaskListOutput>(Opcode::TASK, &request, Wait::Quick)
            .await
    }
}

/// The TASK dispatch for `arguments`: an EXEC run for `code`, a THINK for
/// `prompt`.
fn dispatch_request(arguments: TaskDispatchArguments) -> Result<Value, String> {
    let exec_only = arguments.language.is_some()
        || arguments.session.is_some()
        || arguments.timeout_ms.is_some()
        || !arguments.env.is_empty();
    let (kind, request) = match (arguments.code, arguments.prompt) {
        (Some(code), None) => {
            if arguments.max_tokens.is_some() {
                return Err("argument max_tokens: goes with prompt, not code".to_owned());
            }
            let mut request = json!({
                "code": code,
                "language": arguments.language.unwrap_or_default().as_str(),
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
            ("exec", request)
        }
        (None, Some(prompt)) => {
            if exec_only {
                return Err(
                    "language, session, timeout_ms and env go with code, not prompt".to_owned(),
                );
            }
            let mut request = json!({ "prompt": prompt });
            if let Some(max_tokens) = arguments.max_tokens {
                request["max_tokens"] = max_tokens.into();
            }
            ("think", request)
        }
        _ => return Err("give exactly one of the arguments code and prompt".to_owned()),
    };
    let mut dispatch = json!({ "op": "dispatch", "kind": kind, "request": request });
    if let Some(label) = arguments.label {
        dispatch["label"] = label.into();
    }
    Ok(dispatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatch(value: Value) -> Result<Value, String> {
        let arguments = read(value.as_object().expect("an object").clone())?;
        dispatch_request(arguments)
    }

    #[test]
    fn code_is_an_exec_task_and_a_prompt_a_think_task() {
        let exec = dispatch(json!({"code": "ls", "language": "bash", "label": "l"})).unwrap();
        assert_eq!(
            exec,
            json!({"op": "dispatch", "kind": "exec", "label": "l",
                   "request": {"code": "ls", "language": "bash"}})
        );
        let think = dispatch(json!({"prompt": "hi", "max_tokens": 5})).unwrap();
        assert_eq!(
            think,
            json!({"op": "dispatch", "kind": "think",
                   "request": {"prompt": "hi", "max_tokens": 5}})
        );
    }

    #[test]
    fn arguments_of_the_other_kind_are_refused() {
        let err = dispatch(json!({"code": "1", "prompt": "hi"})).unwrap_err();
        assert!(err.contains("code and prompt"), "{err}");
        let err = dispatch(json!({})).unwrap_err();
        assert!(err.contains("code and prompt"), "{err}");
        let err = dispatch(json!({"prompt": "hi", "timeout_ms": 5})).unwrap_err();
        assert!(err.contains("go with code"), "{err}");
        let err = dispatch(json!({"code": "1", "max_tokens": 5})).unwrap_err();
        assert!(err.starts_with("argument max_tokens:"), "{err}");
    }
}
