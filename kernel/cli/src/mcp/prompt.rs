//! The `run_prompt` tool: the kernel's prompt-to-program loop (a TASK of
//! kind `prompt`), in which its LLM writes code, the code runs in a
//! sandbox, and the output goes back to the LLM until it answers.

use agentos_proto::payload::TaskKind;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResponse, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use serde_json::{json, Value};

use super::arguments::{read, RunPromptArguments};
use super::long_work::{self, Answer};
use super::results::RunPromptOutput;
use super::server::AgentosServer;

#[tool_router(router = prompt_tools, vis = "pub(super)")]
impl AgentosServer {
    #[tool(
        description = "Have the kernel's LLM solve a task by writing and running code until it can answer.",
        input_schema = input_schema!(RunPromptArguments),
        output_schema = schema_for_output::<RunPromptOutput>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn run_prompt(
        &self,
        Parameters(arguments): Parameters<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, String> {
        let arguments: RunPromptArguments = read(arguments)?;
        let request = prompt_request(arguments);
        // The loop is a kernel task whatever the client asked for: the
        // kernel has no blocking request for it.
        let answer = Answer::asked_for(&context);
        long_work::run(&self.kernel, TaskKind::Prompt, request, answer, &context).await
    }
}

/// The `prompt` task's request for `arguments`; the kernel checks the
/// values (lengths, the iteration range, the session name).
fn prompt_request(arguments: RunPromptArguments) -> Value {
    let mut request = json!({ "prompt": arguments.prompt });
    if let Some(max_iterations) = arguments.max_iterations {
        request["max_iterations"] = max_iterations.into();
    }
    if let Some(system) = arguments.system {
        request["system"] = system.into();
    }
    if let Some(session) = arguments.session {
        request["session"] = session.into();
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_arguments_given_are_sent() {
        let arguments = read(
            json!({"prompt": "sum 1..10", "max_iterations": 3})
                .as_object()
                .expect("an object")
                .clone(),
        )
        .expect("valid arguments");
        assert_eq!(
            prompt_request(arguments),
            json!({"prompt": "sum 1..10", "max_iterations": 3})
        );
    }
}
