"""Network egress by policy, against a real agentosd: a sandbox reaches
only what its policy allows, through the kernel's proxy, and every attempt
is recorded.

The upstream servers are the tests' own, on the host's loopback (plain
HTTP, and HTTPS with a test CA the kernel trusts through
``[network] extra_ca``); their names come from the test-only resolver
override ``[network] resolve``. Code in the sandboxes is what a hostile
run would write: raw CONNECTs, foreign TLS server names, address
literals, floods, trickled heads, direct sockets and UDP.
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from agentos import AgentOSClient, AgentOSError
from agentos.protocol import Opcode
import httpbin_standin
from conftest import Kernel, binary, kernel_with, log_of, wait_state

# The key the proxy adds for api.cred.test: the sandbox must never see it.
KEY = "sk-agentos-test-0f3a9c71e2b84d56"
KEY_VARIABLE = "AGENTOS_TEST_UPSTREAM_KEY"


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: network policies need sandboxes' own network namespaces, "
              "so root (CI runs as root)")
        return False
    return True


# -- the tests' upstream servers ---------------------------------------------


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA, and a server certificate it signed for the test names."""
    return httpbin_standin.make_certificates(
        directory, ["allowed.test", "denied.test", "other.test", "api.cred.test"])


class Upstream:
    """Plain-HTTP and HTTPS servers on the host's loopback; each remembers
    the headers of the requests it served."""

    def __init__(self, directory: Path) -> None:
        self.ca, cert, key = make_certificates(directory)
        self.seen: list[dict[str, str]] = []
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                upstream.seen.append({"path": self.path,
                                      **{k.lower(): v for k, v in self.headers.items()}})
                if self.path.startswith("/bytes/"):
                    body = b"x" * int(self.path.rsplit("/", 1)[1])
                elif self.path == "/authorized":
                    # Whether the key came, never the key itself.
                    got = self.headers.get("Authorization") == f"Bearer {KEY}"
                    body = b"authorized: yes" if got else b"authorized: no"
                else:
                    body = f"hello from {self.headers.get('Host')}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.https = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.https.socket = context.wrap_socket(self.https.socket, server_side=True)
        for server in (self.http, self.https):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.http_port = self.http.server_address[1]
        self.https_port = self.https.server_address[1]

    def close(self) -> None:
        for server in (self.http, self.https):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def net() -> Iterator[tuple[Kernel, Upstream]]:
    if os.geteuid() != 0:
        yield None  # type: ignore[misc]
        return
    directory = Path(tempfile.mkdtemp(prefix="agentos-net-"))
    upstream = Upstream(directory)
    config = textwrap.dedent(f"""
        [network]
        head_timeout_ms = 1500
        max_connections = 64
        extra_ca = "{upstream.ca}"

        [network.resolve]
        "allowed.test" = "127.0.0.1"
        "denied.test" = "127.0.0.1"
        "other.test" = "127.0.0.1"
        "api.cred.test" = "127.0.0.1"
        "metadata.test" = "169.254.169.254"

        [[network.credentials]]
        host = "api.cred.test"
        header = "Authorization"
        from_env = "{KEY_VARIABLE}"
        prefix = "Bearer "
        """)
    os.environ[KEY_VARIABLE] = KEY
    try:
        with kernel_with(config) as kernel:
            yield kernel, upstream
    finally:
        os.environ.pop(KEY_VARIABLE, None)
        upstream.close()
        shutil.rmtree(directory, ignore_errors=True)
        for scripts in SCRIPT_DIRS:
            shutil.rmtree(scripts, ignore_errors=True)


def policy_for(upstream: Upstream, *names: str, deny: tuple[str, ...] = ()) -> dict:
    """Allows `names` on the upstream's two ports; the tests' servers are on
    loopback, a range a policy must name."""
    ports = (upstream.http_port, upstream.https_port)
    allow = [f"{name}:{port}" for name in names for port in ports]
    allow += [f"127.0.0.0/8:{port}" for port in ports]
    return {"allow": allow, "deny": list(deny)}


