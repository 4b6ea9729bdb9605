"""A fleet on one machine, for the fleet's tests: PostgreSQL started from
Debian's binaries in a temporary directory (as the ``postgres`` user, since
``initdb`` and ``pg_ctl`` refuse root), and agentosd nodes each in a network
namespace of its own, joined to the database and to each other by a bridge
the harness makes. A node's link can be cut and mended, as a partition
would; everything is removed afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest
from conftest import RUNNING_KERNELS, Kernel, detach_beneath, start_kernel


def postgres_bin_dir() -> Optional[Path]:
    """The newest installed PostgreSQL's binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def require_fleet_machine() -> Path:
    """The PostgreSQL binaries, or the test skipped, saying loudly why."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("root (network namespaces, a bridge)")
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        reasons.append("PostgreSQL's server (scripts/setup --test installs Debian's postgresql)")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        reasons.append("the postgres user")
    if reasons:
        print(f"!!! NOT TESTED: the fleet needs {', '.join(reasons)}")
        pytest.skip(f"the fleet needs {', '.join(reasons)}")
    assert bin_dir is not None
    return bin_dir


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


@dataclass
class Host:
    """One end of the bridge: a network namespace with an address."""

    netns: str
    address: str
    link: str  # the bridge's side of its veth pair

    def wrap(self) -> tuple[str, ...]:
        """A command prefix that runs a program in this host's network
        (only: its mounts, /sys and cgroups stay the machine's)."""
        return ("nsenter", f"--net=/var/run/netns/{self.netns}")

    def cut(self) -> None:
        """Cuts the host's link: nothing gets in or out, as in a partition."""
        run("ip", "link", "set", self.link, "down")

    def mend(self) -> None:
        run("ip", "link", "set", self.link, "up")


class Bridge:
    """A bridge in the machine's network, with an address of its own (where
    PostgreSQL listens), and hosts in namespaces hanging off it."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"aosfb{tag}"
        self.prefix = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
        self.address = f"{self.prefix}.1"
        self.hosts: list[Host] = []
        self._tag = tag
        run("ip", "link", "add", self.name, "type", "bridge")
        # A bridge whose address is not set takes the lowest of its ports'
        # as they are added: a host that learnt the old one would send to
        # nobody until its ARP entry aged out (tens of seconds). Set, it
        # stays.
        mac = "02:" + ":".join(f"{secrets.randbelow(256):02x}" for _ in range(5))
        run("ip", "link", "set", self.name, "address", mac)
        run("ip", "addr", "add", f"{self.address}/24", "dev", self.name)
        run("ip", "link", "set", self.name, "up")

    def add_host(self) -> Host:
        index = len(self.hosts) + 2
        netns = f"aosf-{self._tag}-{index}"
        outside, inside = f"aosv{self._tag}{index}", f"aosi{self._tag}{index}"
        run("ip", "netns", "add", netns)
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", outside, "master", self.name)
        run("ip", "link", "set", outside, "up")
        run("ip", "link", "set", inside, "netns", netns)
        address = f"{self.prefix}.{index}"
        in_ns = ("ip", "netns", "exec", netns)
        run(*in_ns, "ip", "addr", "add", f"{address}/24", "dev", inside)
        run(*in_ns, "ip", "link", "set", inside, "up")
        run(*in_ns, "ip", "link", "set", "lo", "up")
        host = Host(netns, address, outside)
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True)
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)


class Postgres:
    """A PostgreSQL server of the test's own, listening on ``address`` only,
    with a role and database ``agentos`` whose password only the test
    knows."""

    def __init__(self, bin_dir: Path, address: str, extra_conf: str = "") -> None:
        self.bin_dir = bin_dir
        self.address = address
        self.port = 5432
        self.password = secrets.token_urlsafe(18)
        self.dir = Path(tempfile.mkdtemp(prefix="agentos-test-pg-"))
        self.data = self.dir / "data"
        owner = pwd.getpwnam("postgres")
        os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self._as_postgres(
            "initdb", "-D", str(self.data), "-U", "postgres", "--no-sync",
            "--auth-local=trust", "--auth-host=scram-sha-256",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '{address}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                + extra_conf
            )
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host all all 10.0.0.0/8 scram-sha-256\n")
        self.start()
        # The password goes in on stdin: never on a command line.
        self.sql(
            f"CREATE ROLE agentos LOGIN PASSWORD '{self.password}';"
            " CREATE DATABASE agentos OWNER agentos;"
        )

    def _as_postgres(self, program: str, *args: str, stdin: str = "") -> str:
        argv = ["runuser", "-u", "postgres", "--", str(self.bin_dir / program), *args]
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=self.dir)
        if done.returncode != 0:
            raise AssertionError(f"{program} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    @property
    def url(self) -> str:
        return f"postgresql://agentos:{self.password}@{self.address}:{self.port}/agentos"

    def start(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"),
                          "-w", "-t", "30", "start")

    def stop(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def sql(self, statements: str, database: str = "postgres") -> str:
        """Runs SQL as the superuser over the server's own socket; returns
        psql's unaligned output."""
        return self._as_postgres(
            "psql", "-h", str(self.dir), "-p", str(self.port), "-d", database,
            "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", stdin=statements,
        )

    def close(self) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin_dir / "pg_ctl"),
             "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True, cwd=self.dir,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Node:
    """An agentosd in a host of the bridge, joined to the fleet."""

    name: str
    host: Host
    workdir: Path
    config: str
    env: dict[str, str]
    kernel: Optional[Kernel] = None
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def socket_path(self) -> str:
        assert self.kernel is not None
        return self.kernel.socket_path

    def start(self) -> Kernel:
        self.kernel = start_kernel(self.workdir, self.config, wrap=self.host.wrap(),
                                   env_extra=self.env)
        RUNNING_KERNELS.append(self.kernel)
        self.kernels.append(self.kernel)
        return self.kernel

    def is_joined(self) -> bool:
        """Whether HELLO says the node is in the fleet now."""
        from agentos import AgentOSClient
        with AgentOSClient(self.socket_path, timeout=30) as client:
            return client.hello()["features"]["fleet"]

    def kill(self) -> None:
        """Ends the node at once, as a crash would (``kill -9``)."""
        assert self.kernel is not None
        self.kernel.process.send_signal(signal.SIGKILL)
        self.kernel.process.wait()

    def stop(self) -> None:
        for kernel in self.kernels:
            if kernel in RUNNING_KERNELS:
                RUNNING_KERNELS.remove(kernel)
            kernel.finish()
        self.kernels.clear()


