"""A remote MCP server (Streamable HTTP) for the kernel's tool tests: the
PyPI SDK's `MCPServer`, which serves protocol 2026-07-28 and the earlier
era side by side, behind a check of the bearer token the kernel must send.

    mcp_remote.py TOKEN

It listens on a free port of 127.0.0.1 and prints that port on its first
line of stdout. Every request without `Authorization: Bearer TOKEN` is
refused with 401. Its tools: `echo`, `leak` (the Authorization header it
was sent, which the kernel must never show), `era` (the protocol version
of the request), `slow` (sleeps for `seconds`) and `route`, whose
`region` argument must also come as the header `Mcp-Param-Region` (the
SDK refuses a call without it).
"""

import socket
import sys
from typing import Annotated

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

TOKEN = sys.argv[1]
EXPECTED = f"Bearer {TOKEN}".encode()
last_authorization = ""

server = MCPServer("remote")


@server.tool()
def echo(message: str) -> str:
    """Says the message back."""
    return f"Echo: {message}"


@server.tool()
def leak() -> str:
    """Returns the Authorization header the request carried."""
    return f"you sent {last_authorization}"


@server.tool()
def era(ctx: Context) -> str:
    """Names the protocol version of the request."""
    return str(ctx.request_context.protocol_version)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps, then says so."""
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def route(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], query: str) -> str:
    """Answers a query in a region, which gateways route on."""
    return f"{region}: {query}"


def guarded(app):
    async def guard(scope, receive, send):
        global last_authorization
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            authorization = headers.get(b"authorization", b"")
            if authorization != EXPECTED:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no valid bearer token"})
                return
            last_authorization = authorization.decode()
        await app(scope, receive, send)

    return guard


def main():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    app = guarded(server.streamable_http_app())
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])


main()
