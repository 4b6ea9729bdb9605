"""`agentos mcp` driven by another MCP client than the Python SDK: the MCP
inspector's CLI (npm `@modelcontextprotocol/inspector-cli`, pinned in
tests/mcp-clients) lists the server's tools and calls `exec` over stdio,
against a real agentosd."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, binary
from test_mcp_server import HINTS, TOOLS, effective_hints

CLIENTS = REPO / "tests/mcp-clients/node_modules/.bin"
INSPECTOR = CLIENTS / "mcp-inspector-cli"
# The inspector's CLI (1.0.3) checks for its own package.json at
# ../package.json from the working directory but imports it from its
# module's directory: from its build directory the two agree.
INSPECTOR_BUILD = CLIENTS.parent / "@modelcontextprotocol/inspector-cli/build"


def inspector(kernel, tmp_path: Path, *method: str) -> dict:
    """Runs the inspector's CLI mode on `agentos mcp` with these method
    arguments; its JSON output."""
    if not INSPECTOR.exists():
        pytest.fail(f"{INSPECTOR} is not installed: run scripts/setup --test")
    # The server as an MCP client's configuration names it, so the
    # inspector's own option parsing never sees agentos's options.
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"agentos": {
        "command": str(binary("agentos")),
        "args": ["--socket", kernel.socket_path, "mcp"],
    }}}))
    # The inspector starts its CLI with the first `node` on PATH: the
    # pinned Node 22 beside it, not whatever the host has.
    env = {**os.environ, "PATH": f"{CLIENTS}:{os.environ['PATH']}"}
    done = subprocess.run(
        [str(INSPECTOR), "--cli", "--config", str(config), "--server", "agentos", *method],
        capture_output=True, text=True, timeout=120, env=env, cwd=INSPECTOR_BUILD,
    )
    assert done.returncode == 0, f"stdout: {done.stdout}\nstderr: {done.stderr}"
    return json.loads(done.stdout)


def test_the_inspector_lists_the_tools(kernel, tmp_path):
    listed = inspector(kernel, tmp_path, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert set(tools) == TOOLS
    assert tools["exec"]["inputSchema"]["required"] == ["code"]
    for name, tool in tools.items():
        assert effective_hints(tool["annotations"]) == HINTS[name], name


def test_the_inspector_calls_exec(kernel, tmp_path):
    called = inspector(
        kernel, tmp_path,
        "--method", "tools/call", "--tool-name", "exec", "--tool-arg", "code=print(6*7)",
    )
    assert called.get("isError") is not True, called
    assert called["structuredContent"]["stdout"] == "42\n", called
    assert called["structuredContent"]["exit_code"] == 0, called
    assert called["content"] == [{"type": "text", "text": "42\n"}], called
