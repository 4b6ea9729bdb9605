//! A tool call's spans: `execute_tool {tool}` (the GenAI semantic
//! conventions' tool span) and, as its child, the MCP request's
//! `tools/call {tool}`, whose context goes to the server.

use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;

/// A call's `execute_tool {tool}` span (GenAI) and, as its child, the
/// MCP request's `tools/call {tool}` (whose context goes to the server).
pub fn open_call_spans(
    tracer: &Tracer,
    server: &str,
    tool: &str,
    request_id: u64,
    over_pipes: bool,
    parent: Option<&TraceContext>,
    agent: Option<&SpanAgent>,
) -> Option<(OpenSpan, OpenSpan)> {
    let mut call = tracer.open(format!("execute_tool {tool}"), SpanKind::Internal, parent)?;
    call.text("gen_ai.operation.name", "execute_tool");
    call.text("gen_ai.tool.name", tool);
    call.text("agentos.tool.server", server);
    call.agent(agent);
    let mut mcp = tracer.open(
        format!("tools/call {tool}"),
        SpanKind::Client,
        Some(&call.context),
    )?;
    mcp.text("mcp.method.name", "tools/call");
    mcp.text("gen_ai.tool.name", tool);
    mcp.text("gen_ai.operation.name", "execute_tool");
    mcp.text("jsonrpc.request.id", request_id.to_string());
    mcp.text("network.transport", if over_pipes { "pipe" } else { "tcp" });
    mcp.text("agentos.tool.server", server);
    Some((call, mcp))
}

/// Ends a call's spans, the MCP request's first; `error` is the
/// `error.type` of both if it failed.
pub fn end_call_spans(tracer: &Tracer, spans: Option<(OpenSpan, OpenSpan)>, error: Option<&str>) {
    let Some((mut call, mut mcp)) = spans else {
        return;
    };
    if let Some(kind) = error {
        mcp.text("error.type", kind);
        call.text("error.type", kind);
    }
    tracer.end(mcp, error.map(str::to_owned));
    tracer.end(call, error.map(str::to_owned));
}