# Code every run starts with: its own CONNECTs, so it controls each byte.
PRELUDE = r'''
import os, socket, ssl, sys, time
PROXY = ("127.0.0.1", 3128)

def connect(host, port, timeout=10):
    s = socket.create_connection(PROXY, timeout=timeout)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "closed"
    return s, status, head.decode(errors="replace")

def read_all(sock):
    body = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionError, ssl.SSLError):
            break
        if not chunk:
            break
        body += chunk
    return body.decode(errors="replace")

def get_tls(host, port, path="/hello", cafile="ca.pem", sni=None, extra=""):
    s, status, head = connect(host, port)
    if status != "200":
        return status, head
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    try:
        t = context.wrap_socket(s, server_hostname=sni or host)
    except (ssl.SSLError, ConnectionError, OSError) as err:
        return "tls-failed", repr(err)
    t.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\r\n".encode())
    return "200", read_all(t)
'''


def run(client: AgentOSClient, upstream: Upstream, code: str, network, **extra):
    files = {"ca.pem": upstream.ca.read_bytes()}
    return client.exec(PRELUDE + textwrap.dedent(code), network=network, files=files,
                       timeout_ms=60_000, **extra)


SCRIPT_DIRS: list[Path] = []


def script_file(code: str) -> Path:
    """An agent's script, where sandboxes can be given it (not /tmp: each
    sandbox has a /tmp of its own)."""
    directory = Path(tempfile.mkdtemp(prefix="agentos-net-", dir="/var/tmp"))
    SCRIPT_DIRS.append(directory)
    path = directory / "agent.py"
    path.write_text(code)
    path.chmod(0o644)
    directory.chmod(0o755)
    return path


# -- the tests ------------------------------------------------------------------


def test_an_allowed_host_is_served_and_a_denied_one_refused_with_its_reason(net):
    if not has_root():
        return
    kernel, upstream = net
    with AgentOSClient(kernel.socket_path) as client:
        assert client.hello()["features"]["network_policy"] is True
        policy = policy_for(upstream, "allowed.test", deny=("denied.test",))
        done = run(client, upstream, f"""
            print(get_tls("allowed.test", {upstream.https_port}))
            # Plain HTTP through the variables the kernel set, as urllib
            # (and pip, requests, curl) read them.
            import urllib.request
            print(os.environ["http_proxy"], os.environ["HTTPS_PROXY"])
            print(urllib.request.urlopen("http://allowed.test:{upstream.http_port}/hello").read())
            print(get_tls("denied.test", {upstream.https_port}))
            """, policy)
        assert done["ok"], done
        lines = done["stdout"].splitlines()
        assert "hello from allowed.test" in lines[0], lines
        assert lines[1] == "http://127.0.0.1:3128 http://127.0.0.1:3128"
        assert "hello from allowed.test" in lines[2], lines
        assert lines[3].startswith("('403'") and "denied.test" in lines[3], lines
        totals = done["network"]
        assert (totals["allowed"], totals["refused"]) == (2, 1), totals
        assert totals["bytes_in"] > 0 and totals["bytes_out"] > 0


def test_an_allowed_name_carrying_another_server_name_is_refused(net):
    """No domain fronting: TLS through a tunnel to allowed.test must name
    allowed.test."""
    if not has_root():
        return
    kernel, upstream = net
    with AgentOSClient(kernel.socket_path) as client:
        done = run(client, upstream, f"""
            print(get_tls("allowed.test", {upstream.https_port}, sni="other.test"))
            """, policy_for(upstream, "allowed.test"))
        status, detail = eval(done["stdout"])
        assert status == "tls-failed", done["stdout"]
        assert done["network"]["refused"] == 1, done


def test_address_literals_and_names_resolving_to_private_ranges_are_refused(net):
    if not has_root():
        return
    kernel, upstream = net
    port = upstream.https_port
    with AgentOSClient(kernel.socket_path) as client:
        done = run(client, upstream, f"""
            for host, port in [("allowed.test", {port}), ("127.0.0.1", {port}), ("[::1]", {port}),
                               ("169.254.169.254", 80), ("metadata.test", 80),
                               ("[::ffff:127.0.0.1]", {port}), ("10.0.0.1", 5432)]:
                s, status, head = connect(host, port)
                print(host, status, head.splitlines()[-1] if head else "")
            """, {"allow": ["allowed.test", "metadata.test", "*"]})
        assert done["ok"], done
        lines = done["stdout"].splitlines()
        assert len(lines) == 7, lines
        # Loopback is not in the policy: a name resolving there is refused
        # as surely as the literal is.
        for line in lines:
            assert " 403 " in line, lines
        assert "loopback" in lines[0] and "metadata.test" in lines[4], lines
        assert done["network"]["refused"] == 7


