"""`agentos mcp`, end to end: PyPI's MCP client starts the server over
stdio against a real agentosd and calls its tools."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import binary

TOOLS = {"exec", "think", "list_agents", "spawn", "kill", "status"}


@contextlib.asynccontextmanager
async def mcp_session(socket_path: str) -> AsyncIterator[ClientSession]:
    server = StdioServerParameters(
        command=str(binary("agentos")), args=["--socket", socket_path, "mcp"]
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=60) as session:
            yield session


def run(kernel, body: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with mcp_session(kernel.socket_path) as session:
            return await body(session)

    return asyncio.run(main())


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_initialize_and_list_tools(kernel):
    async def body(session: ClientSession):
        init = await session.initialize()
        listed = await session.list_tools()
        return init, listed

    init, listed = run(kernel, body)
    assert init.protocol_version == "2025-11-25"
    assert init.server_info.name == "agentos"
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None and tool.annotations.read_only_hint is not None, tool.name
        assert tool.annotations.destructive_hint is not None, tool.name
        assert tool.annotations.idempotent_hint is not None, tool.name
        assert tool.description and len(tool.description) < 120, tool.name
    assert tools["exec"].input_schema["required"] == ["code"]
    assert {"stdout", "stderr", "exit_code", "error", "tool_calls", "tool_bytes"} <= set(
        tools["exec"].output_schema["properties"]
    )
    assert tools["kill"].annotations.destructive_hint is True
    assert tools["list_agents"].annotations.read_only_hint is True


def test_exec_returns_structured_output(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        return await session.call_tool("exec", {"code": "print(1)"})

    result = run(kernel, body)
    assert not result.is_error, text_of(result)
    assert result.structured_content["stdout"] == "1\n"
    assert result.structured_content["exit_code"] == 0
    assert result.structured_content["stderr"] == ""
    assert result.structured_content["error"] is None
    assert result.structured_content["tool_calls"] == 0
    assert text_of(result) == "1\n"


def test_exec_failure_is_a_result_with_its_error(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        return await session.call_tool(
            "exec", {"code": "echo out; echo $GREETING >&2; exit 3", "language": "bash",
                     "env": {"GREETING": "hi"}}
        )

    result = run(kernel, body)
    assert not result.is_error, text_of(result)
    assert result.structured_content["exit_code"] == 3
    assert result.structured_content["stdout"] == "out\n"
    assert result.structured_content["stderr"] == "hi\n"


def test_the_runs_own_timeout_ends_it(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        return await session.call_tool(
            "exec", {"code": "import time; time.sleep(30)", "timeout_ms": 500}
        )

    result = run(kernel, body)
    assert not result.is_error, text_of(result)
    assert result.structured_content["timed_out"] is True
    assert result.structured_content["exit_code"] is None


def test_a_session_keeps_state_across_exec_calls(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        first = await session.call_tool("exec", {"code": "x = 41", "session": "kept"})
        second = await session.call_tool("exec", {"code": "print(x + 1)", "session": "kept"})
        fresh = await session.call_tool("exec", {"code": "print(x)"})
        return first, second, fresh

    first, second, fresh = run(kernel, body)
    assert not first.is_error and not second.is_error, (text_of(first), text_of(second))
    assert second.structured_content["stdout"] == "42\n"
    # Without the session the name is unknown: state lives in the session only.
    assert fresh.structured_content["exit_code"] == 1
    assert "NameError" in fresh.structured_content["error"]


def test_spawn_list_and_kill_an_agent(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        spawned = await session.call_tool(
            "spawn", {"name": "sleeper", "command": ["sleep", "300"],
                      "limits": {"memory_bytes": 64 << 20, "max_pids": 16}}
        )
        listed = await session.call_tool("list_agents", {})
        killed = await session.call_tool("kill", {"name": "sleeper"})
        for _ in range(100):
            after = await session.call_tool("list_agents", {})
            if not after.structured_content["agents"]:
                break
            await asyncio.sleep(0.1)
        ended = await session.call_tool("list_agents", {"all": True})
        return spawned, listed, killed, after, ended

    spawned, listed, killed, after, ended = run(kernel, body)
    assert not spawned.is_error, text_of(spawned)
    agent_id = spawned.structured_content["id"]
    assert spawned.structured_content["name"] == "sleeper"
    live = {agent["name"]: agent for agent in listed.structured_content["agents"]}
    assert live["sleeper"]["id"] == agent_id and live["sleeper"]["running"] is True
    assert not killed.is_error, text_of(killed)
    assert killed.structured_content == {"killed": True, "id": agent_id}
    assert after.structured_content["agents"] == []
    assert [a["id"] for a in ended.structured_content["agents"] if a["name"] == "sleeper"] == [agent_id]


def test_bad_arguments_name_the_argument_and_the_server_keeps_serving(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        wrong_type = await session.call_tool("exec", {"code": "print(1)", "timeout_ms": "soon"})
        missing = await session.call_tool("exec", {"language": "bash"})
        wrong_language = await session.call_tool("exec", {"code": "puts 1", "language": "ruby"})
        both = await session.call_tool("kill", {"name": "a", "id": 3})
        still = await session.call_tool("exec", {"code": "print(2)"})
        return wrong_type, missing, wrong_language, both, still

    wrong_type, missing, wrong_language, both, still = run(kernel, body)
    for result in (wrong_type, missing, wrong_language, both):
        assert result.is_error, text_of(result)
        assert result.structured_content is None
    assert text_of(wrong_type).startswith("argument timeout_ms:"), text_of(wrong_type)
    assert "`code`" in text_of(missing), text_of(missing)
    assert text_of(wrong_language).startswith("argument language:"), text_of(wrong_language)
    assert "name and id" in text_of(both), text_of(both)
    assert not still.is_error and still.structured_content["stdout"] == "2\n"


def test_kernel_errors_are_tool_errors(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        unknown = await session.call_tool("kill", {"name": "no-such-agent"})
        no_llm = await session.call_tool("think", {"prompt": "hello"})
        status = await session.call_tool("status", {})
        return unknown, no_llm, status

    unknown, no_llm, status = run(kernel, body)
    assert unknown.is_error
    assert "no-such-agent" in text_of(unknown) and "(not_found)" in text_of(unknown), text_of(unknown)
    # The test kernel has no LLM: THINK is refused, and the refusal is the tool's result.
    assert no_llm.is_error and "(unavailable)" in text_of(no_llm), text_of(no_llm)
    assert not status.is_error, text_of(status)
    assert status.structured_content["features"]["exec"] is True
    assert status.structured_content["kernel_version"]


def test_an_absent_kernel_is_a_tool_error(tmp_path):
    class Absent:
        socket_path = str(tmp_path / "absent.sock")

    async def body(session: ClientSession):
        await session.initialize()
        return await session.call_tool("status", {})

    result = run(Absent, body)
    assert result.is_error
    assert "cannot connect to the AgentOS kernel" in text_of(result), text_of(result)
