"""TOOL through the Python SDK, against a real agentosd running PyPI's
mcp-server-time (installed into the project's .venv by scripts/setup)."""

from __future__ import annotations

import os
import time

import pytest

from agentos import AgentOSClient, NotFound, ToolError
from conftest import REPO, kernel_with

TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"


@pytest.fixture
def tool_kernel():
    if os.geteuid() != 0:
        print("!!! NOT TESTED: tool servers run confined as the sandbox user, which needs root")
        pytest.skip("needs root")
    if not TIME_SERVER.exists():
        pytest.fail(f"{TIME_SERVER} is not installed: run scripts/setup")
    with kernel_with(f'[mcp.servers.time]\ncommand = "{TIME_SERVER}"\n') as kernel:
        yield kernel


def ready(client: AgentOSClient) -> dict:
    deadline = time.monotonic() + 30
    while True:
        servers = client.tool_servers()
        states = {s["name"]: s["state"] for s in servers}
        if states.get("time") in ("ready", "failed"):
            return {"servers": servers, "tools": client.tools()}
        assert time.monotonic() < deadline, servers
        time.sleep(0.05)


def test_tools_search_and_call_through_the_sdk(tool_kernel):
    with AgentOSClient(tool_kernel.socket_path) as client:
        listing = ready(client)
        assert listing["servers"] == [{"name": "time", "state": "ready", "error": None, "tools": 2}]
        names = {(t["server"], t["name"]) for t in listing["tools"]}
        assert {("time", "get_current_time"), ("kernel", "list_agents"), ("llm", "think")} <= names

        found = client.search_tools("convert time zone", detail="full", limit=1)
        assert [t["name"] for t in found] == ["convert_time"]
        assert "properties" in found[0]["input_schema"]

        now = client.call_tool("time", "get_current_time", timezone="Europe/Paris")
        assert now["timezone"] == "Europe/Paris"
        assert client.call_tool("kernel", "list_agents") == []

        # The server's own complaint, as an error with its code.
        with pytest.raises(ToolError) as refused:
            client.call_tool("time", "get_current_time", timezone="Mars/Olympus")
        assert refused.value.code == "tool_error"
        assert "Mars/Olympus" in str(refused.value)
        with pytest.raises(NotFound) as missing:
            client.call_tool("time", "no_such_tool")
        assert missing.value.code == "not_found"
