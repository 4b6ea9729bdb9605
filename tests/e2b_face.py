"""`agentos e2b` for a test: started on a port the kernel picks, its URL
read from the line it prints, stopped with SIGTERM. Keys are made with
`agentos e2b keys add` into a keys file of the test's own, and the access
token secret is a file of its own too, so nothing lands in the user's
configuration."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import e2b
import pytest

from conftest import binary

LISTENING = re.compile(r"agentos e2b: listening on http://(.+):(\d+)/$")


@dataclass
class E2bFace:
    url: str
    process: subprocess.Popen
    keys: dict[str, str]
    home: Path
    stderr: list[str] = field(default_factory=list)

    def own_key(self) -> str:
        """The key a face given none makes and keeps for its user."""
        return (self.home / ".config" / "agentos" / "e2b-token").read_text().strip()

    def env(self, key: str) -> dict[str, str]:
        """What E2B's SDKs read: where the face is, and the key."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": key}


def add_key(keys_file: Path, name: str) -> str:
    made = subprocess.run(
        [binary("agentos"), "e2b", "keys", "add", name, "--keys-file", str(keys_file)],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return made.stdout.strip()


def start_face(args: list[str], env: dict[str, str] | None = None,
               timeout: float = 20, wrap: tuple[str, ...] = ()
               ) -> tuple[subprocess.Popen, list[str], str | None]:
    """Starts `agentos e2b ARGS` (after `wrap`, a command prefix); its
    process, the stderr lines read so far (more keep coming in), and its
    URL, or None if it exited first."""
    process = subprocess.Popen(
        [*wrap, binary("agentos"), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=env,
    )
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            matched = LISTENING.search(line.rstrip("\n"))
            if matched:
                url.append(f"http://{matched.group(1)}:{matched.group(2)}")
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout)
    return process, lines, (url[0] if url else None)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def e2b_face(socket_path: str, key_names: tuple[str, ...] = ("alice", "bob"),
             extra: tuple[str, ...] = ()) -> Iterator[E2bFace]:
    """A face on the kernel at `socket_path` with a key for each name (no
    keys at all for an empty tuple)."""
    workdir = Path(tempfile.mkdtemp(prefix="agentos-e2b-"))
    try:
        secret = workdir / "secret"
        secret.write_text(secrets.token_hex(32))
        secret.chmod(0o600)
        keys_file = workdir / "keys"
        keys = {name: add_key(keys_file, name) for name in key_names}
        args = ["--socket", socket_path, "e2b", "--listen", "127.0.0.1:0",
                "--secret-file", str(secret), *extra]
        if keys:
            args += ["--keys-file", str(keys_file)]
        env = {k: v for k, v in os.environ.items() if k != "AGENTOS_E2B_API_KEY"}
        # The default keys file and secret are looked for under HOME: the
        # test's own, so a user's are never read.
        env["HOME"] = str(workdir)
        env.pop("XDG_CONFIG_HOME", None)
        process, lines, url = start_face(args, env)
        assert url, f"agentos e2b did not start: {lines}"
        try:
            yield E2bFace(url, process, keys, workdir, lines)
        finally:
            stop(process)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# Fixtures for a test module whose `kernel` fixture is a root kernel: the
# face on it, E2B's SDKs pointed at it, and the sandboxes a test made.


@pytest.fixture(scope="module")
def face(kernel) -> Iterator[E2bFace]:
    if kernel is None:
        pytest.skip("needs root")
    with e2b_face(kernel.socket_path, extra=("--max-sandboxes-per-key", "3")) as face:
        with sdk_at(face.url):
            yield face


@contextlib.contextmanager
def sdk_at(url: str) -> Iterator[None]:
    """E2B's SDKs pointed at the face at ``url``, as they were afterwards."""
    saved = {name: os.environ.get(name) for name in ("E2B_API_URL", "E2B_SANDBOX_URL")}
    os.environ.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url})
    os.environ.pop("E2B_DEBUG", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def made(face) -> Iterator[list[tuple[str, str]]]:
    """Sandboxes a test made, as (id, key): each killed afterwards."""
    sandboxes: list[tuple[str, str]] = []
    yield sandboxes
    for sandbox_id, key in sandboxes:
        e2b.Sandbox.kill(sandbox_id, api_key=key)


def create(face: E2bFace, made, key: str = "alice", **options) -> "e2b.Sandbox":
    sandbox = e2b.Sandbox.create(api_key=face.keys[key], **options)
    made.append((sandbox.sandbox_id, face.keys[key]))
    return sandbox




# Where scripts/setup builds the templates this project ships (as root).
SYSTEM_TEMPLATES = Path("/var/lib/agentos/templates")


@contextlib.contextmanager
def kernel_with_template(name: str) -> Iterator["Kernel"]:
    """A test kernel that has the template `name` scripts/setup built, a
    copy of it in the kernel's own state directory."""
    from conftest import RUNNING_KERNELS, detach_beneath, start_kernel

    built = SYSTEM_TEMPLATES / name
    assert (built / "template.json").is_file(), \
        f"scripts/setup builds the {name} template into {SYSTEM_TEMPLATES} (as root)"
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    kernel = None
    try:
        templates = workdir / "state" / "templates"
        templates.mkdir(parents=True)
        subprocess.run(["cp", "-a", "--sparse=always", str(built), str(templates / name)],
                       check=True)
        # Its mount point is made anew by the kernel that serves it.
        kernel = start_kernel(workdir)
        RUNNING_KERNELS.append(kernel)
        yield kernel
    finally:
        if kernel is not None:
            RUNNING_KERNELS.remove(kernel)
            kernel.stop()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
