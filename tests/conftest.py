"""End-to-end fixtures: a real agentosd on a temporary socket.

The binaries come from ``$AGENTOS_BIN_DIR`` (set by ``scripts/test``), else
the workspace's ``target/debug``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from agentos import AgentOSClient

REPO = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("AGENTOS_BIN_DIR", REPO / "target" / "debug"))
# Debian's prometheus, which ``scripts/setup --test`` unpacks here rather
# than installs, so no service runs.
PROMETHEUS_BIN_DIR = REPO / ".cache" / "prometheus" / "usr" / "bin"


def binary(name: str) -> Path:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{path} not found: build first (cargo build) or set AGENTOS_BIN_DIR")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prometheus_tool(name: str) -> Optional[str]:
    """``prometheus`` or ``promtool``: the copy setup unpacked, else one on
    PATH, else None."""
    unpacked = PROMETHEUS_BIN_DIR / name
    if os.access(unpacked, os.X_OK):
        return str(unpacked)
    return shutil.which(name)


# Python a run's code starts with to call the kernel over its own socket
# as raw frames, as any code in a run may: `ask(opcode, request)` is the
# reply's JSON.
RUN_ASKS_KERNEL = """
import json, os, socket, struct
kernel = socket.socket(fileno=int(os.environ["AGENTOS_SOCKET_FD"]))
def ask(opcode, request):
    payload = json.dumps(request).encode()
    kernel.sendall(struct.pack("<IIBQ", 0x41474E54, 0, opcode, len(payload)) + payload)
    header = b""
    while len(header) < 17:
        header += kernel.recv(17 - len(header))
    length = struct.unpack("<IIBQ", header)[3]
    body = b""
    while len(body) < length:
        body += kernel.recv(length - len(body))
    return json.loads(body)
"""


@dataclass
class Kernel:
    """A running agentosd."""

    process: subprocess.Popen
    socket_path: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=10)

    def finish(self) -> None:
        """Stops it as an operator would, so it removes its agents and
        cgroups; kills it if it has not stopped within 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# Variables that would point a kernel at an LLM from outside the tests.
LLM_VARIABLES = (
    "AGENTOS_LLM_PROVIDER", "AGENTOS_LLM_BASE_URL", "AGENTOS_LLM_MODEL", "AGENTOS_LLM_API_KEY",
    "AGENTOS_LLM_PYTHON", "AGENTOS_LLM_LOCAL_MODEL", "AGENTOS_LLM_CONCURRENCY",
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY",
)


def start_kernel(
    workdir: Path, config: str = "", llm: bool = False,
    wrap: tuple[str, ...] = (), env_extra: Optional[dict[str, str]] = None,
) -> Kernel:
    """Starts agentosd. Without ``llm`` it has no LLM (THINK answers
    ``unavailable``); with it, the local model, as out of the box. ``wrap``
    goes before its command line (``nsenter --net=...``); ``env_extra`` is
    added to its environment."""
    sock = workdir / "agentos.sock"
    config_path = workdir / "agentosd.toml"
    if not llm and "[llm]" not in config:
        config += '\n[llm]\nprovider = "none"\n'
    config_path.write_text(config)
    log_path = workdir / "agentosd.log"
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("AGENTOS_SOCKET", "RUST_LOG") and k not in LLM_VARIABLES
    }
    env["AGENTOS_LOG_LEVEL"] = "debug"
    env["AGENTOS_AGENT_LOG_DIR"] = str(workdir / "logs")
    env["AGENTOS_STATE_DIR"] = str(workdir / "state")
    # Sessions' disks are allocated whole: tests keep them small (a test's
    # config may size them itself).
    if "session_disk_bytes" not in config:
        env.setdefault("AGENTOS_SESSION_DISK_BYTES", str(TEST_SESSION_DISK_BYTES))
    env.update(env_extra or {})
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*wrap, binary("agentosd"), "--socket", sock, "--config", config_path],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"agentosd exited with {process.returncode}:\n{log_path.read_text()}")
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(sock))
            return Kernel(process, str(sock), log_path)
        except OSError:
            time.sleep(0.01)
        finally:
            probe.close()
    process.kill()
    pytest.fail(f"agentosd did not come up:\n{log_path.read_text()}")