def test_nothing_leaves_a_sandbox_except_through_the_proxy(net):
    if not has_root():
        return
    kernel, upstream = net
    with AgentOSClient(kernel.socket_path) as client:
        done = run(client, upstream, f"""
            import errno
            def attempt(what, fn):
                try:
                    fn()
                    print(what, "REACHED")
                except OSError as err:
                    print(what, "refused", errno.errorcode.get(err.errno, err))
            attempt("tcp-host-loopback", lambda: socket.create_connection(("127.0.0.1", {upstream.http_port}), 3))
            attempt("tcp-public", lambda: socket.create_connection(("1.1.1.1", 443), 3))
            attempt("tcp-v6", lambda: socket.create_connection(("2606:4700:4700::1111", 443), 3))
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt("udp-dns", lambda: u.sendto(b"\\x00" * 12, ("8.8.8.8", 53)))
            attempt("dns-lookup", lambda: socket.getaddrinfo("example.com", 443))
            """, policy_for(upstream, "allowed.test"))
        assert done["ok"], done
        assert "REACHED" not in done["stdout"], done["stdout"]
        assert done["stdout"].count("refused") == 5, done["stdout"]


def test_a_connect_flood_is_bounded_and_the_kernel_stays_responsive(net):
    if not has_root():
        return
    kernel, upstream = net
    noop_ms: list[float] = []
    stop = threading.Event()

    def ping() -> None:
        with AgentOSClient(kernel.socket_path) as operator:
            while not stop.is_set():
                started = time.perf_counter()
                operator.call(Opcode.NOOP, b"ping")
                noop_ms.append((time.perf_counter() - started) * 1000)
                time.sleep(0.002)

    pinger = threading.Thread(target=ping)
    with AgentOSClient(kernel.socket_path) as client:
        pinger.start()
        try:
            # 10,000 CONNECTs, in waves of 500 held open at once: beyond the
            # proxy's 64 per sandbox they are turned away at once.
            done = run(client, upstream, f"""
                answered = turned_away = 0
                for wave in range(20):
                    held = []
                    for i in range(500):
                        try:
                            s = socket.create_connection(PROXY, timeout=5)
                            s.sendall(b"CONNECT denied.test:{upstream.https_port} HTTP/1.1\\r\\n\\r\\n")
                            held.append(s)
                        except OSError:
                            turned_away += 1
                    for s in held:
                        try:
                            answered += bool(s.recv(64))
                        except OSError:
                            turned_away += 1
                        s.close()
                print(answered, turned_away)
                print(get_tls("allowed.test", {upstream.https_port})[0])
                """, policy_for(upstream, "allowed.test"), limits={"max_pids": 64})
        finally:
            stop.set()
            pinger.join()
        assert done["ok"], done
        answered, turned_away = map(int, done["stdout"].splitlines()[0].split())
        assert answered + turned_away == 10_000
        assert done["stdout"].splitlines()[1] == "200", "an allowed request after the flood"
        assert done["network"]["refused"] >= 9_000, done["network"]
    p99 = statistics.quantiles(noop_ms, n=100)[98]
    print(f"operator NOOP during the flood: {len(noop_ms)} calls, p50 "
          f"{statistics.median(noop_ms):.2f} ms, p99 {p99:.2f} ms")
    # The proxy has a thread of its own: a flood at it never waits on the
    # kernel's reactor. (Bound as the other reactor tests' are: a reactor
    # that waited on the proxy would take hundreds of milliseconds; the
    # bound is no measure of speed, which the benches measure.)
    assert p99 < 100, f"NOOP p99 {p99:.2f} ms during a CONNECT flood"


