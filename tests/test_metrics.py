"""Metrics against a real agentosd: `[metrics] listen` and METRICS
(`agentos metrics`) serve the same Prometheus text, which moves with the
work the kernel does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import sys
import tempfile
import urllib.error
import urllib.request

import pytest

from agentos import AgentOSClient, Unavailable
from agentos.protocol import Opcode
from conftest import binary, free_port, kernel_with, log_of, prometheus_tool, wait_state


def series(text: str, name: str, labels: str = "") -> float:
    """The value of one series, or 0 if it is not there yet."""
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_listener_and_metrics_serve_figures_that_move_with_work():
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    port = free_port()
    with kernel_with(f'[metrics]\nlisten = "127.0.0.1:{port}"\n') as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        # Answered once the kernel runs: the listener is up by then.
        client.hello()
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            before = reply.read().decode()
        runs = 'agentos_exec_runs_total'
        assert client.exec("print(1)")["ok"]
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(url, timeout=10) as reply:
                after = reply.read().decode()
            if series(after, runs, '{outcome="ok"}') > series(before, runs, '{outcome="ok"}'):
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.2)
        assert "# TYPE agentos_exec_run_duration_seconds histogram" in after
        printed = subprocess.run([binary("agentos"), "--socket", kernel.socket_path, "metrics"],
                                 capture_output=True, text=True, timeout=30)
        assert printed.returncode == 0, printed.stderr
        assert series(printed.stdout, runs, '{outcome="ok"}') >= 1, printed.stdout
        promtool = prometheus_tool("promtool")
        if promtool is None:
            print("!!! NOT TESTED: promtool check metrics (Debian's prometheus: scripts/setup --test)")
        else:
            checked = subprocess.run([promtool, "check", "metrics"], input=after,
                                     capture_output=True, text=True, timeout=30)
            assert checked.returncode == 0, checked.stdout + checked.stderr
        with pytest.raises(urllib.error.HTTPError) as other:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        assert other.value.code == 404


def test_metrics_are_for_operators_only(kernel):
    directory = tempfile.mkdtemp(prefix="agentos-metrics-", dir="/var/tmp")
    os.chmod(directory, 0o755)
    script = os.path.join(directory, "asker.py")
    with open(script, "w") as file:
        file.write(
            "from agentos import AgentOSClient, PermissionDenied\n"
            "from agentos.protocol import Opcode\n"
            "with AgentOSClient() as kernel:\n"
            "    try:\n"
            "        kernel.call_json(Opcode.METRICS)\n"
            "        print('answered', flush=True)\n"
            "    except PermissionDenied:\n"
            "        print('refused', flush=True)\n"
        )
    os.chmod(script, 0o644)
    try:
        with AgentOSClient(kernel.socket_path) as client:
            reply = client.call_json(Opcode.METRICS)
            assert reply["success"] and reply["format"] == "prometheus"
            spawned = client.spawn("metrics-asker", script, python=sys.executable)
            wait_state(client, spawned["id"], {"exited", "failed"}, timeout=60)
            assert log_of(kernel, "metrics-asker", spawned["id"]).strip() == "refused"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_throttling_refusals_refills_and_the_reactor_are_counted():
    if os.geteuid() != 0:
        print("!!! NOT TESTED: a boot agent's cgroup and EXEC need root (CI runs as root)")
        return
    config = (
        "[[agents.boot]]\n"
        'name = "spinner"\n'
        # The system's python: a sandbox sees /usr, not a virtualenv.
        'command = ["/usr/bin/python3", "-c", "while True: pass"]\n'
        "limits = { memory = 268435456, cpu_quota = 10000, max_pids = 16 }\n"
    )
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        # Without a provider, THINK is refused before any queue.
        with pytest.raises(Unavailable):
            client.think("hello")
        assert client.exec("print(1)")["ok"]
        spinner = '{agent="spinner"}'
        deadline = time.monotonic() + 20
        while True:
            text = client.call_json(Opcode.METRICS)["text"]
            moved = (
                series(text, "agentos_agent_cpu_throttled_seconds_total", spinner) > 0
                and series(text, "agentos_agent_cpu_seconds_total", spinner) > 0
                and series(text, "agentos_exec_refill_seconds_count") > 0
            )
            if moved:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        assert series(text, "agentos_agents_cpu_throttled_periods_total") > 0, text
        assert series(text, "agentos_agent_memory_bytes", spinner) > 0, text
        assert series(text, "agentos_think_refused_total",
                      '{provider="none",code="unavailable"}') == 1, text
        assert series(text, "agentos_connections", '{peer="other"}') >= 1, text
        assert series(text, "agentos_reactor_turn_duration_seconds_count") > 0, text
        # Only boot agents are named: a spawned agent adds no series.
        assert text.count('agent="') == text.count('agent="spinner"'), text
