//! TOOL (0x05): list, search and call tools — the MCP servers' and the
//! kernel's built-ins. An agent sees and calls only the tools its
//! `permissions.tools` patterns allow, and an EXEC run those its request
//! allowed (within its caller's); a call outside them is
//! `permission_denied`, as is `llm.think` without `permissions.think`.
//! A call is answered when its server answers (or its deadline passes);
//! refusals come at once.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    AuditCategory, Detail, ThinkRequest, ToolCall, ToolDescription, ToolListReply, ToolReply,
    ToolSearchReply,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde_json::{Map, Value};

use super::audit::note;
use super::list::agents_seen_by;
use super::request::{actor, Outcome, Request};
use crate::address::Answer;
use crate::kernel::{Kernel, ToolCaller};
use crate::permissions::allowed_by;
use crate::telemetry::TraceContext;
use crate::tools::builtin::{self, Builtin};
use crate::tools::mcp::client::ToolInfo;
use crate::tools::offer::{self, offered, Listing, Offered};
use crate::tools::servers::CallRequest;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let answer = ToolCall::parse(request.payload).and_then(|call| {
        let patterns = actor(kernel, request)?.tools().map(<[String]>::to_vec);
        let may = |server: &str, tool: &str| {
            patterns
                .as_deref()
                .is_none_or(|patterns| allowed_by(patterns, server, tool))
        };
        match call {
            ToolCall::List => Ok(Some(Answer::json(&ToolListReply {
                success: true,
                tools: offered(&kernel.tools, Listing::Ready)
                    .iter()
                    .filter(|offered| may(offered.server, &offered.tool.name))
                    .map(|offered| describe(offered, Detail::Full))
                    .collect(),
                servers: kernel.tools.info_seen_by(patterns.as_deref()),
            }))),
            ToolCall::Search {
                query,
                detail,
                limit,
            } => {
                let tools: Vec<Offered<'_>> = offered(&kernel.tools, Listing::Ready)
                    .into_iter()
                    .filter(|offered| may(offered.server, &offered.tool.name))
                    .collect();
                let ranked = offer::ranked(&tools, &query, limit as usize);
                Ok(Some(Answer::json(&ToolSearchReply {
                    success: true,
                    tools: ranked
                        .into_iter()
                        .map(|i| describe(&tools[i], detail))
                        .collect(),
                })))
            }
            ToolCall::Call {
                server,
                tool,
                arguments,
                timeout_ms,
                trace,
            } => {
                if !may(&server, &tool) {
                    return Err(ErrorReply::new(
                        ErrorCode::PermissionDenied,
                        format!(
                            "the tool {server}.{tool} is not in the caller's permissions.tools \
                             {:?}",
                            patterns.unwrap_or_default()
                        ),
                    ));
                }
                let timeout = timeout_ms.map(Duration::from_millis);
                let trace = trace.as_deref().and_then(TraceContext::parse);
                let called = ToolCalled {
                    server: &server,
                    tool: &tool,
                };
                let category = AuditCategory::Syscall;
                note(kernel, request, category, "TOOL_CALL", None, &called);
                call_tool(kernel, request, &server, &tool, arguments, timeout, trace).map(|()| None)
            }
        }
    });
    match answer {
        Ok(Some(reply)) => Outcome::Reply(reply),
        Ok(None) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// What the audit log says of a TOOL call (when it records them).
#[derive(serde::Serialize)]
struct ToolCalled<'a> {
    server: &'a str,
    tool: &'a str,
}

/// A tool as `list` and `search` give it, saying as much as `detail` asks.
fn describe(offered: &Offered<'_>, detail: Detail) -> ToolDescription {
    let tool: &ToolInfo = offered.tool;
    let summary = detail != Detail::Name;
    let full = detail == Detail::Full;
    ToolDescription {
        server: offered.server.to_owned(),
        name: tool.name.clone(),
        description: summary.then(|| tool.description.clone()),
        input_schema: full.then(|| tool.input_schema.clone()),
        output_schema: full.then(|| tool.output_schema.clone().unwrap_or(Value::Null)),
    }
}

/// Calls a tool the caller may use: a built-in (at once, or through
/// THINK), an MCP server's through its client. Every call's reply comes
/// back through the kernel's TOOL calls, which count it against the EXEC
/// run that made it.
fn call_tool(
    kernel: &mut Kernel,
    request: &Request<'_>,
    server: &str,
    tool: &str,
    arguments: Map<String, Value>,
    timeout: Option<Duration>,
    trace: Option<TraceContext>,
) -> Result<(), ErrorReply> {
    let caller = ToolCaller {
        reply_to: request.reply_to,
        run: request.caller.run(),
    };
    match Builtin::find(server, tool) {
        Some(Builtin::ListAgents) => {
            let viewer = actor(kernel, request)?.viewer();
            let agents = agents_seen_by(kernel, viewer);
            let result = serde_json::to_value(&agents).unwrap_or(Value::Null);
            let text = result.to_string();
            let reply = ToolReply::done(result, builtin::text_content(text));
            let via = kernel.router.tool_call(caller);
            kernel.outbox.replies.push((via, reply.into()));
            Ok(())
        }
        Some(Builtin::Think) => {
            let think = ThinkRequest::parse(&serde_json::to_vec(&arguments).unwrap_or_default())
                .map_err(|err| ErrorReply::new(ErrorCode::ToolError, err.error))?;
            let asker = kernel.asker(&actor(kernel, request)?, request.caller.identity.id())?;
            let via = kernel.router.tool_call(caller);
            let queued = kernel
                .llm
                .think(&asker, via, think, &mut kernel.outbox.replies);
            if queued.is_err() {
                kernel.router.tool_call_refused(via);
            }
            queued
        }
        None if builtin::is_builtin_server(server) => Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!("the kernel's server {server} has no tool {tool:?}"),
        )),
        None => {
            // An agent's runs count among the agent's own calls at a
            // server: they cannot multiply its share of the server.
            let actor = actor(kernel, request)?;
            let calling = actor.root().agent().unwrap_or(request.caller.identity.id());
            let agent = kernel.span_agent(&actor);
            let via = kernel.router.tool_call(caller);
            let call = CallRequest {
                server,
                tool,
                arguments: Value::Object(arguments),
                timeout,
                reply_to: via,
                caller: calling,
                trace,
                agent,
            };
            let called = kernel.tools.call(call, Instant::now());
            if called.is_err() {
                kernel.router.tool_call_refused(via);
            }
            called
        }
    }
}
