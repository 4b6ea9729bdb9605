"""Each error code a real agentosd can be made to send reaches the caller
as its own exception class. (``internal`` cannot be provoked from outside;
the SDK's own tests cover it, and every other code, with a fake kernel.)"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import REPO, Kernel, kernel_with, wait_state

import agentos
from agentos import AgentOSClient, Opcode
from agentos.protocol import HEADER_LEN, decode_header, encode_frame


def raised(call) -> agentos.AgentOSError:
    with pytest.raises(agentos.AgentOSError) as err:
        call()
    return err.value


def test_bad_request(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        err = raised(lambda: client.spawn("w", command=["/bin/true"], restart_policy="sometimes"))
    assert type(err) is agentos.BadRequest and err.code == "bad_request"
    assert "restart_policy" in err.message


def test_unknown_opcode(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        err = raised(lambda: client.call_json(0x42))
        assert type(err) is agentos.UnknownOpcode
        assert client.echo("still open") == "still open"


def test_not_found(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        for call in (lambda: client.kill("nobody"), lambda: client.logs("nobody"),
                     lambda: client.task_status("t-0123456789abcdef"),
                     lambda: client.wait_task("t-0123456789abcdef", timeout=5)):
            assert type(raised(call)) is agentos.NotFound


def test_already_exists(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        client.spawn("twin", command=["/bin/sleep", "30"])
        err = raised(lambda: client.spawn("twin", command=["/bin/sleep", "30"]))
    assert type(err) is agentos.AlreadyExists and "twin" in err.message


AGENT_ASKS_FOR_MORE = """\
import agentos
with agentos.AgentOSClient() as kernel:
    try:
        kernel.spawn("child", command=["/bin/true"])
        print("spawned")
    except agentos.PermissionDenied as err:
        print("refused:", type(err).__name__, err.code)
"""


@pytest.fixture
def script_dir() -> Iterator[Path]:
    """A directory agents (running as another user) can read scripts from."""
    path = Path(tempfile.mkdtemp(prefix="agentos-sdk-scripts-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_permission_denied(kernel, script_dir):
    """An agent without ``permissions.spawn`` asks to spawn."""
    script = script_dir / "asker.py"
    script.write_text(AGENT_ASKS_FOR_MORE)
    script.chmod(0o644)
    with AgentOSClient(kernel.socket_path) as client:
        agent = client.spawn("asker", script, python=sys.executable,
                             permissions={"spawn": False})
        wait_state(client, agent["id"], {"exited", "failed"})
        log = client.logs("asker")
    assert log == "refused: PermissionDenied permission_denied\n", log


def test_limit_exceeded(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        err = raised(lambda: client.spawn("tiny", command=["/bin/true"],
                                          limits={"memory": "4K"}))
    assert type(err) is agentos.LimitExceeded, err
    assert "memory" in err.message


def test_busy(kernel):
    """An operator's connection may have 16 log follows waiting; one more
    is refused as busy."""
    with AgentOSClient(kernel.socket_path, timeout=30) as client:
        client.spawn("quiet", command=["/bin/sleep", "30"])
        follows = 17
        with client._lock:
            for _ in range(follows):
                client.send(Opcode.LOGS, {"name": "quiet", "follow": True, "wait_ms": 1500})
            replies = [json.loads(client.recv(deadline_ms=1500).payload) for _ in range(follows)]
    refused = [r for r in replies if r.get("success") is False]
    assert [r["code"] for r in refused] == ["busy"], replies
    assert type(agentos.connection.failure_of(refused[0])) is agentos.Busy


def test_unavailable(kernel):
    """This kernel has no LLM."""
    with AgentOSClient(kernel.socket_path) as client:
        err = raised(lambda: client.think("2+2?"))
    assert type(err) is agentos.Unavailable


@pytest.fixture(scope="module")
def tool_kernel() -> Iterator[Kernel]:
    everything = REPO / "scripts/mcp-servers/node_modules/.bin/mcp-server-everything"
    if not everything.exists():
        pytest.fail(f"{everything} is not installed: run scripts/setup --test")
    with kernel_with(f'[mcp.servers.everything]\ncommand = "{everything}"\n') as kernel:
        yield kernel


def ready(client: AgentOSClient) -> None:
    deadline = time.monotonic() + 60
    while {s["name"]: s["state"] for s in client.tool_servers()}.get("everything") != "ready":
        assert time.monotonic() < deadline, client.tool_servers()
        time.sleep(0.1)


def test_timeout_and_tool_error(tool_kernel):
    with AgentOSClient(tool_kernel.socket_path) as client:
        ready(client)
        slow = lambda: client.call_tool("everything", "trigger-long-running-operation",  # noqa: E731
                                        duration=10, steps=2, timeout_ms=300)
        err = raised(slow)
        assert type(err) is agentos.Timeout and isinstance(err, TimeoutError), err
        err = raised(lambda: client.call_tool("everything", "get-sum", a="one", b=2))
        assert type(err) is agentos.ToolError, err


def test_cancelled_and_interrupted_task_results_name_their_class(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        task_id = client.dispatch("exec", {"code": "import time; time.sleep(60)"})
        client.cancel_task(task_id)
        task = client.wait_task(task_id, timeout=30)
    assert task["state"] == "cancelled"
    assert type(agentos.error_for(task["result"]["code"], "")) is agentos.Cancelled
    interrupted = agentos.error_for("interrupted", "the kernel stopped")
    assert type(interrupted) is agentos.Interrupted


def test_payload_too_large(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        limit = client.hello()["limits"]["max_request_bytes"]
        err = raised(lambda: client.call_json(Opcode.HELLO, b" " * (limit + 1)))
    assert type(err) is agentos.PayloadTooLarge, err


def test_bad_magic(kernel):
    """A frame with the wrong magic gets the kernel's parting error."""
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(kernel.socket_path)
        raw.sendall(b"NOPE" + encode_frame(Opcode.NOOP, b"")[4:])
        data = b""
        while True:
            chunk = raw.recv(65536)
            if not chunk:
                break
            data += chunk
    header = decode_header(data[:HEADER_LEN])
    reply = agentos.Reply(header.agent_id, header.opcode, data[HEADER_LEN:])
    value = agentos.connection.decode_json(reply, Opcode.NOOP)
    assert type(agentos.connection.failure_of(value)) is agentos.BadMagic


def test_connection_refused_is_a_connection_error(tmp_path):
    err = raised(lambda: AgentOSClient(tmp_path / "no.sock").hello())
    assert isinstance(err, ConnectionError) and err.code == "connection"
