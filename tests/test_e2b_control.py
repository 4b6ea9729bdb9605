"""`agentos e2b`'s control API, driven by E2B's own Python SDK (pinned in
scripts/requirements-e2b.txt) and by hand where a hostile client would
send what the SDK never does. Each key is a delegate of the kernel's:
one key's sandboxes are another's `not found`, in the kernel itself."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Iterator, Optional

import pytest

from conftest import Kernel, binary, root_kernel
from e2b_face import E2bFace, create, e2b_face, face, made, start_face, stop  # noqa: F401

# E2B's SDK, as scripts/setup installs it (scripts/requirements-e2b.txt).
import e2b
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import (
    AuthenticationException, SandboxException, SandboxNotFoundException,
)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Optional[Kernel]]:
    yield from root_kernel("E2B sandboxes (sessions with disks and processes)")


def call(face: E2bFace, method: str, path: str, body=None, key: Optional[str] = "alice",
         headers: Optional[dict] = None) -> tuple[int, dict, dict]:
    """A request by hand: its status, its JSON body (or {}), its headers."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(face.url + path, data=data, method=method)
    if key is not None:
        request.add_header("X-API-KEY", face.keys.get(key, key))
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw, status, got = response.read(), response.status, response.headers
    except urllib.error.HTTPError as err:
        raw, status, got = err.read(), err.code, err.headers
    return status, (json.loads(raw) if raw else {}), got


def test_a_sandbox_is_made_read_listed_and_killed_with_the_sdk(face, made):
    started = time.monotonic()
    sandbox = create(face, made, metadata={"team": "data"}, timeout=120)
    took = time.monotonic() - started
    assert len(sandbox.sandbox_id) == 20 and sandbox.sandbox_id.isalnum()
    assert sandbox.is_running()
    info = sandbox.get_info()
    assert info.template_id == "base"
    assert info.metadata == {"team": "data"}
    assert info.state.value == "running"
    assert (info.cpu_count, info.memory_mb) == (2, 512)
    lifetime = info.end_at - info.started_at
    assert timedelta(seconds=110) < lifetime < timedelta(seconds=130), lifetime
    assert info.lifecycle["on_timeout"].value == "kill"
    listed = Sandbox.list(api_key=face.keys["alice"]).next_items()
    assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
    print(f"create took {took * 1000:.0f} ms")
    assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id, api_key=face.keys["alice"]) is False
    assert not sandbox.is_running()
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()


def test_one_keys_sandbox_is_not_found_by_another(face, made):
    sandbox = create(face, made)
    bob = face.keys["bob"]
    assert Sandbox.list(api_key=bob).next_items() == []
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sandbox.sandbox_id, 5, api_key=bob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, api_key=bob)
    assert Sandbox.kill(sandbox.sandbox_id, api_key=bob) is False
    for path, asked in (("/pause", {}), ("/timeout", {"timeout": 1})):
        status, body, _ = call(face, "POST", f"/sandboxes/{sandbox.sandbox_id}{path}",
                               asked, key="bob")
        assert (status, body["code"]) == (404, 404), body
    # Bob's access token for his own sandbox does not open Alice's.
    bobs = create(face, made, key="bob")
    status, _, _ = call(face, "GET", "/health", key=None, headers={
        "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
        "X-Access-Token": bobs._envd_access_token})
    assert status == 401
    assert sandbox.is_running()
    assert Sandbox.get_info(sandbox.sandbox_id, api_key=face.keys["alice"]).state.value == "running"


def test_a_key_the_face_does_not_know_or_none_is_refused(face):
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="e2b_" + "0" * 48).next_items()
    status, body, _ = call(face, "GET", "/v2/sandboxes", key=None)
    assert (status, body["code"]) == (401, 401), body
    status, body, _ = call(face, "GET", "/v2/sandboxes", headers={"X-API-KEY": "x"})
    assert status == 401, body


