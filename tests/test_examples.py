"""The examples run as documented."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_quickstart_runs_against_a_kernel(kernel):
    env = dict(os.environ, AGENTOS_SOCKET=kernel.socket_path)
    out = subprocess.run(
        [sys.executable, REPO / "examples" / "quickstart.py"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "echo: 'Hello!'" in out.stdout
    assert "100 pipelined NOOPs answered in order: True" in out.stdout
    assert "exited with exit code 0" in out.stdout, out.stdout
    assert "bad_request" in out.stdout
    assert "THINK: unavailable" in out.stdout
