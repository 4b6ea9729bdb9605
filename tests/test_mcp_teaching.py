"""What `agentos mcp` teaches a model before its first call: the tool list
stays small enough to sit in a model's context at every turn, `exec`'s
description says how a run's Python calls and finds tools, and the
instructions name the MCP servers the kernel serves and how to find their
tools. Spoken in raw JSON-RPC lines, as a client sends them, so the size
measured is the line a client reads."""

from __future__ import annotations

import asyncio
import json
import subprocess

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import binary
from test_mcp_server import everything_kernel  # noqa: F401 (a fixture)

# The most bytes the tools/list answer may take, as one JSON-RPC line. Its
# floor, with every tool's output schema and annotations, is about 2,500
# bytes before any name, description or argument.
TOOL_LIST_BUDGET = 7_000


def first_lines(socket_path: str, *messages: dict) -> list[bytes]:
    """The server's answer lines to `messages`, sent as one client would
    send them, after which stdin closes and the server ends."""
    sent = b"".join(json.dumps(message).encode() + b"\n" for message in messages)
    done = subprocess.run(
        [str(binary("agentos")), "--socket", socket_path, "mcp"],
        input=sent, capture_output=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.splitlines(keepends=True)


def initialize_and_list(socket_path: str) -> tuple[dict, bytes]:
    lines = first_lines(
        socket_path,
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    )
    # Answers by id; a notification has none.
    answers = {json.loads(line).get("id"): line for line in lines}
    return json.loads(answers[1])["result"], answers[2]


def test_the_tool_list_is_small_and_exec_teaches_the_tools_module(everything_kernel):
    _, listed = initialize_and_list(everything_kernel.socket_path)
    assert len(listed) <= TOOL_LIST_BUDGET, f"tools/list is {len(listed)} bytes"
    tools = {tool["name"]: tool for tool in json.loads(listed)["result"]["tools"]}
    exec_says = tools["exec"]["description"]
    for form in ("pre-imported", "tools.<server>.<tool>(", 'tools.search("'):
        assert form in exec_says, exec_says
    # Slim: no additionalProperties (the server refuses an argument a tool
    # does not take by name, see below), and an optional argument is its
    # own type, not "or null".
    assert "additionalProperties" not in listed.decode()
    assert tools["exec"]["inputSchema"]["properties"]["session"]["type"] == "string"
    assert "$schema" not in listed.decode()


def test_arguments_and_tools_it_does_not_have_are_refused_saying_what_it_has(everything_kernel):
    lines = first_lines(
        everything_kernel.socket_path,
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "exec", "arguments": {"code": "print(1)", "sesion": "s"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "exec_session", "arguments": {"op": "list", "name": "n"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "get_sum", "arguments": {"a": 1, "b": 2}}},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
         "params": {"name": "sha256", "arguments": {"text": "hello"}}},
    )
    answers = {json.loads(line).get("id"): json.loads(line) for line in lines}
    for answer_id, named in ((2, "`sesion`"), (3, "argument name: op list does not take it")):
        result = answers[answer_id]["result"]
        assert result["isError"] is True, result
        assert named in result["content"][0]["text"], result
    # A kernel server's tool called by name here is told the very call
    # that reaches it; a name that is no tool at all, how code is run and
    # how tools are found.
    unknown = answers[4]["error"]
    assert unknown["code"] == -32602, unknown
    for way in ('"get_sum"', 'tools_call(server="everything", tool="get-sum"',
                "tools.everything.get_sum("):
        assert way in unknown["message"], unknown
    nothing = answers[5]["error"]
    assert nothing["code"] == -32602, nothing
    for way in ('"sha256"', "exec", "tools_call", "tools_search", "tools.<server>.<tool>("):
        assert way in nothing["message"], nothing


def test_the_instructions_name_the_kernels_servers_and_tools_search(everything_kernel):
    init, _ = initialize_and_list(everything_kernel.socket_path)
    said = init["instructions"]
    assert "MCP servers for you: everything." in said, said
    assert "tools_search" in said, said
    assert "--socket" not in said, said


def test_what_exec_teaches_is_what_a_run_can_do(everything_kernel):
    code = ("print(tools.everything.get_sum(a=2, b=3))\n"
            "print([(t['server'], t['name']) for t in tools.search('add two numbers sum')])\n")
    server = StdioServerParameters(
        command=str(binary("agentos")), args=["--socket", everything_kernel.socket_path, "mcp"]
    )

    async def main() -> types.CallToolResult:
        async with stdio_client(server) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=60) as session:
                await session.initialize()
                return await session.call_tool("exec", {"code": code})

    result = asyncio.run(main())
    assert not result.is_error, result.content
    output = result.structured_content
    assert output["exit_code"] == 0, output
    summed, found = output["stdout"].splitlines()
    assert "5" in summed, output
    assert "('everything', 'get-sum')" in found, output