def test_pause_then_connect_and_connect_only_extends_a_running_sandbox(face, made):
    sandbox = create(face, made, timeout=600)
    key = face.keys["alice"]
    end = sandbox.get_info().end_at
    # A shorter timeout on connect leaves a running sandbox's end alone.
    Sandbox.connect(sandbox.sandbox_id, timeout=10, api_key=key)
    assert Sandbox.get_info(sandbox.sandbox_id, api_key=key).end_at == end
    assert sandbox.pause() is True
    assert Sandbox.get_info(sandbox.sandbox_id, api_key=key).state.value == "paused"
    assert [s.sandbox_id for s in Sandbox.list(
        api_key=key, query=SandboxQuery(state=[e2b.SandboxState.PAUSED])).next_items()] == [sandbox.sandbox_id]
    assert Sandbox.pause(sandbox.sandbox_id, api_key=key) is False
    Sandbox.connect(sandbox.sandbox_id, timeout=60, api_key=key)
    info = Sandbox.get_info(sandbox.sandbox_id, api_key=key)
    assert info.state.value == "running"
    left = info.end_at - datetime.now(timezone.utc)
    assert timedelta(seconds=50) < left <= timedelta(seconds=60), left
    assert sandbox.is_running()


def test_a_sandbox_ends_at_its_timeout_or_sleeps_when_asked_to(face, made):
    key = face.keys["alice"]
    ending = create(face, made, timeout=120)
    sleeping = create(face, made, timeout=120, lifecycle={"on_timeout": "pause"})
    assert sleeping.get_info().lifecycle["on_timeout"].value == "pause"
    ending.set_timeout(1)
    sleeping.set_timeout(1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {s.sandbox_id: s.state.value for s in Sandbox.list(api_key=key).next_items()}
        if ending.sandbox_id not in states and states.get(sleeping.sandbox_id) == "paused":
            break
        time.sleep(0.25)
    assert ending.sandbox_id not in states, states
    assert states.get(sleeping.sandbox_id) == "paused", states
    Sandbox.connect(sleeping.sandbox_id, api_key=key)
    assert Sandbox.get_info(sleeping.sandbox_id, api_key=key).state.value == "running"


def test_metadata_filters_and_pages(face, made):
    key = face.keys["alice"]
    first = create(face, made, metadata={"user id": "a b&c=d", "n": "1"})
    second = create(face, made, metadata={"user id": "other", "n": "2"})
    found = Sandbox.list(api_key=key, query=SandboxQuery(metadata={"user id": "a b&c=d"}))
    assert [s.sandbox_id for s in found.next_items()] == [first.sandbox_id]
    pages = Sandbox.list(api_key=key, limit=1)
    seen = pages.next_items()
    assert pages.has_next
    seen += pages.next_items()
    assert not pages.has_next or pages.next_items() == []
    assert sorted(s.sandbox_id for s in seen) == sorted([first.sandbox_id, second.sandbox_id])
    status, body, _ = call(face, "GET", "/v2/sandboxes?limit=1000")
    assert status == 400 and "limit" in body["message"], body
    status, body, _ = call(face, "GET", "/v2/sandboxes?state=killed")
    assert status == 400, body


def test_an_idempotency_key_makes_one_sandbox(face, made):
    key = face.keys["alice"]
    one = Sandbox.create(api_key=key, idempotency_key="order-42", metadata={"k": "v"})
    made.append((one.sandbox_id, key))
    again = Sandbox.create(api_key=key, idempotency_key="order-42", metadata={"k": "v"})
    assert again.sandbox_id == one.sandbox_id
    with pytest.raises(SandboxException, match="409"):
        Sandbox.create(api_key=key, idempotency_key="order-42", metadata={"k": "other"})
    # Another key's idempotency key of the same name is its own.
    bobs = Sandbox.create(api_key=face.keys["bob"], idempotency_key="order-42",
                          metadata={"k": "v"})
    made.append((bobs.sandbox_id, face.keys["bob"]))
    assert bobs.sandbox_id != one.sandbox_id
    status, body, _ = call(face, "POST", "/v2/sandboxes", {"templateID": "base"},
                           headers={"Idempotency-Key": "Not Valid"})
    assert status == 400, body


def test_what_the_face_cannot_honour_is_refused_by_name(face):
    refused = {
        "mcp": {"mcp": {"servers": {}}},
        "iam": {"iam": {"tokens": {"t": {"audience": "a", "tokenType": "x"}}}},
        "volumeMounts": {"volumeMounts": [{"name": "v", "path": "/data"}]},
        "network.rules": {"network": {"rules": {"api.example": [{}]}}},
        "network.egressProxy": {"network": {"egressProxy": {"address": "p:1"}}},
        "network.dnsServers": {"network": {"dnsServers": ["1.1.1.1"]}},
        "autoResume": {"autoResume": {"enabled": True}},
        "autoPauseMemory": {"autoPause": True, "autoPauseMemory": True},
        "metadata": {"metadata": {"e2b.template": "forged"}},
        "unknown field `gpu`": {"gpu": 1},
        "timeout": {"timeout": 0},
    }
    for name, fields in refused.items():
        status, body, _ = call(face, "POST", "/v2/sandboxes", {"templateID": "base", **fields})
        assert status == 400 and name in body["message"], (name, body)
    assert Sandbox.list(api_key=face.keys["alice"]).next_items() == []


def test_an_unknown_template_is_e2bs_not_found(face):
    with pytest.raises(SandboxException, match="404: template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template", api_key=face.keys["alice"])


def test_a_key_holds_its_share_of_sandboxes(face, made):
    for _ in range(3):
        create(face, made, key="bob")
    status, body, headers = call(face, "POST", "/v2/sandboxes", {"templateID": "base"}, key="bob")
    assert (status, body["code"]) == (429, 429), body
    assert "max-sandboxes-per-key" in body["message"]
    assert headers.get("Retry-After") == "5"
    # Alice's share is her own.
    create(face, made)


def test_creates_at_once_never_take_more_than_a_keys_share(face, made):
    from concurrent.futures import ThreadPoolExecutor

    def attempt(_):
        status, body, _ = call(face, "POST", "/v2/sandboxes", {"templateID": "base"}, key="bob")
        if status == 201:
            made.append((body["sandboxID"], face.keys["bob"]))
        return status, body.get("message")

    with ThreadPoolExecutor(6) as pool:
        answers = sorted(pool.map(attempt, range(6)), key=lambda answer: answer[0])
    assert [status for status, _ in answers] == [201] * 3 + [429] * 3, answers
    assert len(Sandbox.list(api_key=face.keys["bob"]).next_items()) == 3


def test_metrics_are_read_from_the_sandboxs_cgroup_now(face, made):
    sandbox = create(face, made, timeout=120)
    key = face.keys["alice"]
    [first] = sandbox.get_metrics()
    assert (first.cpu_count, first.mem_total) == (2, 512 << 20), first
    assert 0 <= first.mem_cache <= first.mem_used < first.mem_total, first
    assert 0 <= first.cpu_used_pct <= 100, first
    assert abs(first.timestamp - datetime.now(timezone.utc)) < timedelta(seconds=5), first
    assert first.disk_total > 0 and 0 < first.disk_used <= first.disk_total, first
    # One of its two CPUs kept busy: about half of them, over the time
    # since the last reading.
    sandbox.commands.run("timeout 2 sh -c 'while :; do :; done'", background=True)
    time.sleep(1.5)
    [busy] = Sandbox.get_metrics(sandbox.sandbox_id, api_key=key)
    assert 25 <= busy.cpu_used_pct <= 75, busy
    # A range that ends before now has no sample: the face keeps none.
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    assert sandbox.get_metrics(start=hour_ago, end=hour_ago + timedelta(minutes=30)) == []
    assert len(sandbox.get_metrics(start=hour_ago, end=datetime.now(timezone.utc))) == 1
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(sandbox.sandbox_id, api_key=face.keys["bob"])
    status, body, _ = call(face, "GET", f"/sandboxes/metrics?sandbox_ids={sandbox.sandbox_id},"
                                        + "a" * 20)
    assert status == 200 and list(body["sandboxes"]) == [sandbox.sandbox_id], body
    assert body["sandboxes"][sandbox.sandbox_id]["memTotal"] == 512 << 20, body
    status, body, _ = call(face, "GET", f"/sandboxes/metrics?sandbox_ids={sandbox.sandbox_id}",
                           key="bob")
    assert (status, body) == (200, {"sandboxes": {}}), body
    for query in ("", "?sandbox_ids=" + ",".join(f"s{n}" for n in range(101)), "?colour=red"):
        status, body, _ = call(face, "GET", "/sandboxes/metrics" + query)
        assert status == 400, (query, body)
    status, body, _ = call(face, "GET", f"/sandboxes/{sandbox.sandbox_id}/metrics?start=-5")
    assert status == 400, body
    # Paused with its memory, it still holds it; hibernated, it has no
    # interpreter and no sample.
    assert sandbox.pause() is True
    [paused] = Sandbox.get_metrics(sandbox.sandbox_id, api_key=key)
    assert paused.mem_used > 0, paused
    Sandbox.connect(sandbox.sandbox_id, api_key=key)
    status, _, _ = call(face, "POST", f"/sandboxes/{sandbox.sandbox_id}/pause", {"memory": False})
    assert status == 204, status
    assert Sandbox.get_metrics(sandbox.sandbox_id, api_key=key) == []


def test_hostile_requests_are_refused_before_the_kernel_is_asked(face, made):
    sandbox = create(face, made)
    for path in ("/sandboxes/..%2F..%2Fetc", "/sandboxes/ABC", "/sandboxes/" + "a" * 65):
        status, body, _ = call(face, "GET", path)
        assert status == 404, (path, body)
    status, body, _ = call(face, "POST", "/v2/sandboxes", b"x" * (2 << 20))
    assert status == 413, body
    status, body, _ = call(face, "POST", "/v2/sandboxes", b"{not json")
    assert status == 400, body
    status, body, _ = call(face, "GET", "/v2/sandboxes", headers={"Host": "evil.example"})
    assert status == 403, body
    status, body, _ = call(face, "GET", "/sandboxes/" + sandbox.sandbox_id + "/logs")
    assert status == 404, body
    sandbox_headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
    for token in (None, "", sandbox._envd_access_token + "x",
                  sandbox._envd_access_token.replace("e2b.alice", "e2b.bob")):
        headers = dict(sandbox_headers)
        if token is not None:
            headers["X-Access-Token"] = token
        status, _, _ = call(face, "GET", "/health", key=None, headers=headers)
        assert status == 401, token
    headers = dict(sandbox_headers, **{"X-Access-Token": sandbox._envd_access_token})
    status, _, _ = call(face, "GET", "/health", key=None, headers=headers)
    assert status == 204
    other_id = dict(headers, **{"E2b-Sandbox-Id": "a" * 20})
    status, _, _ = call(face, "GET", "/health", key=None, headers=other_id)
    assert status == 401
    status, _, _ = call(face, "GET", "/health", key=None,
                        headers=dict(headers, **{"E2b-Sandbox-Port": "22"}))
    assert status == 502
    # Nothing but a 401 for a caller without the token, whatever it asks.
    status, _, _ = call(face, "GET", "/health", key=None,
                        headers=dict(sandbox_headers, **{"E2b-Sandbox-Port": "22"}))
    assert status == 401
    # A face in no fleet takes no request for a forward between nodes,
    # whatever it carries.
    for claim in ({"X-AgentOS-Forwarded-By": "n2"},
                  {"X-AgentOS-Forward-Signature": "t=1,v1=" + "0" * 64}):
        status, body, _ = call(face, "GET", "/sandboxes/" + sandbox.sandbox_id, headers=claim)
        assert status == 403 and "fleet" in body["message"], body


def test_a_face_without_keys_serves_its_own_user_only_and_never_other_machines(kernel, tmp_path):
    if kernel is None:
        pytest.skip("needs root")
    env = {k: v for k, v in os.environ.items() if k != "AGENTOS_E2B_API_KEY"}
    env["HOME"] = str(tmp_path)
    process, lines, url = start_face(["--socket", kernel.socket_path, "e2b", "--listen",
                                      "0.0.0.0:0", "--secret-file", "/nonexistent"], env=env)
    stop(process)
    assert url is None and any("needs keys" in line for line in lines), lines
    with e2b_face(kernel.socket_path, key_names=()) as face:
        # Given no keys, the face makes one and keeps it for its user: a
        # connection's uid alone is no proof (a sandbox reaching the
        # host's loopback connects as the kernel's user).
        assert any("no keys given" in line for line in face.stderr), face.stderr
        own = face.own_key()
        status, body, _ = call(face, "GET", "/v2/sandboxes", key=None,
                               headers={"X-API-KEY": "anything"})
        assert status == 401, body
        status, body, _ = call(face, "GET", "/v2/sandboxes", key=None,
                               headers={"X-API-KEY": own})
        assert status == 200 and body == [], body
        # Another user of the machine is refused, even with the key.
        probe = ("import urllib.request, urllib.error, sys\n"
                 "r = urllib.request.Request(sys.argv[1] + '/v2/sandboxes', "
                 "headers={'X-API-KEY': sys.argv[2]})\n"
                 "try:\n    urllib.request.urlopen(r, timeout=10)\n    print(200)\n"
                 "except urllib.error.HTTPError as e:\n    print(e.code)\n")
        other = subprocess.run(["/usr/bin/python3", "-c", probe, face.url, own], user=65534,
                               capture_output=True, text=True, timeout=30)
        assert other.stdout.strip() == "403", other


def test_a_keys_file_others_can_read_stops_the_start(kernel, tmp_path):
    if kernel is None:
        pytest.skip("needs root")
    keys = tmp_path / "keys"
    subprocess.run([binary("agentos"), "e2b", "keys", "add", "k", "--keys-file", str(keys)],
                   check=True, capture_output=True)
    keys.chmod(0o644)
    process, lines, url = start_face(["--socket", kernel.socket_path, "e2b", "--listen",
                                      "127.0.0.1:0", "--keys-file", str(keys)],
                                     env=dict(os.environ, HOME=str(tmp_path)))
    stop(process)
    assert url is None and any("chmod 600" in line for line in lines), lines


def test_an_answer_sent_before_its_body_was_read_closes_the_connection(face):
    """A refusal sent before the request's body was read says `Connection:
    close`, as the server then closes: a client that pooled the connection
    would send its next request into a broken pipe."""
    import socket
    from urllib.parse import urlsplit
    where = urlsplit(face.url)
    def exchange(head: bytes, then: bytes = b"") -> tuple[bytes, bytes]:
        with socket.create_connection((where.hostname, where.port), timeout=10) as conn:
            conn.sendall(head)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += conn.recv(65536)
            head_end = answer.index(b"\r\n\r\n")
            return answer[:head_end].lower(), then
    host = f"Host: {where.hostname}:{where.port}\r\n".encode()
    # No key, and a chunked body still to come: refused at once.
    refused, _ = exchange(b"POST /v2/sandboxes HTTP/1.1\r\n" + host +
                          b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
    assert refused.startswith(b"http/1.1 401"), refused
    assert b"connection: close" in refused, refused
    # A request whose body was read (none here) keeps its connection.
    kept, _ = exchange(b"GET /v2/sandboxes HTTP/1.1\r\n" + host +
                       f"X-API-KEY: {face.keys['alice']}\r\n\r\n".encode())
    assert kept.startswith(b"http/1.1 200"), kept
    assert b"connection: close" not in kept, kept
