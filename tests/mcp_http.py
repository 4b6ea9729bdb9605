"""`agentos mcp --http` for a test: started on a port the kernel picks,
its URL read from the line it prints, stopped with SIGTERM. Without a
token given, the server makes one in a config directory of the test's
own, and says where: `token` is what it made, `auth` the header to send."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Iterator

from conftest import binary

LISTENING = re.compile(r"agentos mcp: listening on (http://(.+):(\d+)/mcp)$")
TOKEN_FILE = re.compile(r"TOKEN being the content of (\S+) \(")


@dataclass
class HttpServer:
    url: str
    host: str
    port: int
    process: subprocess.Popen
    stderr: list[str] = field(default_factory=list)
    token_file: str | None = None
    token: str | None = None

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header the server's own token makes."""
        assert self.token, "the test gave the server its token"
        return {"Authorization": f"Bearer {self.token}"}


def rpc_reply(body: bytes) -> dict:
    """The JSON-RPC message in a JSON or an SSE response body."""
    text = body.decode()
    if text.lstrip().startswith("{"):
        return json.loads(text)
    messages = [line[len("data:"):] for line in text.splitlines() if line.startswith("data:")]
    messages = [m for m in messages if m.strip()]
    assert len(messages) == 1, text
    return json.loads(messages[0])


@contextlib.contextmanager
def mcp_http_server(
    socket_path: str, listen: str = "127.0.0.1:0", *flags: str, env: dict[str, str] | None = None,
    wrap: tuple[str, ...] = (),
) -> Iterator[HttpServer]:
    """Serves until the block ends, then checks that SIGTERM stops it
    cleanly (exit status 0). `wrap` is a command prefix (a network
    namespace's)."""
    config_home = tempfile.mkdtemp(prefix="agentos-mcp-config-")
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("AGENTOS_MCP_TOKEN", "AGENTOS_FLEET_SECRET")}
    environment["XDG_CONFIG_HOME"] = config_home
    environment.update(env or {})
    process = subprocess.Popen(
        [*wrap, binary("agentos"), "--socket", socket_path, "mcp", "--http", listen, *flags],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=environment,
    )
    lines: list[str] = []
    listening = threading.Event()
    found: list[re.Match[str]] = []

    def drain() -> None:
        # Read stderr to its end, so the server can never block on it.
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            match = LISTENING.search(lines[-1])
            if match and not found:
                found.append(match)
                listening.set()
        listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        listening.wait(timeout=20)
        if not found:
            raise AssertionError(f"agentos mcp --http did not start: {lines}")
        match = found[0]
        server = HttpServer(match.group(1), match.group(2), int(match.group(3)), process, lines)
        made = [m for m in map(TOKEN_FILE.search, lines) if m]
        if made:
            server.token_file = made[0].group(1)
            with open(server.token_file) as file:
                server.token = file.read().strip()
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"agentos mcp --http did not stop on SIGTERM: {lines}")
        reader.join(timeout=5)
        shutil.rmtree(config_home, ignore_errors=True)
    assert status == 0, f"agentos mcp --http exited with {status}: {lines}"


@contextlib.contextmanager
def forwarding_with_token(server: HttpServer) -> Iterator[str]:
    """A loopback URL whose connections reach `server` with its token added
    to each request head, for a client that cannot be given a header (the
    conformance suite). Requests are framed by Content-Length; responses
    pass through untouched."""
    assert server.token, "the server made its token"
    authorization = f"Authorization: Bearer {server.token}".encode()
    listener = socket.create_server(("127.0.0.1", 0))

    def requests(client: socket.socket, upstream: socket.socket) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = client.recv(65536)
                if not chunk:
                    upstream.shutdown(socket.SHUT_WR)
                    return
                buffer += chunk
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            fields = dict(
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(b":") for line in lines[1:])
            )
            assert b"transfer-encoding" not in fields, f"a chunked request: {head!r}"
            length = int(fields.get(b"content-length", b"0"))
            upstream.sendall(b"\r\n".join([lines[0], authorization, *lines[1:]]) + b"\r\n\r\n")
            while len(buffer) < length:
                chunk = client.recv(65536)
                if not chunk:
                    break
                buffer += chunk
            upstream.sendall(buffer[:length])
            buffer = buffer[length:]

    def responses(upstream: socket.socket, client: socket.socket) -> None:
        while chunk := upstream.recv(65536):
            client.sendall(chunk)
        client.shutdown(socket.SHUT_WR)

    def connection(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", server.port)) as upstream:
            back = threading.Thread(target=quietly, args=(responses, upstream, client))
            back.start()
            quietly(requests, client, upstream)
            back.join()

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=connection, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    finally:
        listener.close()


def quietly(work, *args) -> None:
    """`work`, where a peer hanging up is the end of it, not an error."""
    try:
        work(*args)
    except OSError:
        pass
