"""A local stand-in for PyPI and the npm registry, so end-to-end tests can
run ``pip install NAME`` and ``npm install NAME`` in a sandbox that has no
internet, through the kernel's HTTP proxy.

On one plain HTTP address it serves a PEP 503 "simple" Python index and a
minimal npm registry, each holding one tiny package built at start::

    python3 tests/package_index_standin.py --listen 127.0.0.9:8080 \\
        --ready-file /tmp/package-index-ready

    pip install --index-url http://127.0.0.9:8080/simple/ agentos-probe
    npm install --registry http://127.0.0.9:8080/ agentos-probe-npm

``agentos_probe.VALUE`` is ``"from the stand-in index"``; the npm package
exports ``"from the stand-in registry"``. ``--listen HOST:0`` picks a free
port: the ready file, written once the server is serving, holds the
address it listens on. It serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hashlib
import html
import http.server
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Iterator, Optional

PYTHON_VALUE = "from the stand-in index"
NPM_VALUE = "from the stand-in registry"

# Fixed timestamps, so the wheel and the tarball come out byte for byte the
# same each time and their hashes, which pip and npm check, are stable.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold
TAR_MTIME = 499162500  # 1985-10-26T08:15:00Z, the date `npm pack` uses

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def normalized_name(name: str) -> str:
    """A project's name as PEP 503 spells it in index URLs."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(name: str) -> str:
    """A distribution's name as PEP 427 spells it in a wheel's file name
    (and, here, as the name of the module it installs)."""
    return normalized_name(name).replace("-", "_")


