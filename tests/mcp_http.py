"""`agentos mcp --http` for a test: started on a port the kernel picks,
its URL read from the line it prints, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Iterator

from conftest import binary

LISTENING = re.compile(r"agentos mcp: listening on (http://(.+):(\d+)/mcp)$")


@dataclass
class HttpServer:
    url: str
    host: str
    port: int
    process: subprocess.Popen
    stderr: list[str] = field(default_factory=list)


@contextlib.contextmanager
def mcp_http_server(
    socket_path: str, listen: str = "127.0.0.1:0", *flags: str, env: dict[str, str] | None = None
) -> Iterator[HttpServer]:
    """Serves until the block ends, then checks that SIGTERM stops it
    cleanly (exit status 0)."""
    environment = {k: v for k, v in os.environ.items() if k != "AGENTOS_MCP_TOKEN"}
    environment.update(env or {})
    process = subprocess.Popen(
        [binary("agentos"), "--socket", socket_path, "mcp", "--http", listen, *flags],
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
    assert status == 0, f"agentos mcp --http exited with {status}: {lines}"
