"""E2B's JavaScript SDKs (npm `e2b` and `@e2b/code-interpreter`, pinned in
tests/e2b-js's lockfile and installed by scripts/setup --test) against
`agentos e2b`, unmodified: tests/e2b-js/sdk_check.mjs runs their
documented uses and reports each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import REPO, Kernel, root_kernel
from e2b_face import e2b_face

CHECKS = REPO / "tests" / "e2b-js"
EXPECTED = {
    "create and info", "commands", "a background server reached by a later command",
    "files and watch", "another key sees nothing of it", "pause and connect", "metrics", "timeout",
    "code interpreter",
}


@pytest.fixture(scope="module")
def kernel() -> Iterator[Optional[Kernel]]:
    yield from root_kernel("E2B's JavaScript SDKs (sandboxes are sessions)")


def test_the_javascript_sdks_documented_uses_work(kernel):
    if kernel is None:
        pytest.skip("needs root")
    node = shutil.which("node")
    assert node, "Node.js is installed by scripts/setup"
    assert (CHECKS / "node_modules" / "e2b").is_dir(), "scripts/setup --test installs tests/e2b-js"
    with e2b_face(kernel.socket_path) as face:
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        env.update(face.env(face.keys["alice"]))
        env["OTHER_E2B_API_KEY"] = face.keys["bob"]
        ran = subprocess.run([node, str(CHECKS / "sdk_check.mjs")], cwd=CHECKS, env=env,
                             capture_output=True, text=True, timeout=300)
    reports = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in reports if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1) + ran.stderr[-3000:]
    assert {r["check"] for r in reports} == EXPECTED, (reports, ran.stderr[-3000:])
    assert ran.returncode == 0, ran.stderr[-3000:]
