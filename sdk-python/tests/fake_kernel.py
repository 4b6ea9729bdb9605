"""A scripted socket that stands in for the kernel, for tests that need
replies no real kernel gives on demand (a fault, a slow answer)."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Union

import pytest

from agentos import HEADER_LEN
from agentos.protocol import decode_header, encode_frame

# A scripted answer: a JSON reply, or a function of the request's payload
# that returns one. A ("delay", seconds, answer) tuple answers late.
Answer = Union[dict, list, Callable[[dict], Union[dict, list]]]


class FakeKernel:
    """Accepts one connection, records each request and answers it with the
    next scripted reply (under the request's opcode), then closes."""

    def __init__(self, path: str, replies: list) -> None:
        self.path = path
        self.replies = list(replies)
        self.requests: list[tuple[int, bytes]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def json_requests(self) -> list:
        return [json.loads(payload) if payload else None for _, payload in self.requests]

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            for reply in self.replies:
                try:
                    header = decode_header(_read_exact(conn, HEADER_LEN))
                    payload = _read_exact(conn, header.payload_len)
                except ConnectionError:
                    return
                self.requests.append((header.opcode, payload))
                delay = 0.0
                if isinstance(reply, tuple):
                    _, delay, reply = reply
                if callable(reply):
                    reply = reply(json.loads(payload))
                time.sleep(delay)
                body = json.dumps(reply).encode()
                try:
                    conn.sendall(encode_frame(header.opcode, body, agent_id=1_000_000))
                except OSError:
                    return

    def close(self) -> None:
        self._server.close()
        self._thread.join(timeout=10)


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


@pytest.fixture
def fake_kernel(socket_dir: Path) -> Iterator[Callable[[list], FakeKernel]]:
    """Starts fake kernels answering the given replies; closes them after."""
    started: list[FakeKernel] = []

    def start(replies: list) -> FakeKernel:
        fake = FakeKernel(str(socket_dir / f"k{len(started)}.sock"), replies)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.close()