def test_a_client_trickling_its_head_is_closed_at_the_head_timeout(net):
    if not has_root():
        return
    kernel, upstream = net
    with AgentOSClient(kernel.socket_path) as client:
        done = run(client, upstream, """
            s = socket.create_connection(PROXY, timeout=10)
            started = time.monotonic()
            closed = False
            for byte in b"CONNECT allowed.test:443 HTTP/1.1\\r\\n":
                try:
                    s.sendall(bytes([byte]))
                    time.sleep(0.25)
                except OSError:
                    closed = True
                    break
            try:
                closed = closed or s.recv(4096) is not None
            except OSError:
                closed = True
            print(closed, round(time.monotonic() - started, 1))
            """, policy_for(upstream, "allowed.test"))
        closed, seconds = done["stdout"].split()
        assert closed == "True" and float(seconds) < 5, done["stdout"]


def test_a_child_never_gets_a_wider_policy_than_its_parent(net):
    if not has_root():
        return
    kernel, upstream = net
    code = textwrap.dedent("""
        from agentos import AgentOSClient, AgentOSError
        with AgentOSClient() as kernel:
            for name, network in [("wide", {"allow": ["*"]}), ("host", True),
                                  ("narrow", {"allow": ["allowed.test:443"]})]:
                try:
                    kernel.spawn(name, command=["/bin/sleep", "30"], network=network)
                    print(name, "spawned", flush=True)
                except AgentOSError as err:
                    print(name, err.code, err, flush=True)
            for network in [{"allow": ["*"]}, {"allow": ["allowed.test:443"]}]:
                try:
                    print("exec", kernel.exec("print(1)", network=network)["stdout"].strip())
                except AgentOSError as err:
                    print("exec", err.code, err, flush=True)
            # NET: its child's policy within its own; never its own policy.
            for name, network in [("narrow", {"allow": ["*"]}),
                                  ("narrow", {"allow": ["allowed.test:8443"]}),
                                  ("net-parent", {"allow": ["allowed.test"]})]:
                try:
                    kernel.set_network(name, network)
                    print("set", name, network["allow"][0], "ok", flush=True)
                except AgentOSError as err:
                    print("set", name, network["allow"][0], err.code, flush=True)
            try:
                kernel.net("net-holder-elsewhere")
            except AgentOSError as err:
                print("show elsewhere", err.code, flush=True)
        """)
    with AgentOSClient(kernel.socket_path) as client:
        spawned = client.spawn("net-parent", script_file(code), python=sys.executable,
                               network={"allow": ["allowed.test"]},
                               permissions={"spawn": True, "exec": True})
        wait_state(client, spawned["id"], {"exited", "failed"}, timeout=60)
        log = log_of(kernel, "net-parent", spawned["id"])
        assert "wide permission_denied" in log and "network.allow[0]" in log, log
        assert "host permission_denied" in log, log
        assert "narrow spawned" in log, log
        assert "exec permission_denied" in log and "exec 1" in log, log
        assert "set narrow * permission_denied" in log, log
        assert "set narrow allowed.test:8443 ok" in log, log
        assert "set net-parent allowed.test permission_denied" in log, log
        assert "show elsewhere not_found" in log, log
        narrow = next(a for a in client.list_agents() if a["name"] == "narrow")
        assert narrow["network"] == {"allow": ["allowed.test:8443"], "deny": []}


AGENT_HOLDING_A_TUNNEL = PRELUDE + r'''
port = int(sys.argv[1])
s, status, head = connect("allowed.test", port)
print("tunnel", status, flush=True)
while True:
    try:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        if not s.recv(4096):
            raise ConnectionError("closed")
    except OSError as err:
        print("tunnel closed:", err, flush=True)
        break
    time.sleep(0.2)
time.sleep(30)
'''


