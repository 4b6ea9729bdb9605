"""The examples run as documented."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO, binary, start_kernel
from test_mcp_server import everything_kernel  # noqa: F401 (a fixture)


def run_quickstart(socket_path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, AGENTOS_SOCKET=socket_path)
    return subprocess.run(
        [sys.executable, REPO / "examples" / "quickstart.py"],
        capture_output=True, text=True, timeout=120, env=env,
    )


def test_quickstart_runs_against_a_kernel(kernel):
    out = run_quickstart(kernel.socket_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "echo: 'Hello!'" in out.stdout
    assert "100 pipelined NOOPs answered in order: True" in out.stdout
    assert "exited with exit code 0" in out.stdout, out.stdout
    assert "bad_request" in out.stdout
    assert "EXEC in a fresh sandbox: ok True, sum.txt = b'42'" in out.stdout, out.stdout
    assert "3 background tasks ended in the order 0, 1, 2" in out.stdout, out.stdout
    assert "THINK: unavailable" in out.stdout


def test_quickstart_asks_the_local_model_when_think_is_available():
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    kernel = start_kernel(workdir, llm=True)
    try:
        out = run_quickstart(kernel.socket_path)
    finally:
        kernel.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "features available: think" in out.stdout
    assert re.search(r"^THINK answer: \S", out.stdout, re.MULTILINE), out.stdout
    assert " tokens from " in out.stdout
    assert "THINK: " not in out.stdout


def test_the_mcp_session_example_runs_through_agentos_mcp(everything_kernel):
    env = dict(os.environ, AGENTOS_SOCKET=everything_kernel.socket_path)
    out = subprocess.run(
        [sys.executable, REPO / "examples" / "mcp_session.py", binary("agentos")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "  <- stdout 6 * 7 = 42" in out.stdout, out.stdout
    assert "  <- result Echo: hello through agentos mcp" in out.stdout, out.stdout
    assert "  <- text/plain written by exec" in out.stdout, out.stdout