def record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def build_wheel(directory: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module holding ``VALUE``."""
    module = wheel_name(name)
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": (
            '"""A probe package served by the stand-in package index."""\n\n'
            f"__version__ = {json.dumps(version)}\n"
            f"VALUE = {json.dumps(PYTHON_VALUE)}\n"),
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Summary: A probe package served by the stand-in package index\n"),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: package_index_standin\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    contents = {entry: text.encode() for entry, text in files.items()}
    # RECORD lists every file but itself with its hash and size; its own
    # line leaves both empty.
    record = "".join(f"{entry},{record_hash(data)},{len(data)}\n"
                     for entry, data in contents.items())
    contents[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for entry, data in contents.items():
            info = zipfile.ZipInfo(entry, ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return path


def build_npm_tarball(directory: Path, name: str, version: str) -> Path:
    """An npm package tarball whose module exports a string."""
    package_json = {"name": name, "version": version, "main": "index.js",
                    "description": "A probe package served by the stand-in registry",
                    "license": "MIT"}
    contents = {
        "package/package.json": (json.dumps(package_json, indent=2) + "\n").encode(),
        "package/index.js": f"module.exports = {json.dumps(NPM_VALUE)};\n".encode(),
    }
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for entry, data in contents.items():
            info = tarfile.TarInfo(entry)
            info.size, info.mtime, info.mode = len(data), TAR_MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    path = directory / f"{name}-{version}.tgz"
    # Compressed here rather than by tarfile's "w:gz", which stamps the
    # current time into the gzip header.
    path.write_bytes(gzip.compress(tar_bytes.getvalue(), mtime=0))
    return path


def html_page(title: str, links: dict[str, str]) -> bytes:
    """A PEP 503 page: one anchor per link, its text the key."""
    anchors = "".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n'
                      for text, href in links.items())
    return (f"<!DOCTYPE html>\n<html>\n  <head><title>{html.escape(title)}</title></head>\n"
            f"  <body>\n{anchors}  </body>\n</html>\n").encode()


class Packages:
    """The two packages, and the answer to each path that names one."""

    def __init__(self, directory: Path, python_name: str, python_version: str,
                 npm_name: str, npm_version: str) -> None:
        self.project = normalized_name(python_name)
        self.wheel = build_wheel(directory, python_name, python_version)
        self.npm_name, self.npm_version = npm_name, npm_version
        self.tarball = build_npm_tarball(directory, npm_name, npm_version)
        self.tarball_path = f"/{npm_name}/-/{self.tarball.name}"

    def answer(self, path: str, host: str) -> Optional[tuple[str, bytes]]:
        """The content type and body for ``path``, or None if there is none.
        ``host`` is the address the client used, for absolute URLs."""
        if path == "/simple/":
            return "text/html", html_page("Simple index", {self.project: f"{self.project}/"})
        if path.startswith("/simple/"):
            project, _, rest = path[len("/simple/"):].partition("/")
            # Any spelling of the name is the same project (PEP 503).
            if normalized_name(project) == self.project:
                if rest == "":
                    return "text/html", self.project_page()
                if rest == self.wheel.name:
                    return "application/octet-stream", self.wheel.read_bytes()
        if path == f"/{self.npm_name}":
            return "application/json", json.dumps(self.packument(host), indent=2).encode()
        if path == self.tarball_path:
            return "application/octet-stream", self.tarball.read_bytes()
        return None

    def project_page(self) -> bytes:
        digest = hashlib.sha256(self.wheel.read_bytes()).hexdigest()
        return html_page(f"Links for {self.project}",
                         {self.wheel.name: f"{self.wheel.name}#sha256={digest}"})

    def packument(self, host: str) -> dict:
        """The registry's document for the npm package: its one version."""
        data = self.tarball.read_bytes()
        integrity = base64.b64encode(hashlib.sha512(data).digest()).decode()
        version = {
            "name": self.npm_name, "version": self.npm_version, "main": "index.js",
            "dist": {"tarball": f"http://{host}{self.tarball_path}",
                     "shasum": hashlib.sha1(data).hexdigest(),
                     "integrity": f"sha512-{integrity}"},
        }
        return {"name": self.npm_name, "dist-tags": {"latest": self.npm_version},
                "versions": {self.npm_version: version}}


class Handler(http.server.BaseHTTPRequestHandler):
    """GET and HEAD of the packages' paths; anything else is 404."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:
        sys.stderr.write(f"package-index-standin: {format % args}\n")

    def do_GET(self) -> None:
        # The Host header is the address the client asked for, which stays
        # right when it came through a proxy or by a name.
        host = self.headers.get("Host") or "%s:%d" % self.server.server_address[:2]
        found = self.server.packages.answer(self.path.split("?")[0], host)
        if found is None:
            self.reply(404, "text/plain", b"not found\n")
        else:
            self.reply(200, *found)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        # npm posts its audit after installing; a 404 tells it there is no
        # audit here. The body is read so the connection can be kept.
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(404, "text/plain", b"not found\n")

    def reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def write_ready_file(path: Path, address: str) -> None:
    """Write the address whole, so a reader polling for the file never
    sees it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(address)
    os.replace(partial, path)


@contextlib.contextmanager
def serving(listen: str, wrap: tuple[str, ...] = (),
            python_name: str = "agentos-probe") -> Iterator[str]:
    """This stand-in, run as a process of its own (after `wrap`, a command
    prefix: a network namespace's) listening on `listen`, serving the
    Python package `python_name`; yields its address, host:port."""
    directory = Path(tempfile.mkdtemp(prefix="agentos-index-"))
    ready = directory / "ready"
    server = subprocess.Popen(
        [*wrap, sys.executable, str(Path(__file__)), "--listen", listen,
         "--ready-file", str(ready), "--python-name", python_name],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert server.poll() is None, "the stand-in index exited"
            assert time.monotonic() < deadline, "the stand-in index did not come up"
            time.sleep(0.05)
        yield ready.read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT; port 0 picks a free one")
    parser.add_argument("--python-name", default="agentos-probe")
    parser.add_argument("--python-version", default="1.0.0")
    parser.add_argument("--npm-name", default="agentos-probe-npm")
    parser.add_argument("--npm-version", default="1.0.0")
    parser.add_argument("--ready-file", type=Path, help="where to write the address once serving")
    options = parser.parse_args()
    host, port = options.listen.rsplit(":", 1)
    # Blocked before any thread starts, so every thread inherits the mask
    # and the stop signals reach only the sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    with tempfile.TemporaryDirectory(prefix="package-index-standin-") as directory:
        server.packages = Packages(Path(directory), options.python_name,
                                   options.python_version, options.npm_name,
                                   options.npm_version)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if options.ready_file:
            write_ready_file(options.ready_file, "%s:%d" % server.server_address[:2])
        signal.sigwait(STOP_SIGNALS)
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
