"""`agentos mcp`, end to end: PyPI's MCP client starts the server over
stdio against a real agentosd and calls its tools."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentos import AgentOSClient
from conftest import REPO, Kernel, binary, kernel_with

# Every tool, and its hints with MCP's defaults applied: read-only,
# destructive, idempotent.
HINTS = {
    "exec": (False, False, False),
    "think": (True, False, False),
    "run_prompt": (False, False, False),
    "list_agents": (True, False, True),
    "spawn": (False, False, False),
    "kill": (False, True, True),
    "status": (True, False, True),
    "agent_logs": (True, False, True),
    "exec_session": (False, True, False),
    "task_dispatch": (False, False, False),
    "task_wait": (True, False, True),
    "task_cancel": (False, True, True),
    "task_list": (True, False, True),
    "tools_search": (True, False, True),
    "tools_call": (False, True, False),
    "state": (False, True, False),
    "messages": (False, False, False),
}
TOOLS = set(HINTS)
# MCP's default of each hint, which a tool's annotations leave out.
DEFAULT_HINTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False,
                 "openWorldHint": True}


def effective_hints(annotations: dict) -> tuple[bool, bool, bool]:
    """A tool's hints as a client reads its annotations (the wire's names):
    a hint left out is MCP's default. One written at its default is not
    expected, nor an open world hint at all (every tool reaches outside)."""
    for hint, value in annotations.items():
        assert value != DEFAULT_HINTS[hint], annotations
    hints = {**DEFAULT_HINTS, **annotations}
    return hints["readOnlyHint"], hints["destructiveHint"], hints["idempotentHint"]


def annotations_of(tool: types.Tool) -> dict:
    assert tool.annotations is not None, tool.name
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


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
        # An object, which is all it says: the result's fields are the result's.
        assert tool.output_schema == {"type": "object"}, tool.name
        assert effective_hints(annotations_of(tool)) == HINTS[tool.name], tool.name
        # Short: every client reads them all. exec's teaches its tools module too.
        assert tool.description and len(tool.description) < (200 if tool.name == "exec" else 80), (
            tool.name)
    assert tools["exec"].input_schema["required"] == ["code"]
    assert tools["exec_session"].input_schema["required"] == ["op"]
    assert tools["exec_session"].input_schema["properties"]["op"]["enum"] == [
        "list", "close", "snapshot", "restore", "pause", "resume", "hibernate"]
    assert tools["tools_search"].input_schema["required"] == ["query"]
    assert "detail" in tools["tools_search"].input_schema["properties"]
    assert "timeout_ms" in tools["task_wait"].input_schema["properties"]
    assert sorted(tools["tools_call"].input_schema["required"]) == ["server", "tool"]


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


def test_exec_takes_a_network_policy_and_reports_its_connections(kernel):
    if os.geteuid() != 0:
        print("!!! NOT TESTED: network policies need root (CI runs as root)")
        return
    code = ("import socket\n"
            "s = socket.create_connection(('127.0.0.1', 3128))\n"
            "s.sendall(b'CONNECT example.com:443 HTTP/1.1\\r\\n\\r\\n')\n"
            "print(s.recv(200).split(b'\\r\\n')[0].decode())\n")

    async def body(session: ClientSession):
        await session.initialize()
        return await session.call_tool(
            "exec", {"code": code, "network": {"allow": ["pypi.org:443"]}})

    result = run(kernel, body)
    assert not result.is_error, text_of(result)
    assert result.structured_content["stdout"].startswith("HTTP/1.1 403"), text_of(result)
    assert result.structured_content["network"]["refused"] == 1, result.structured_content


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


def test_a_task_is_dispatched_and_waited_for(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        dispatched = await session.call_tool(
            "task_dispatch", {"code": "print(6 * 7)", "label": "answer"}
        )
        task_id = dispatched.structured_content["task_id"]
        waited = await session.call_tool("task_wait", {"task_id": task_id, "timeout_ms": 30000})
        listed = await session.call_tool("task_list", {})
        return dispatched, waited, listed

    dispatched, waited, listed = run(kernel, body)
    assert not dispatched.is_error, text_of(dispatched)
    assert not waited.is_error, text_of(waited)
    task = waited.structured_content["task"]
    assert task["task_id"] == dispatched.structured_content["task_id"]
    assert task["state"] == "completed" and task["kind"] == "exec" and task["label"] == "answer"
    assert task["result"]["stdout"] == "42\n"
    assert [t["label"] for t in listed.structured_content["tasks"]] == ["answer"]


def test_a_cancelled_task_stops(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        dispatched = await session.call_tool(
            "task_dispatch", {"code": "import time\nprint('started', flush=True)\ntime.sleep(120)"}
        )
        task_id = dispatched.structured_content["task_id"]
        for _ in range(300):
            running = await session.call_tool("task_wait", {"task_id": task_id})
            if running.structured_content["task"]["state"] == "running":
                break
            await asyncio.sleep(0.1)
        short = await session.call_tool("task_wait", {"task_id": task_id, "timeout_ms": 200})
        cancelled = await session.call_tool("task_cancel", {"task_id": task_id})
        waited = await session.call_tool("task_wait", {"task_id": task_id, "timeout_ms": 30000})
        status = await session.call_tool("task_wait", {"task_id": task_id, "timeout_ms": 0})
        return running, short, cancelled, waited, status

    running, short, cancelled, waited, status = run(kernel, body)
    assert running.structured_content["task"]["state"] == "running", running.structured_content
    # A wait that times out changes nothing: the task still runs.
    assert short.structured_content["task"]["state"] == "running"
    assert not cancelled.is_error and cancelled.structured_content == {"cancelled": True}
    assert waited.structured_content["task"]["state"] == "cancelled", waited.structured_content
    task = status.structured_content["task"]
    assert task["state"] == "cancelled" and task["finished_at"] is not None, task


def test_a_session_keeps_its_globals_branches_pauses_and_hibernates(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        call = session.call_tool
        await call("exec", {"code": "x = 41", "session": "mcp-s"})
        saved = await call("exec_session", {"op": "snapshot", "session": "mcp-s", "name": "n",
                                            "state": True})
        branched = await call("exec_session", {"op": "restore", "session": "mcp-s", "name": "n",
                                               "into": "mcp-b"})
        in_branch = await call("exec", {"code": "print(x + 1)", "session": "mcp-b"})
        paused = await call("exec_session", {"op": "pause", "session": "mcp-s"})
        resumed = await call("exec_session", {"op": "resume", "session": "mcp-s"})
        hibernated = await call("exec_session", {"op": "hibernate", "session": "mcp-s"})
        woke = await call("exec", {"code": "print(x)", "session": "mcp-s"})
        refused = await call("exec_session", {"op": "pause", "session": "mcp-s", "name": "n"})
        for name in ("mcp-s", "mcp-b"):
            await call("exec_session", {"op": "close", "session": name})
        return saved, branched, in_branch, paused, resumed, hibernated, woke, refused

    saved, branched, in_branch, paused, resumed, hibernated, woke, refused = run(kernel, body)
    assert saved.structured_content["snapshot"]["state"] is True, text_of(saved)
    assert branched.structured_content["session"] == "mcp-b", text_of(branched)
    assert in_branch.structured_content["stdout"] == "42\n", text_of(in_branch)
    assert paused.structured_content["state"] == "paused", text_of(paused)
    assert resumed.structured_content["state"] == "ready", text_of(resumed)
    assert hibernated.structured_content["state"] == "hibernated", text_of(hibernated)
    assert woke.structured_content["stdout"] == "41\n", text_of(woke)
    assert refused.is_error and "name" in text_of(refused)


def test_a_session_is_snapshotted_restored_and_closed(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        call = session.call_tool
        await call("exec", {"code": "open('/workspace/a.txt', 'w').write('before'); x = 1",
                            "session": "snap"})
        snapshot = await call("exec_session", {"op": "snapshot", "session": "snap", "name": "s1"})
        await call("exec", {"code": "open('/workspace/a.txt', 'w').write('after')",
                            "session": "snap"})
        changed = await call("exec", {"code": "print(open('/workspace/a.txt').read())",
                                      "session": "snap"})
        restored = await call("exec_session", {"op": "restore", "session": "snap", "name": "s1"})
        after = await call("exec", {"code": "print(open('/workspace/a.txt').read())",
                                    "session": "snap"})
        fresh = await call("exec", {"code": "print(x)", "session": "snap"})
        sessions = await call("exec_session", {"op": "list"})
        closed = await call("exec_session", {"op": "close", "session": "snap"})
        gone = await call("exec_session", {"op": "list"})
        missing = await call("exec_session", {"op": "restore", "session": "snap", "name": "nope"})
        return snapshot, changed, restored, after, fresh, sessions, closed, gone, missing

    snapshot, changed, restored, after, fresh, sessions, closed, gone, missing = run(kernel, body)
    assert not snapshot.is_error, text_of(snapshot)
    assert snapshot.structured_content["snapshot"]["name"] == "s1"
    assert changed.structured_content["stdout"] == "after\n"
    assert not restored.is_error, text_of(restored)
    assert restored.structured_content == {"session": "snap", "name": "s1", "restored": True}
    assert after.structured_content["stdout"] == "before\n"
    # The interpreter was restarted: its variables are gone.
    assert "NameError" in fresh.structured_content["error"]
    assert [s["session"] for s in sessions.structured_content["sessions"]] == ["snap"]
    assert closed.structured_content == {"closed": True}
    assert gone.structured_content["sessions"] == []
    assert missing.is_error, text_of(missing)


EVERYTHING = REPO / "scripts/mcp-servers/node_modules/.bin/mcp-server-everything"


@pytest.fixture(scope="module")
def everything_kernel() -> Iterator[Kernel]:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: tool servers run confined as the sandbox user, which needs root")
        pytest.skip("needs root")
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is not installed: run scripts/setup --test")
    with kernel_with(f'[mcp.servers.everything]\ncommand = "{EVERYTHING}"\n') as kernel:
        with AgentOSClient(kernel.socket_path) as client:
            deadline = time.monotonic() + 60
            while {s["name"]: s["state"] for s in client.tool_servers()}.get("everything") != "ready":
                assert time.monotonic() < deadline, client.tool_servers()
                time.sleep(0.1)
        yield kernel


def test_tools_search_and_call_reach_the_kernels_mcp_servers(everything_kernel):
    async def body(session: ClientSession):
        await session.initialize()
        brief = await session.call_tool("tools_search", {"query": "echo message back"})
        full = await session.call_tool("tools_search", {"query": "add two numbers sum",
                                                        "detail": True, "limit": 3})
        echo = await session.call_tool(
            "tools_call", {"server": "everything", "tool": "echo", "arguments": {"message": "hi"}}
        )
        added = await session.call_tool(
            "tools_call", {"server": "everything", "tool": "get-sum", "arguments": {"a": 2, "b": 3}}
        )
        unknown = await session.call_tool("tools_call", {"server": "everything", "tool": "nope"})
        return brief, full, echo, added, unknown

    brief, full, echo, added, unknown = run(everything_kernel, body)
    assert not brief.is_error, text_of(brief)
    found = brief.structured_content["tools"]
    assert ("everything", "echo") in {(t["server"], t["name"]) for t in found}, found
    assert all(t["description"] for t in found)
    assert all("input_schema" not in t for t in found), found
    detailed = full.structured_content["tools"]
    sums = [t for t in detailed if t["name"] == "get-sum"]
    assert sums and "properties" in sums[0]["input_schema"], detailed
    assert len(detailed) <= 3
    assert not echo.is_error, text_of(echo)
    assert "hi" in str(echo.structured_content["result"]), echo.structured_content
    assert echo.structured_content["content"], echo.structured_content
    assert not added.is_error, text_of(added)
    assert "5" in str(added.structured_content["result"]), added.structured_content
    assert unknown.is_error and "nope" in text_of(unknown), text_of(unknown)


def test_agent_logs_of_a_spawned_agent(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        spawned = await session.call_tool(
            "spawn", {"name": "talker",
                      "command": ["sh", "-c", "echo one; echo two; echo three; sleep 300"]}
        )
        for _ in range(150):
            logs = await session.call_tool("agent_logs", {"name": "talker", "lines": 2})
            if not logs.is_error and logs.structured_content["text"].count("\n") == 2:
                break
            await asyncio.sleep(0.1)
        by_id = await session.call_tool(
            "agent_logs", {"id": spawned.structured_content["id"]}
        )
        await session.call_tool("kill", {"name": "talker"})
        missing = await session.call_tool("agent_logs", {"name": "no-such-agent"})
        return spawned, logs, by_id, missing

    spawned, logs, by_id, missing = run(kernel, body)
    assert not spawned.is_error, text_of(spawned)
    assert not logs.is_error, text_of(logs)
    assert logs.structured_content["text"] == "two\nthree\n", logs.structured_content
    assert logs.structured_content["name"] == "talker" and logs.structured_content["ended"] is False
    assert text_of(logs) == "two\nthree\n"
    assert by_id.structured_content["text"] == "one\ntwo\nthree\n", by_id.structured_content
    assert missing.is_error and "(not_found)" in text_of(missing), text_of(missing)


def test_bad_arguments_on_the_new_tools(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        return [
            await session.call_tool("task_wait", {"task_id": "t-1", "timeout_ms": "soon"}),
            await session.call_tool("task_dispatch", {"code": "print(1)", "prompt": "hi"}),
            await session.call_tool("task_dispatch", {"prompt": "hi", "session": "s"}),
            await session.call_tool("tools_call", {"tool": "echo"}),
            await session.call_tool("exec_session", {"op": "snapshot", "session": "s"}),
            await session.call_tool("agent_logs", {}),
            await session.call_tool("task_wait", {"task_id": "t-no-such-task"}),
            await session.call_tool("exec_session", {"op": "list", "session": "s"}),
            await session.call_tool("exec_session", {"op": "list", "sesion": "s"}),
            await session.call_tool("exec", {"code": "print(1)", "network": {"dney": ["*"]}}),
            await session.call_tool("exec_session", {"op": "list"}),
        ]

    results = run(kernel, body)
    *refused, still = results
    for result in refused:
        assert result.is_error, text_of(result)
        assert result.structured_content is None
    texts = [text_of(result) for result in refused]
    assert texts[0].startswith("argument timeout_ms:"), texts[0]
    assert "code and prompt" in texts[1], texts[1]
    assert "go with code" in texts[2], texts[2]
    assert "`server`" in texts[3], texts[3]
    assert texts[4] == "argument name: op snapshot needs it", texts[4]
    assert "name and id" in texts[5], texts[5]
    assert "(not_found)" in texts[6], texts[6]
    assert texts[7] == "argument session: op list does not take it", texts[7]
    # An argument no tool takes is refused by name, at any depth: the
    # schemas leave additionalProperties out, the server does not.
    assert "`sesion`" in texts[8], texts[8]
    assert texts[9] == "unknown argument network.dney", texts[9]
    assert not still.is_error and still.structured_content == {"sessions": []}


def test_state_and_messages_reach_the_kernels_store_and_mailboxes(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        inbox = client.spawn("mcp-inbox", command=["/bin/sleep", "30"])["id"]

    async def body(session):
        await session.initialize()
        stored = await session.call_tool("state", {"op": "set", "key": "mcp:k", "value": {"n": 1}})
        got = await session.call_tool("state", {"op": "get", "key": "mcp:k"})
        listed = await session.call_tool("state", {"op": "list", "prefix": "mcp:"})
        missing = await session.call_tool("state", {"op": "set", "key": "mcp:k"})
        sent = await session.call_tool("messages", {"op": "send", "to": "mcp-inbox",
                                                    "message": {"task": 1}})
        received = await session.call_tool("messages", {"op": "recv"})
        return stored, got, listed, missing, sent, received

    stored, got, listed, missing, sent, received = run(kernel, body)
    assert not stored.is_error and got.structured_content["value"] == {"n": 1}
    assert listed.structured_content["keys"] == ["mcp:k"]
    assert missing.is_error and "value" in text_of(missing)
    with AgentOSClient(kernel.socket_path) as client:
        assert client.fetch("mcp:k")["value"] == {"n": 1}, "the operator's tree shares it"
    assert not sent.is_error, text_of(sent)
    assert sent.structured_content["delivered_to"] == inbox
    assert not received.is_error and received.structured_content["count"] == 0
