"""A real Prometheus (Debian's, which ``scripts/setup --test`` unpacks)
scrapes a live agentosd's `[metrics] listen`: the counters it stores move
with the work the kernel does, and ``promtool check metrics`` accepts the
text it scraped."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from agentos import AgentOSClient
from conftest import free_port, kernel_with, prometheus_tool

# The scrape interval: short, so a test waits seconds, not minutes.
SCRAPE_INTERVAL = "1s"
# How long Prometheus may take to start and first scrape the kernel.
UP_WITHIN = 60
# How long a counter may take to show the work: the kernel's snapshot
# (once a second) plus a scrape (once a second), with room for a slow CI.
MOVED_WITHIN = 30
RUNS = 3
OK_RUNS = 'agentos_exec_runs_total{outcome="ok"}'


class Prometheus:
    """A running Prometheus, read through its HTTP API."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path) -> None:
        self.process, self.url, self.log_path = process, url, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def query(self, expression: str) -> Optional[float]:
        """The instant value of a one-series expression; None when it has
        no series (not scraped yet)."""
        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(address, timeout=10) as reply:
            answer = json.load(reply)
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        assert len(result) <= 1, f"{expression} matches more than one series: {result}"
        return float(result[0]["value"][1]) if result else None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False


@contextlib.contextmanager
def prometheus_scraping(target: str) -> Iterator[Prometheus]:
    """Prometheus scraping ``target`` (host:port), with its storage in a
    temporary directory; killed and removed afterwards, whatever happens."""
    workdir = Path(tempfile.mkdtemp(prefix="agentos-prometheus-"))
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {SCRAPE_INTERVAL}\n"
        f"  scrape_timeout: {SCRAPE_INTERVAL}\n"
        "scrape_configs:\n"
        "  - job_name: agentosd\n"
        "    static_configs:\n"
        f"      - targets: [\"{target}\"]\n"
    )
    listen = f"127.0.0.1:{free_port()}"
    log_path = workdir / "prometheus.log"
    process = None
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [prometheus_tool("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address={listen}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir,
            )
        yield Prometheus(process, f"http://{listen}", log_path)
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def wait_until_up(prometheus: Prometheus) -> None:
    """Waits until Prometheus has scraped the kernel successfully."""
    deadline = time.monotonic() + UP_WITHIN
    while True:
        assert prometheus.process.poll() is None, \
            f"prometheus exited with {prometheus.process.returncode}:\n{prometheus.log()}"
        if prometheus.ready() and prometheus.query('up{job="agentosd"}') == 1:
            return
        assert time.monotonic() < deadline, \
            f"prometheus did not scrape the kernel within {UP_WITHIN}s:\n{prometheus.log()}"
        time.sleep(0.2)


def test_prometheus_scrapes_a_counter_that_moves_with_exec_runs():
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    missing = [name for name in ("prometheus", "promtool") if prometheus_tool(name) is None]
    if missing:
        print(f"!!! NOT TESTED: Prometheus scraping agentosd ({', '.join(missing)} missing: "
              "scripts/setup --test unpacks Debian's prometheus)")
        return
    port = free_port()
    with kernel_with(f'[metrics]\nlisten = "127.0.0.1:{port}"\n') as kernel, \
            AgentOSClient(kernel.socket_path) as client, \
            prometheus_scraping(f"127.0.0.1:{port}") as prometheus:
        client.hello()
        wait_until_up(prometheus)
        # No series yet means no run has ended yet.
        before = prometheus.query(OK_RUNS) or 0.0
        for _ in range(RUNS):
            assert client.exec("print(1)")["ok"]
        deadline = time.monotonic() + MOVED_WITHIN
        while True:
            now = prometheus.query(OK_RUNS) or 0.0
            if now >= before + RUNS:
                break
            assert time.monotonic() < deadline, (
                f"{OK_RUNS} in Prometheus went from {before} to {now} within {MOVED_WITHIN}s "
                f"of {RUNS} EXEC runs, expected at least {before + RUNS}:\n{prometheus.log()}")
            time.sleep(0.5)

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            scraped = reply.read().decode()
        checked = subprocess.run([prometheus_tool("promtool"), "check", "metrics"], input=scraped,
                                 capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr
