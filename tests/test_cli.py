"""The `agentos` command-line client against a real agentosd."""

from __future__ import annotations

import json
import re
import subprocess
import time

from conftest import binary


def agentos(kernel, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("agentos"), "--socket", kernel.socket_path, *args],
        capture_output=True, text=True, timeout=60,
    )


def state_of(kernel, name: str) -> str:
    listed = json.loads(agentos(kernel, "ps", "-a", "--json").stdout)
    return next(a["state"] for a in listed if a["name"] == name)


def test_hello_prints_version_identity_and_features(kernel):
    out = agentos(kernel, "hello")
    assert out.returncode == 0, out.stderr
    assert "AgentOS kernel" in out.stdout
    assert re.search(r"id 1\d{6}", out.stdout)
    assert "spawn yes" in out.stdout


def test_ping_reports_percentiles(kernel):
    out = agentos(kernel, "ping", "-n", "200", "--size", "64")
    assert out.returncode == 0, out.stderr
    match = re.search(r"200 NOOP round trips \(64 bytes\).*p50 ([\d.]+) µs, p99 ([\d.]+) µs", out.stdout)
    assert match, out.stdout
    assert 0 < float(match.group(1)) <= float(match.group(2))


def test_ps_prints_a_table_and_json(kernel):
    table = agentos(kernel, "ps")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == [
        "ID", "NAME", "PID", "STATE", "RESTARTS", "UPTIME", "MEMORY", "PEAK", "CPU", "EXIT"]
    as_json = agentos(kernel, "ps", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == []


def test_unreachable_kernel_is_a_clear_error(tmp_path):
    out = subprocess.run(
        [binary("agentos"), "--socket", str(tmp_path / "none.sock"), "hello"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "Is agentosd running?" in out.stderr


def test_spawn_ps_and_kill(kernel):
    out = agentos(kernel, "spawn", "sleeper", "--memory", "64M", "--cpus", "0.5",
                  "--max-pids", "8", "--", "/bin/sleep", "30")
    assert out.returncode == 0, out.stderr
    assert re.search(r"agent \d+ \(sleeper\) running as pid \d+", out.stdout), out.stdout
    listed = json.loads(agentos(kernel, "ps", "--json").stdout)
    sleeper = next(a for a in listed if a["name"] == "sleeper")
    assert sleeper["limits"] == {"memory": 64 << 20, "cpu_quota": 50000, "cpu_period": 100000, "max_pids": 8}
    table = agentos(kernel, "ps").stdout
    row = next(line.split() for line in table.splitlines() if "sleeper" in line)
    assert row[1:4] == ["sleeper", str(sleeper["pid"]), "running"], table
    assert row[-1] == "-", table
    out = agentos(kernel, "kill", "sleeper", "--grace-ms", "0")
    assert out.returncode == 0, out.stderr
    # KILL answers once the stop has begun; the agent is gone when it is reaped.
    deadline = time.monotonic() + 5
    while state_of(kernel, "sleeper") != "killed":
        assert time.monotonic() < deadline, "sleeper was not reaped within 5 s"
        time.sleep(0.02)
    again = agentos(kernel, "kill", "sleeper")
    assert again.returncode == 1
    assert again.stderr == "agentos: no agent named 'sleeper' (agentos ps -a lists them)\n"


def test_spawn_of_a_missing_script_fails_clearly(kernel):
    out = agentos(kernel, "spawn", "ghost", "/no/such/agent.py")
    assert out.returncode == 1
    assert "does not exist" in out.stderr and "not_found" not in out.stderr


def test_kv_sets_gets_lists_and_removes_keys(kernel):
    assert agentos(kernel, "kv", "set", "crawl:frontier", '{"next": ["a"], "done": 3}').returncode == 0
    assert agentos(kernel, "kv", "set", "crawl:note", "plain text", "--scope", "agent").returncode == 0
    got = agentos(kernel, "kv", "get", "crawl:frontier")
    assert got.returncode == 0 and json.loads(got.stdout) == {"next": ["a"], "done": 3}
    assert json.loads(agentos(kernel, "kv", "get", "crawl:note").stdout) == "plain text"
    listed = agentos(kernel, "kv", "ls", "crawl:")
    assert listed.stdout.split() == ["crawl:frontier", "crawl:note"]
    assert agentos(kernel, "kv", "rm", "crawl:frontier").returncode == 0
    missing = agentos(kernel, "kv", "get", "crawl:frontier")
    assert missing.returncode == 1 and "no key 'crawl:frontier'" in missing.stderr
    refused = agentos(kernel, "kv", "set", "k", "1", "--ttl=-5")
    assert refused.returncode == 1 and "ttl" in refused.stderr
