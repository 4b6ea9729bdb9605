"""LOGS through the Python SDK (`logs`) and the CLI (`agentos logs`)
against a real agentosd."""

from __future__ import annotations

import subprocess
import time

import pytest

from agentos import AgentOSClient, NotFound
from conftest import binary


def wait_for(client: AgentOSClient, name: str, text: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = client.logs(name)
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not in {log!r}"
        time.sleep(0.02)


def test_sdk_tail_and_follow(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        client.spawn("printer", command=["/bin/sh", "-c",
                                         "for i in 1 2 3; do echo n$i; done; sleep 1000"])
        assert wait_for(client, "printer", "n3") == "n1\nn2\nn3\n"
        assert client.logs("printer", lines=1) == "n3\n"
        client.spawn("ticker", command=["/bin/sh", "-c",
                                        "echo a; sleep 0.3; echo b; sleep 0.3; echo c"])
        # A follow gives everything, piece by piece, and ends with the agent.
        pieces = list(client.follow_logs("ticker"))
        assert "".join(pieces) == "a\nb\nc\n"
        assert len(pieces) >= 2, pieces
        with pytest.raises(NotFound) as missing:
            client.logs("nobody")
        assert missing.value.code == "not_found"


def agentos(kernel, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("agentos"), "--socket", kernel.socket_path, *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_cli_logs_tail_follow_and_errors(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        agent = client.spawn("chatty", command=["/bin/sh", "-c",
                                                "for i in 1 2 3 4; do echo m$i; done; sleep 1000"])
        wait_for(client, "chatty", "m4")
    out = agentos(kernel, "logs", "chatty", "-n", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "m3\nm4\n"
    by_id = agentos(kernel, "logs", str(agent["id"]))
    assert by_id.stdout == "m1\nm2\nm3\nm4\n"
    # -f prints as the agent writes and returns when it ends.
    with AgentOSClient(kernel.socket_path) as client:
        client.spawn("ender", command=["/bin/sh", "-c", "echo start; sleep 0.5; echo finish"])
    started = time.monotonic()
    followed = agentos(kernel, "logs", "ender", "-f")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "start\nfinish\n"
    assert time.monotonic() - started < 10
    missing = agentos(kernel, "logs", "nobody")
    assert missing.returncode == 1
    assert "not_found" in missing.stderr or "no agent named" in missing.stderr, missing.stderr
