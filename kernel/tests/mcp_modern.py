"""An MCP server (stdio) that speaks protocol 2026-07-28 only, for the
kernel's tool tests.

No published server refuses the earlier era: the PyPI SDK's servers (and
mcp-server-time, built on it) serve both, choosing by a connection's first
request. This one is put together from that SDK's own low-level pieces —
its `Server` with a tool, its JSON-RPC dispatcher on stdio, and its
per-request (2026-07-28) request handling — and refuses `initialize`
outright, so a client that does not speak 2026-07-28 gets nowhere with it.

Its tools: `add` (a + b, as structured content) and `era` (the protocol
version the request's `_meta` named).
"""

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.runner import modern_on_request
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"

TOOLS = [
    types.Tool(
        name="add",
        description="Adds a and b.",
        input_schema={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        output_schema={
            "type": "object",
            "properties": {"sum": {"type": "number"}},
            "required": ["sum"],
        },
    ),
    types.Tool(
        name="era",
        description="Names the protocol version the request was made in.",
        input_schema={"type": "object", "properties": {}},
    ),
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    if params.name == "add":
        total = params.arguments["a"] + params.arguments["b"]
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(total))],
            structured_content={"sum": total},
        )
    if params.name == "era":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(ctx.protocol_version))]
        )
    raise MCPError(code=types.INVALID_PARAMS, message=f"no tool {params.name!r}")


server = Server("modern-only", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with stdio_server() as (read_stream, write_stream):
        serve = modern_on_request(server, None)

        async def on_request(dctx, method, params):
            if method == "initialize":
                raise MCPError(
                    code=types.METHOD_NOT_FOUND,
                    message="this server speaks 2026-07-28 only: no initialize",
                )
            meta = (params or {}).get("_meta") or {}
            if PROTOCOL_VERSION_KEY not in meta:
                raise MCPError(
                    code=types.INVALID_PARAMS,
                    message=f"a request must name its protocol version in _meta ({PROTOCOL_VERSION_KEY})",
                )
            return await serve(dctx, method, params)

        async def on_notify(dctx, method, params):
            pass

        dispatcher = JSONRPCDispatcher(read_stream, write_stream)
        await dispatcher.run(on_request, on_notify)


anyio.run(main)