# The kernels running now, so that a failing test's report carries the
# end of each one's log (it is removed with the kernel's directory).
RUNNING_KERNELS: list[Kernel] = []
# The lines of a kernel's log a failing test's report shows.
LOG_TAIL_LINES = 80


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for kernel in RUNNING_KERNELS:
            exited = kernel.process.poll()
            state = "running" if exited is None else f"exited with {exited}"
            tail = "\n".join(kernel.log().splitlines()[-LOG_TAIL_LINES:])
            report.sections.append((f"agentosd {kernel.socket_path} ({state}), its log's end", tail))


@contextlib.contextmanager
def kernel_with(config: str = "", llm: bool = False) -> Iterator[Kernel]:
    """A kernel with this config, stopped and cleaned up afterwards."""
    # A short directory of our own: pytest's tmp_path can push a socket path
    # past the 107 bytes a Unix socket address holds.
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    k = start_kernel(workdir, config, llm)
    RUNNING_KERNELS.append(k)
    try:
        yield k
    finally:
        RUNNING_KERNELS.remove(k)
        k.finish()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


class KernelDir:
    """A kernel whose state directory outlives it: ``restart`` stops it
    (with ``kill``, as a crash would) and starts another on the same
    directory, as ``kernel``."""

    def __init__(self, config: str = "") -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
        self.kernel = start_kernel(self.workdir, config)

    def restart(self, kill: bool = False) -> Kernel:
        if kill:
            self.kernel.process.kill()
            self.kernel.process.wait()
        else:
            self.kernel.stop()
        self.kernel = start_kernel(self.workdir, self.config)
        return self.kernel


@contextlib.contextmanager
def kernel_dir(config: str = "") -> Iterator[KernelDir]:
    """A :class:`KernelDir`, its last kernel stopped and its directory
    removed afterwards."""
    kernels = KernelDir(config)
    try:
        yield kernels
    finally:
        if kernels.kernel.process.poll() is None:
            kernels.kernel.stop()
        detach_beneath(kernels.workdir)
        shutil.rmtree(kernels.workdir, ignore_errors=True)


# Each session's disk in a test's kernel (64 MiB).
TEST_SESSION_DISK_BYTES = 64 << 20


def detach_beneath(directory: Path) -> None:
    """Detaches what a killed kernel left mounted beneath ``directory``
    (its sessions' disks), deepest first, so the directory can go."""
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split(" ")[4] for line in mounts]
    beneath = [p for p in points if Path(p).is_relative_to(directory)]
    for point in sorted(beneath, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    with kernel_with() as k:
        yield k


def root_kernel(needs: str, config: str = "") -> Iterator[Optional[Kernel]]:
    """For a module's kernel fixture: a kernel with ``config``, or, not
    being root, ``None`` and a loud word that what ``needs`` root was not
    tested."""
    if os.geteuid() != 0:
        print(f"!!! NOT TESTED: {needs} need a root kernel (EXEC's namespaces)")
        yield None
        return
    with kernel_with(config) as k:
        yield k


def root_client(kernel: Optional[Kernel]) -> Iterator[AgentOSClient]:
    """For a client fixture over :func:`root_kernel`'s kernel: skipped,
    saying so, when there is none."""
    if kernel is None:
        pytest.skip("needs root")
    with AgentOSClient(kernel.socket_path, timeout=60) as client:
        yield client


def session_named(client, request) -> Iterator[str]:
    """For a session fixture: a session opened for the test, named after
    it, closed after it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name[:40])
    client.open_session(name)
    yield name
    client.close_session(name)


def wait_state(client, agent_id: int, states: set[str], timeout: float = 15) -> dict:
    """Polls LIST until the agent is in one of ``states``; returns its entry."""
    deadline = time.monotonic() + timeout
    while True:
        info = next(a for a in client.list_agents() if a["id"] == agent_id)
        if info["state"] in states:
            return info
        assert time.monotonic() < deadline, f"agent {agent_id} still {info['state']}"
        time.sleep(0.05)


def log_of(kernel: Kernel, name: str, agent_id: int) -> str:
    """An agent's log as the kernel wrote it (empty if there is none yet)."""
    path = kernel.log_path.parent / "logs" / f"{name}-{agent_id}.log"
    return path.read_text() if path.exists() else ""
