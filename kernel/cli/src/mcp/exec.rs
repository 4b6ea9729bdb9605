//! The `exec` tool: code run in a fresh sandbox, or in a session's.

use agentos_proto::payload::{ExecReply, ExecRequest, Network, TaskKind};
use agentos_proto::Opcode;
use rmcp::model::CallToolResponse;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use super::arguments::ExecArguments;
use super::kernel::{KernelLink, Wait};
use super::long_work::{self, Delivery};
use super::results::{run_text, structured};
use super::tool_error::ToolError;
use super::trace::CallerTrace;

/// `exec`: the run's output, or a task handle or progress on the way to
/// it when the client asked for those (see `long_work`).
pub async fn exec(
    kernel: &KernelLink,
    arguments: ExecArguments,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ToolError> {
    let mut request = ExecRequest {
        code: arguments.code,
        language: arguments.language,
        session: arguments.session,
        template: arguments.template,
        volumes: arguments.volumes,
        timeout_ms: arguments.timeout_ms,
        env: arguments.env,
        network: arguments
            .network
            .map(|policy| Network::Policy(Box::new(policy))),
        ..ExecRequest::default()
    };
    let trace = CallerTrace::of(context);
    let answer = Delivery::asked_for(context);
    if !matches!(answer, Delivery::AtTheEnd) {
        match long_work::dispatch(kernel, TaskKind::Exec, &request, &trace).await {
            Ok(task_id) => return long_work::answer_for(kernel, &task_id, answer, context).await,
            // Without tasks the run still runs: as a plain EXEC,
            // without a task handle or progress.
            Err(err) if long_work::tasks_refused(&err) => {}
            Err(err) => return Err(err),
        }
    }
    // The fast path, one EXEC. A client that cancels the call closes
    // its connection, and the kernel kills the run.
    request.trace = trace.traceparent();
    let reply: ExecReply = kernel
        .request_until(
            Opcode::EXEC,
            &request,
            Wait::AsLongAsTheKernel,
            context.ct.cancelled(),
        )
        .await?;
    let text = run_text(&reply);
    Ok(structured(&reply, text).map(CallToolResponse::from)?)
}
