//! TOOL (0x05): list, search and call tools — the MCP servers' and the
//! kernel's built-ins. An agent sees and calls only the tools its
//! `permissions.tools` patterns allow, and an EXEC run those its request
//! allowed (within its caller's); a call outside them is
//! `permission_denied`, as is `llm.think` without `permissions.think`.
//! A call is answered when its server answers (or its deadline passes);
//! refusals come at once.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, Detail, ThinkRequest, ToolCall, ToolDescription, ToolListReply, ToolReply,
    ToolSearchReply,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde_json::{Map, Value};

use super::kernel::ToolCaller;
use super::list::agents_seen_by;
use super::think::asker;
use super::{actor, Kernel, Outcome, Request};
use crate::tools::builtin::{self, Builtin};
use crate::tools::catalog::{self, allowed_by, Searchable};
use crate::tools::mcp::client::ToolInfo;
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
            ToolCall::List => Ok(Some(to_json(&ToolListReply {
                success: true,
                tools: offered(kernel)
                    .filter(|(server, tool)| may(server, &tool.name))
                    .map(|(server, tool)| describe(server, tool, Detail::Full))
                    .collect(),
                servers: kernel.tools.info(),
            }))),
            ToolCall::Search {
                query,
                detail,
                limit,
            } => {
                let tools: Vec<(&str, &ToolInfo)> = offered(kernel)
                    .filter(|(server, tool)| may(server, &tool.name))
                    .collect();
                let searchable: Vec<Searchable<'_>> = tools
                    .iter()
                    .map(|(server, tool)| Searchable {
                        server,
                        name: &tool.name,
                        description: &tool.description,
                    })
                    .collect();
                let ranked = catalog::search(&searchable, &query, limit as usize);
                Ok(Some(to_json(&ToolSearchReply {
                    success: true,
                    tools: ranked
                        .into_iter()
                        .map(|i| describe(tools[i].0, tools[i].1, detail))
                        .collect(),
                })))
            }
            ToolCall::Call {
                server,
                tool,
                arguments,
                timeout_ms,
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
                call_tool(kernel, request, &server, &tool, arguments, timeout)
            }
        }
    });
    match answer {
        Ok(Some(reply)) => Outcome::Reply(reply),
        Ok(None) => Outcome::Later,
        Err(err) => Outcome::Reply(err.to_json()),
    }
}

/// Every tool on offer now: the built-ins, then each ready server's.
fn offered(kernel: &Kernel) -> impl Iterator<Item = (&str, &ToolInfo)> {
    builtin::tools()
        .iter()
        .map(|(server, tool)| (*server, tool))
        .chain(kernel.tools.tools())
}

/// A tool as `list` and `search` give it, saying as much as `detail` asks.
fn describe(server: &str, tool: &ToolInfo, detail: Detail) -> ToolDescription {
    let summary = detail != Detail::Name;
    let full = detail == Detail::Full;
    ToolDescription {
        server: server.to_owned(),
        name: tool.name.clone(),
        description: summary.then(|| tool.description.clone()),
        input_schema: full.then(|| tool.input_schema.clone()),
        output_schema: full.then(|| tool.output_schema.clone().unwrap_or(Value::Null)),
    }
}

/// Calls a tool the caller may use: a built-in at once (or through THINK),
/// an MCP server's through its client. `Ok(None)`: the reply comes later.
fn call_tool(
    kernel: &mut Kernel,
    request: &Request<'_>,
    server: &str,
    tool: &str,
    arguments: Map<String, Value>,
    timeout: Option<Duration>,
) -> Result<Option<Vec<u8>>, ErrorReply> {
    let run = request.caller.run();
    match Builtin::find(server, tool) {
        Some(Builtin::ListAgents) => {
            let viewer = actor(kernel, request)?.viewer();
            let agents = agents_seen_by(kernel, viewer);
            let result = serde_json::to_value(&agents).unwrap_or(Value::Null);
            let text = result.to_string();
            let reply = to_json(&ToolReply::done(result, builtin::text_content(text)));
            kernel.tools_delivered(run, reply.len());
            Ok(Some(reply))
        }
        Some(Builtin::Think) => {
            let think = ThinkRequest::parse(&serde_json::to_vec(&arguments).unwrap_or_default())
                .map_err(|err| ErrorReply::new(ErrorCode::ToolError, err.error))?;
            let asker = asker(
                kernel,
                &actor(kernel, request)?,
                request.caller.identity.id(),
            )?;
            let via = kernel.tool_call_through(ToolCaller {
                reply_to: request.reply_to,
                run,
            });
            let queued = kernel
                .llm
                .think(&asker, via, think, &mut kernel.outbox.replies);
            if queued.is_err() {
                kernel.tool_call_refused(via);
            }
            queued.map(|()| None)
        }
        None if builtin::is_builtin_server(server) => Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!("the kernel's server {server} has no tool {tool:?}"),
        )),
        None => {
            // An agent's runs count among the agent's own calls at a
            // server: they cannot multiply its share of the server.
            let caller = actor(kernel, request)?
                .root()
                .agent()
                .unwrap_or(request.caller.identity.id());
            let call = CallRequest {
                server,
                tool,
                arguments: Value::Object(arguments),
                timeout,
                reply_to: request.reply_to,
                tag: run,
                caller,
            };
            kernel.tools.call(call, Instant::now())?;
            Ok(None)
        }
    }
}
