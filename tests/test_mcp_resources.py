"""`agentos mcp`'s resources, end to end: PyPI's MCP client lists and
reads an agent's log, a session's files and a task's result through the
server over stdio, against a real agentosd; hostile URIs are refused
before they reach the kernel."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

import mcp.types as types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from test_mcp_server import run, text_of

INVALID_PARAMS = -32602
RESOURCE_NOT_FOUND = -32002
PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\xff"


async def read_error(session: ClientSession, uri: str) -> MCPError:
    with pytest.raises(MCPError) as raised:
        await session.read_resource(uri)
    return raised.value


def test_resources_are_a_capability_with_three_templates(kernel):
    async def body(session: ClientSession):
        init = await session.initialize()
        templates = await session.list_resource_templates()
        listed = await session.list_resources()
        return init, templates, listed

    init, templates, listed = run(kernel, body)
    assert init.capabilities.resources is not None
    by_template = {t.uri_template: t for t in templates.resource_templates}
    assert set(by_template) == {
        "agentos://agents/{name}/log",
        "agentos://sessions/{session}/{+path}",
        "agentos://tasks/{task_id}/result",
    }
    assert by_template["agentos://agents/{name}/log"].mime_type == "text/plain"
    assert by_template["agentos://tasks/{task_id}/result"].mime_type == "application/json"
    assert all(t.name and t.description for t in templates.resource_templates)
    # A fresh kernel: no agents, sessions or tasks of the caller's.
    assert listed.resources == []


def test_a_log_session_files_and_a_task_result_are_listed_and_read(kernel):
    write_files = (
        "import os\n"
        "open('notes.md', 'w').write('# Notes\\nall good\\n')\n"
        "open('plot.png', 'wb').write(%r)\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/with space.txt', 'w').write('spaced')\n"
        "kept = 41\n" % PNG_BYTES
    )

    async def body(session: ClientSession):
        await session.initialize()
        call = session.call_tool
        spawned = await call("spawn", {"name": "talker",
                                       "command": ["sh", "-c", "echo hello from talker; sleep 300"]})
        wrote = await call("exec", {"code": write_files, "session": "work"})
        dispatched = await call("task_dispatch", {"code": "print(6 * 7)", "label": "answer"})
        task_id = dispatched.structured_content["task_id"]
        await call("task_wait", {"task_id": task_id, "timeout_ms": 30000})
        for _ in range(150):
            log = await session.read_resource("agentos://agents/talker/log")
            if "hello" in log.contents[0].text:
                break
            await asyncio.sleep(0.1)
        listed = await session.list_resources()
        notes = await session.read_resource("agentos://sessions/work/notes.md")
        plot = await session.read_resource("agentos://sessions/work/plot.png")
        spaced = await session.read_resource("agentos://sessions/work/out/with%20space.txt")
        result = await session.read_resource(f"agentos://tasks/{task_id}/result")
        # Reading left the session's interpreter as it was.
        after = await call("exec", {"code": "print(kept + 1)", "session": "work"})
        await call("kill", {"name": "talker"})
        return spawned, wrote, task_id, log, listed, notes, plot, spaced, result, after

    spawned, wrote, task_id, log, listed, notes, plot, spaced, result, after = run(kernel, body)
    assert not spawned.is_error, text_of(spawned)
    assert wrote.structured_content["exit_code"] == 0, wrote.structured_content

    (log_contents,) = log.contents
    assert isinstance(log_contents, types.TextResourceContents)
    assert log_contents.text == "hello from talker\n"
    assert log_contents.mime_type == "text/plain"
    assert log_contents.uri == "agentos://agents/talker/log"

    resources = {r.uri: r for r in listed.resources}
    assert resources["agentos://agents/talker/log"].mime_type == "text/plain"
    assert resources["agentos://sessions/work/notes.md"].mime_type == "text/markdown"
    assert resources["agentos://sessions/work/notes.md"].size == len("# Notes\nall good\n")
    assert resources["agentos://sessions/work/plot.png"].mime_type == "image/png"
    assert resources["agentos://sessions/work/out/with%20space.txt"].size == len("spaced")
    assert resources[f"agentos://tasks/{task_id}/result"].mime_type == "application/json"
    assert len(resources) == 5, sorted(resources)
    assert all(r.name for r in listed.resources)

    (notes_contents,) = notes.contents
    assert isinstance(notes_contents, types.TextResourceContents)
    assert notes_contents.text == "# Notes\nall good\n"
    assert notes_contents.mime_type == "text/markdown"

    (plot_contents,) = plot.contents
    assert isinstance(plot_contents, types.BlobResourceContents)
    assert base64.b64decode(plot_contents.blob) == PNG_BYTES
    assert plot_contents.mime_type == "image/png"

    assert spaced.contents[0].text == "spaced"

    (result_contents,) = result.contents
    assert result_contents.mime_type == "application/json"
    task = json.loads(result_contents.text)
    assert task["task_id"] == task_id and task["state"] == "completed", task
    assert task["label"] == "answer" and task["result"]["stdout"] == "42\n", task

    assert after.structured_content["stdout"] == "42\n", after.structured_content


def test_hostile_and_unknown_uris_are_refused_and_the_kernel_is_untouched(kernel):
    async def body(session: ClientSession):
        await session.initialize()
        refused = {
            uri: await read_error(session, uri)
            for uri in [
                "agentos://sessions/s/../../etc/passwd",
                "agentos://sessions/s/%2e%2e/%2e%2e/etc/passwd",
                "agentos://sessions/s//etc/passwd",
                "agentos://agents/../../log",
                "file:///etc/passwd",
                "https://example.com/",
                "agentos://elsewhere/x",
                "agentos://tasks/t-1/result?all=1",
            ]
        }
        huge = await read_error(session, "agentos://sessions/s/" + "a/" * (1 << 19))
        missing = {
            uri: await read_error(session, uri)
            for uri in [
                "agentos://agents/no-such-agent/log",
                "agentos://sessions/no-such-session/a.txt",
                "agentos://tasks/t-0000000000000000/result",
            ]
        }
        await session.call_tool("exec", {"code": "open('here.txt', 'w').write('x')", "session": "real"})
        no_file = await read_error(session, "agentos://sessions/real/absent.txt")
        directory = await read_error(session, "agentos://sessions/real/.")
        sleeper = await session.call_tool("task_dispatch", {"code": "import time; time.sleep(60)"})
        task_id = sleeper.structured_content["task_id"]
        unfinished = await read_error(session, f"agentos://tasks/{task_id}/result")
        await session.call_tool("task_cancel", {"task_id": task_id})
        sessions = await session.call_tool("exec_session", {"op": "list"})
        still = await session.call_tool("exec", {"code": "print(1)"})
        return refused, huge, missing, no_file, directory, unfinished, sessions, still

    refused, huge, missing, no_file, directory, unfinished, sessions, still = run(kernel, body)
    for uri, error in refused.items():
        assert error.code == INVALID_PARAMS, (uri, error.code, error.message)
    assert "/workspace" in refused["agentos://sessions/s/../../etc/passwd"].message
    assert "agentos://agents/{name}/log" in refused["file:///etc/passwd"].message
    assert huge.code == INVALID_PARAMS and "at most" in huge.message, huge.message
    assert len(huge.message) < 300
    for uri, error in missing.items():
        assert error.code == RESOURCE_NOT_FOUND, (uri, error.code, error.message)
    assert "no-such-session" in missing["agentos://sessions/no-such-session/a.txt"].message
    assert no_file.code == RESOURCE_NOT_FOUND and "no such file" in no_file.message, no_file.message
    assert directory.code == INVALID_PARAMS, directory.message
    assert unfinished.code == RESOURCE_NOT_FOUND and "not finished" in unfinished.message
    # Nothing named a session into being: only the one an exec made.
    assert [s["session"] for s in sessions.structured_content["sessions"]] == ["real"]
    assert still.structured_content["stdout"] == "1\n"
    assert kernel.process.poll() is None
