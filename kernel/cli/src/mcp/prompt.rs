//! The `run_prompt` tool: the kernel's prompt-to-program loop (a TASK of
//! kind `prompt`), in which its LLM writes code, the code runs in a
//! sandbox, and the output goes back to the LLM until it answers. The
//! tool's arguments are the loop's request, proto's `PromptRequest`; the
//! kernel checks the values (lengths, the iteration range, the session
//! name).

use agentos_proto::payload::{PromptRequest, TaskKind};
use rmcp::model::CallToolResponse;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::kernel::KernelLink;
use super::long_work::{self, Delivery};
use super::tool_error::ToolError;

/// `run_prompt`: the loop's answer, or a task handle or progress on the
/// way to it when the client asked for those (see `long_work`).
pub async fn run_prompt(
    kernel: &KernelLink,
    request: PromptRequest,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ToolError> {
    // The loop is a kernel task whatever the client asked for: the
    // kernel has no blocking request for it.
    let answer = Delivery::asked_for(context);
    long_work::run(kernel, TaskKind::Prompt, &request, answer, context).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::arguments::read;
    use super::*;

    #[test]
    fn the_arguments_given_are_sent_and_the_rest_are_the_kernels_defaults() {
        let request = |arguments: serde_json::Value| {
            let arguments: PromptRequest =
                read(arguments.as_object().expect("an object").clone()).expect("valid arguments");
            serde_json::to_value(arguments).expect("a request")
        };
        assert_eq!(
            request(json!({"prompt": "sum 1..10", "max_iterations": 3})),
            json!({"prompt": "sum 1..10", "max_iterations": 3})
        );
        assert_eq!(
            request(json!({"prompt": "sum 1..10", "session": "s"})),
            json!({"prompt": "sum 1..10", "max_iterations": 5, "session": "s"})
        );
    }
}