def test_a_policy_changed_at_runtime_closes_the_connections_it_now_refuses(net):
    if not has_root():
        return
    kernel, upstream = net
    with AgentOSClient(kernel.socket_path) as client:
        spawned = client.spawn("net-holder", script_file(AGENT_HOLDING_A_TUNNEL),
                               python=sys.executable, args=[str(upstream.http_port)],
                               network=policy_for(upstream, "allowed.test"))
        deadline = time.monotonic() + 20
        while "tunnel 200" not in log_of(kernel, "net-holder", spawned["id"]):
            assert time.monotonic() < deadline, log_of(kernel, "net-holder", spawned["id"])
            time.sleep(0.1)
        listed = next(a for a in client.list_agents() if a["name"] == "net-holder")
        assert listed["connections"]["allowed"] == 1, listed
        changed = client.set_network("net-holder", policy_for(upstream, "other.test"))
        assert changed["network"]["allow"][0] == f"other.test:{upstream.http_port}"
        while "tunnel closed" not in log_of(kernel, "net-holder", spawned["id"]):
            assert time.monotonic() < deadline + 10, log_of(kernel, "net-holder", spawned["id"])
            time.sleep(0.1)
        record = client.net("net-holder")
        assert record["attempts"][-1]["reason"], record
        assert "polic" in record["attempts"][-1]["reason"], record
        # The record as an owner reads it on the command line.
        shown = subprocess.run([binary("agentos"), "--socket", kernel.socket_path, "net",
                                "net-holder"], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert "allowed.test" in shown.stdout and "other.test" in shown.stdout, shown.stdout
        client.kill("net-holder", grace_ms=0)


def test_the_key_reaches_upstream_and_never_the_sandbox(net):
    if not has_root():
        return
    kernel, upstream = net
    upstream.seen.clear()
    with AgentOSClient(kernel.socket_path) as client:
        done = run(client, upstream, f"""
            # The request carries a key of its own: the proxy's replaces it.
            print(get_tls("api.cred.test", {upstream.https_port}, "/authorized", cafile=None,
                          extra="Authorization: Bearer sandbox-made-up\\r\\n"))
            print(get_tls("api.cred.test", {upstream.https_port}, "/authorized", cafile=None))
            # A host without a credential is never intercepted: its own
            # certificate (the test CA's) is what the sandbox sees.
            print(get_tls("allowed.test", {upstream.https_port}, cafile="ca.pem")[0])
            print(get_tls("allowed.test", {upstream.https_port}, cafile=None)[0])
            found = []
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    for part in ("environ", "cmdline"):
                        try:
                            if b"{KEY}" in open(f"/proc/{{pid}}/{{part}}", "rb").read():
                                found.append(f"/proc/{{pid}}/{{part}}")
                        except OSError:
                            pass
            for top in ("/run", "/workspace", "/tmp", "/etc", "/dev/shm"):
                for root, dirs, files in os.walk(top):
                    for name in files:
                        try:
                            if b"{KEY}" in open(os.path.join(root, name), "rb").read():
                                found.append(os.path.join(root, name))
                        except OSError:
                            pass
            print("found:", found, [k for k, v in os.environ.items() if "{KEY}" in v])
            """, policy_for(upstream, "allowed.test", "api.cred.test"))
        assert done["ok"], done
        lines = done["stdout"].splitlines()
        assert "authorized: yes" in lines[0] and "authorized: yes" in lines[1], lines
        assert lines[2] == "200" and lines[3] == "tls-failed", lines
        assert lines[4] == "found: [] []", lines
        authorized = [seen for seen in upstream.seen
                      if seen.get("host") == f"api.cred.test:{upstream.https_port}"]
        assert [seen["authorization"] for seen in authorized] == [f"Bearer {KEY}"] * 2
        for shown in (str(done), str(client.list_agents()), kernel.log()):
            assert KEY not in shown


def test_a_default_policy_applies_where_a_request_names_none():
    if not has_root():
        return
    config = '[network]\ndefault_allow = ["*.pypi.org:443"]\n'
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        done = client.exec("import os; print(os.environ.get('HTTPS_PROXY'))")
        assert done["stdout"].strip() == "http://127.0.0.1:3128", done
        assert done["network"] == {"allowed": 0, "refused": 0, "bytes_out": 0, "bytes_in": 0}
        loopback = client.exec("import os; print(os.environ.get('HTTPS_PROXY'))", network=False)
        assert loopback["stdout"].strip() == "None" and "network" not in loopback
        spawned = client.spawn("defaulted", command=["/bin/sleep", "30"])
        listed = next(a for a in client.list_agents() if a["id"] == spawned["id"])
        assert listed["network"] == {"allow": ["*.pypi.org:443"], "deny": []}, listed
        # An operator may widen it at runtime (it holds the host's network).
        widened = client.set_network("defaulted", {"allow": ["*.pypi.org:443", "pypi.org:443"]})
        assert widened["network"]["allow"] == ["*.pypi.org:443", "pypi.org:443"]
        client.kill("defaulted", grace_ms=0)


def test_a_malformed_policy_is_refused_naming_its_field(net):
    """Refused before anything starts; the sandbox's code is not needed."""
    if not has_root():
        return
    kernel, _ = net
    cases = [
        ({"allow": ["allowed.test", "a b"]}, "network.allow[1]"),
        ({"allow": ["allowed.test:99999"]}, "network.allow[0]"),
        ({"allow": ["10.0.0.0/33"]}, "network.allow[0]"),
        ({"allow": ["allowed.test"], "alow": []}, "alow"),
        ({"allow": "allowed.test"}, "allow"),
        ({"allow": ["x"] * 257}, "network.allow"),
        (5, "network"),
    ]
    with AgentOSClient(kernel.socket_path) as client:
        for network, field in cases:
            for ask in (lambda: client.exec("1", network=network),
                        lambda: client.spawn("bad-net", command=["/bin/true"], network=network)):
                with pytest.raises(AgentOSError) as refused:
                    ask()
                assert refused.value.code == "bad_request", (network, refused.value)
                assert field in str(refused.value), (network, refused.value)
        with pytest.raises(AgentOSError) as unsandboxed:
            client.spawn("bad-net", command=["/bin/true"], sandboxed=False,
                         network={"allow": ["allowed.test"]})
        assert unsandboxed.value.code == "bad_request"
        with pytest.raises(AgentOSError) as host:
            client.exec("1", network=True)
        assert host.value.code == "unavailable", host.value


def test_a_sessions_runs_share_an_endpoint_and_each_reply_counts_its_own(net):
    if not has_root():
        return
    kernel, upstream = net
    policy = policy_for(upstream, "allowed.test")
    code = f"print(get_tls('allowed.test', {upstream.https_port})[0])"
    with AgentOSClient(kernel.socket_path) as client:
        first = run(client, upstream, code, policy, session="net-session")
        second = run(client, upstream, code + "\n" + code, policy, session="net-session")
        assert first["network"]["allowed"] == 1 and second["network"]["allowed"] == 2, second
        with pytest.raises(AgentOSError) as other:
            run(client, upstream, code, policy_for(upstream, "other.test"), session="net-session")
        assert other.value.code == "bad_request"
        client.close_session("net-session")


def test_narrowing_an_agent_at_runtime_reaches_what_its_sessions_left_running(net):
    """A thread a session's run left behind keeps its tunnel only as long
    as the agent's policy allows it."""
    if not has_root():
        return
    kernel, upstream = net
    policy = policy_for(upstream, "allowed.test")
    holder = PRELUDE + textwrap.dedent(f"""
        import threading
        def hold():
            s, status, head = connect("allowed.test", {upstream.http_port})
            while True:
                try:
                    s.sendall(b"GET /held HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n")
                    if not s.recv(4096):
                        break
                except OSError:
                    break
                time.sleep(0.1)
        threading.Thread(target=hold, daemon=True).start()
        time.sleep(0.5)
        """)
    agent = textwrap.dedent(f"""
        import time
        from agentos import AgentOSClient
        with AgentOSClient() as kernel:
            kernel.exec({holder!r}, session="held", network={policy!r})
            print("session open", flush=True)
            time.sleep(60)
        """)
    held = lambda: sum(1 for seen in upstream.seen if seen.get("path") == "/held")
    with AgentOSClient(kernel.socket_path) as client:
        spawned = client.spawn("net-sessions", script_file(agent), python=sys.executable,
                               network=policy, permissions={"exec": True})
        deadline = time.monotonic() + 30
        while "session open" not in log_of(kernel, "net-sessions", spawned["id"]):
            assert time.monotonic() < deadline, log_of(kernel, "net-sessions", spawned["id"])
            time.sleep(0.1)
        before = held()
        time.sleep(0.5)
        assert held() > before, "the session's thread is not using its tunnel"
        client.set_network("net-sessions", {"allow": []})
        time.sleep(0.5)
        after = held()
        time.sleep(1.5)
        assert held() == after, "the tunnel outlived the policy that allowed it"
        client.kill("net-sessions", grace_ms=0)
