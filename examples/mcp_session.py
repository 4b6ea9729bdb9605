#!/usr/bin/env python3
"""One MCP client session with `agentos mcp`, through PyPI's `mcp` client:
it starts the server over stdio, runs code with the `exec` tool, calls a
tool of the kernel's `everything` MCP server through `tools_call`, and
reads back a file the code wrote as a resource. Prints a short transcript.

Run it against a running agentosd whose config has the `everything`
server (``scripts/run`` starts one and runs this):

    AGENTOS_SOCKET=/path/to/agentos.sock python examples/mcp_session.py [path/to/agentos]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# The whole session's limit: it takes well under a second when all is well.
SESSION_LIMIT_SECONDS = 60

CODE = "open('greeting.txt', 'w').write('written by exec')\nprint('6 * 7 =', 6 * 7)"


def shown(value: object, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = text.strip().replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def session_with(agentos: str) -> str | None:
    """The session's transcript on stdout; why it failed, if it did."""
    # `agentos mcp` finds the kernel as every agentos command does
    # (AGENTOS_SOCKET, else the default socket): it gets this environment,
    # not the client's default few variables.
    server = StdioServerParameters(command=agentos, args=["mcp"], env=dict(os.environ))
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=30) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            print(f"initialize -> {init.server_info.name} {init.server_info.version}, "
                  f"protocol {init.protocol_version}, {len(tools.tools)} tools")

            arguments = {"code": CODE, "session": "mcp-demo"}
            print(f"tools/call exec {shown(arguments)}")
            ran = await session.call_tool("exec", arguments)
            if ran.is_error or ran.structured_content["exit_code"] != 0:
                return f"exec failed: {ran.content}"
            print(f"  <- stdout {shown(ran.structured_content['stdout'])}")

            arguments = {"server": "everything", "tool": "echo",
                         "arguments": {"message": "hello through agentos mcp"}}
            print(f"tools/call tools_call {shown(arguments)}")
            echoed = await session.call_tool("tools_call", arguments)
            if echoed.is_error:
                return f"tools_call failed: {echoed.content}"
            print(f"  <- result {shown(echoed.structured_content['result'])}")

            uri = "agentos://sessions/mcp-demo/greeting.txt"
            print(f"resources/read {uri}")
            read = await session.read_resource(uri)
            contents = read.contents[0]
            print(f"  <- {contents.mime_type} {shown(contents.text)}")

            await session.call_tool("exec_session", {"op": "close", "session": "mcp-demo"})
    return None


def main() -> int:
    agentos = sys.argv[1] if len(sys.argv) > 1 else "agentos"
    failure = asyncio.run(asyncio.wait_for(session_with(agentos), SESSION_LIMIT_SECONDS))
    if failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