class Fleet:
    """The database, the bridge and the nodes started on it."""

    def __init__(self, bin_dir: Path, postgres_conf: str = "") -> None:
        self.bridge = Bridge()
        self.nodes: list[Node] = []
        self.postgres: Optional[Postgres] = None
        try:
            self.postgres = Postgres(bin_dir, self.bridge.address, postgres_conf)
        except BaseException:
            self.bridge.close()
            raise

    def node(self, name: str, lease_ms: int = 2000, extra: str = "",
             start: bool = True, joined: bool = True,
             env: Optional[dict[str, str]] = None,
             face_port: Optional[int] = None, mcp_port: Optional[int] = None) -> Node:
        """A node called ``name`` on a host of its own; the database's URL
        reaches it through the environment, as a service's would. Started,
        it is waited for until it has joined the fleet (``joined``; its
        socket answers before its kernel has). With ``face_port`` it
        advertises an E2B face on that port of its host's address, and
        with ``mcp_port`` an MCP face."""
        assert self.postgres is not None
        host = self.bridge.add_host()
        workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
        advertise = (f'advertise = "http://{host.address}:{face_port}"\n'
                     if face_port else "")
        if mcp_port:
            advertise += f'advertise_mcp = "http://{host.address}:{mcp_port}"\n'
        config = f'[fleet]\nnode = "{name}"\nlease_ms = {lease_ms}\n{advertise}{extra}'
        node = Node(name, host, workdir, config,
                    {"AGENTOS_FLEET_DATABASE": self.postgres.url, **(env or {})})
        self.nodes.append(node)
        if start:
            node.start()
            if joined:
                wait_for(f"{name} in the fleet", node.is_joined, timeout=20)
        return node

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
            detach_beneath(node.workdir)
            shutil.rmtree(node.workdir, ignore_errors=True)
        if self.postgres is not None:
            self.postgres.close()
        self.bridge.close()


@contextlib.contextmanager
def fleet() -> Iterator[Fleet]:
    """A fleet's database and bridge, with no node yet; all of it removed
    afterwards."""
    bin_dir = require_fleet_machine()
    made = Fleet(bin_dir)
    try:
        yield made
    finally:
        made.close()


def wait_for(what: str, check, timeout: float = 20.0, every: float = 0.1):
    """Polls ``check`` until it returns something true; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def signed(secret: str, by: str, to: str, method: str, target: str,
           subject: str, kind: str = "e2b") -> dict[str, str]:
    """The headers of a forward from ``kind`` of face (``e2b``, ``mcp``)
    of node ``by`` to node ``to`` of ``method`` ``target``, for
    ``subject`` (a sandbox; a session and its body's digest), signed with
    ``secret``."""
    now = int(time.time())
    parts = (kind, now, by, to, method, target, subject)
    text = "".join(f"{part}\n" for part in parts)
    mac = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
    return {"X-AgentOS-Forwarded-By": by, "X-AgentOS-Forward-Signature": f"t={now},v1={mac}"}


def status_of(url: str, headers: dict[str, str], method: str = "GET",
              data: Optional[bytes] = None) -> tuple[int, str]:
    """The status and body of a request to a face."""
    request = urllib.request.Request(url, headers=headers, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


IMPOSTOR = '''
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps([self.path, str(self.headers)]) + "\\n")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    do_POST = do_DELETE = do_GET
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[2], int(sys.argv[3])), Handler).serve_forever()
'''


@contextlib.contextmanager
def impostor(node: Node, port: int):
    """An HTTP server at ``port`` of ``node``'s address that answers
    everything; yields the (path, headers) it was sent, once it ends."""
    log = Path(tempfile.mkstemp(prefix="agentos-impostor-")[1])
    process = subprocess.Popen([*node.host.wrap(), sys.executable, "-c", IMPOSTOR, str(log),
                                node.host.address, str(port)])
    seen: list = []
    try:
        def listening():
            probe = subprocess.run([*node.host.wrap(), "ss", "-ltnH", f"sport = :{port}"],
                                   capture_output=True, text=True)
            return probe.stdout.strip()
        wait_for("the impostor listening", listening, timeout=10)
        yield seen
    finally:
        process.kill()
        process.wait()
        seen.extend(json.loads(line) for line in log.read_text().splitlines())
        log.unlink()
