"""AgentOSClient.think against a scripted socket that stands in for the kernel."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest

from agentos import HEADER_LEN, AgentOSClient, AgentOSError, Opcode
from agentos.protocol import decode_header, encode_frame

ANSWER = {
    "success": True, "content": "4", "tokens": 31, "error": None,
    "usage": {"prompt_tokens": 30, "completion_tokens": 1, "total_tokens": 31},
    "model": "SmolLM2-135M-Instruct", "queue_ms": 0, "latency_ms": 120,
}


class FakeKernel:
    """Accepts one connection, records each request and answers it with the
    next scripted reply."""

    def __init__(self, path: str, replies: list[dict]) -> None:
        self.path = path
        self.replies = list(replies)
        self.requests: list[tuple[int, bytes]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            for reply in self.replies:
                header = decode_header(_read_exact(conn, HEADER_LEN))
                payload = _read_exact(conn, header.payload_len)
                self.requests.append((header.opcode, payload))
                body = json.dumps(reply).encode()
                conn.sendall(encode_frame(header.opcode, body, agent_id=1_000_000))

    def close(self) -> None:
        self._server.close()
        self._thread.join(timeout=5)


def _read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short, unlike tmp_path: a Unix socket address holds 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="agentos-sdk-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ask(socket_dir: Path, reply: dict, **kwargs):
    """Runs one think() call against a fake kernel answering ``reply``;
    returns the call's result (or exception) and the request it sent."""
    fake = FakeKernel(str(socket_dir / "k.sock"), [reply])
    try:
        with AgentOSClient(fake.path, timeout=5) as client:
            try:
                result = client.think(**kwargs)
            except AgentOSError as err:
                result = err
    finally:
        fake.close()
    opcode, payload = fake.requests[0]
    assert opcode == Opcode.THINK
    return result, json.loads(payload)


def test_think_sends_only_the_fields_given_and_returns_the_reply(socket_dir):
    reply, request = ask(socket_dir, ANSWER, prompt="What is 2+2?")
    assert request == {"prompt": "What is 2+2?"}
    assert reply == ANSWER
    assert reply["content"] == "4"


def test_think_sends_every_option_in_the_structured_form(socket_dir):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    _, request = ask(
        socket_dir, ANSWER, prompt="and now?", system="be brief", model="m",
        max_tokens=64, temperature=0.0, messages=history,
    )
    assert request == {
        "prompt": "and now?", "system": "be brief", "model": "m", "max_tokens": 64,
        "temperature": 0.0, "messages": history,
    }


def test_think_accepts_messages_alone(socket_dir):
    _, request = ask(socket_dir, ANSWER, messages=[{"role": "user", "content": "hi"}])
    assert request == {"messages": [{"role": "user", "content": "hi"}]}


def test_a_failed_think_raises_with_the_kernels_code_and_message(socket_dir):
    refusal = {
        "success": False, "content": "", "tokens": 0, "code": "limit_exceeded",
        "error": "agent 3 has used 50 of its 50 LLM tokens",
    }
    err, _ = ask(socket_dir, refusal, prompt="more?")
    assert isinstance(err, AgentOSError)
    assert err.code == "limit_exceeded"
    assert err.message == refusal["error"]


def test_think_without_prompt_or_messages_is_refused_before_sending(socket_dir):
    client = AgentOSClient(socket_dir / "none.sock")
    for empty in ({}, {"prompt": ""}, {"messages": []}, {"prompt": None, "system": "s"}):
        with pytest.raises(ValueError, match="prompt or messages"):
            client.think(**empty)
    assert not client.connected
