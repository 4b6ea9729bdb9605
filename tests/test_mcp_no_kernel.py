"""`agentos mcp` started as an MCP client starts it: with no environment
at all (no AGENTOS_SOCKET, no XDG_RUNTIME_DIR, no PATH), and no kernel at
the socket it resolves. It must still start and list its tools, say in
`initialize` and in every tool error which socket it tried and how the
client's configuration sets another, and serve a kernel that comes up
later without being restarted.

The server is driven over raw JSON-RPC lines, not through an MCP SDK,
because an SDK's stdio client adds an environment of its own."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from conftest import RUNNING_KERNELS, binary, kernel_with, start_kernel

# How a reply must say the client's configuration sets the socket.
FIXES = ("agentos mcp --socket PATH", "AGENTOS_SOCKET", "`env`")


class StdioServer:
    """`agentos mcp` on pipes, spoken to one JSON-RPC line at a time."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.process = subprocess.Popen(
            [str(binary("agentos")), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        self.next_id = 0

    def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method: str, params: Optional[dict] = None, timeout: float = 60) -> dict:
        """The result of one request; fails the test on a JSON-RPC error."""
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        assert self.process.stdout is not None
        while True:
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            assert ready, f"no answer to {method} within {timeout} s"
            line = self.process.stdout.readline()
            assert line, f"the server exited on {method}: {self.stderr()}"
            message = json.loads(line)
            # Notifications (progress, logging) are not the answer.
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def initialize(self) -> dict:
        result = self.request("initialize", {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        })
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    def call(self, tool: str, arguments: dict[str, Any]) -> dict:
        return self.request("tools/call", {"name": tool, "arguments": arguments})

    def stderr(self) -> str:
        self.close()
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def text_of(result: dict) -> str:
    return "".join(block["text"] for block in result["content"] if block["type"] == "text")


def says_socket_and_fix(text: str, socket_path: str) -> None:
    assert socket_path in text, text
    for fix in FIXES:
        assert fix in text, f"{fix!r} missing from: {text}"


def nothing_listens_at(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(path)
        return False
    except OSError:
        return True
    finally:
        probe.close()


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short, like the kernel fixture's: a Unix socket address holds 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_with_no_environment_a_missing_kernel_is_named_and_a_later_one_serves(workdir):
    socket_path = str(workdir / "agentos.sock")
    server = StdioServer(["mcp", "--socket", socket_path], env={})
    try:
        init = server.initialize()
        assert init["serverInfo"]["name"] == "agentos"
        says_socket_and_fix(init["instructions"], socket_path)
        assert "AgentOS" in init["instructions"]
        tools = server.request("tools/list")["tools"]
        assert {"status", "exec", "list_agents"} <= {tool["name"] for tool in tools}

        status = server.call("status", {})
        assert status.get("isError") is True, status
        assert "structuredContent" not in status, status
        says_socket_and_fix(text_of(status), socket_path)
        assert text_of(status).startswith("cannot connect to the AgentOS kernel at"), status
        ran = server.call("exec", {"code": "print(6 * 7)"})
        assert ran.get("isError") is True, ran
        says_socket_and_fix(text_of(ran), socket_path)
        listed = server.call("list_agents", {})
        assert listed.get("isError") is True, listed
        says_socket_and_fix(text_of(listed), socket_path)

        # The kernel comes up at the socket the server was given; the same
        # server, never restarted, now reaches it.
        kernel = start_kernel(workdir)
        RUNNING_KERNELS.append(kernel)
        try:
            status = server.call("status", {})
            assert status.get("isError") is not True, text_of(status)
            assert status["structuredContent"]["kernel_version"], status
            ran = server.call("exec", {"code": "print(6 * 7)"})
            assert ran.get("isError") is not True, text_of(ran)
            assert ran["structuredContent"]["stdout"] == "42\n", ran
        finally:
            RUNNING_KERNELS.remove(kernel)
            kernel.stop()
    finally:
        server.close()
    stderr = server.stderr()
    assert server.process.returncode == 0, stderr
    # A client keeps the server's stderr in its log: the start said it there too.
    says_socket_and_fix(stderr, socket_path)


def test_with_no_environment_and_no_flag_the_default_socket_is_the_one_named():
    # What the resolution gives with no AGENTOS_SOCKET and no XDG_RUNTIME_DIR.
    uid = os.geteuid()
    default = "/run/agentos/agentos.sock" if uid == 0 else f"/tmp/agentos-{uid}/agentos.sock"
    if not nothing_listens_at(default):
        pytest.skip(f"a kernel listens at the default socket {default}")
    server = StdioServer(["mcp"], env={})
    try:
        init = server.initialize()
        says_socket_and_fix(init["instructions"], default)
        status = server.call("status", {})
        assert status.get("isError") is True, status
        says_socket_and_fix(text_of(status), default)
    finally:
        server.close()


def test_a_socket_given_in_the_clients_env_alone_reaches_the_kernel():
    with kernel_with() as kernel:
        server = StdioServer(["mcp"], env={"AGENTOS_SOCKET": kernel.socket_path})
        try:
            init = server.initialize()
            # A kernel that answered at start leaves nothing to fix.
            assert "--socket" not in init["instructions"], init["instructions"]
            status = server.call("status", {})
            assert status.get("isError") is not True, text_of(status)
            assert status["structuredContent"]["features"]["exec"] is True, status
        finally:
            server.close()


def test_a_bad_socket_flag_names_the_flag_path_not_the_environments(workdir):
    given = str(workdir / "given.sock")
    with kernel_with() as kernel:
        # --socket wins over AGENTOS_SOCKET, even when only the latter works:
        # the error must name the path actually tried.
        server = StdioServer(
            ["mcp", "--socket", given], env={"AGENTOS_SOCKET": kernel.socket_path}
        )
        try:
            init = server.initialize()
            says_socket_and_fix(init["instructions"], given)
            assert kernel.socket_path not in init["instructions"]
            status = server.call("status", {})
            assert status.get("isError") is True, status
            says_socket_and_fix(text_of(status), given)
        finally:
            server.close()
