"""Sessions opened without code, with labels, an environment and a
lifetime, against a real agentosd: EXEC `open` opens a session as a run
would (its template, network, limits and permissions hold its later
runs); `sessions` lists its labels and when it ends, never its
environment; at the end of its lifetime the kernel closes or hibernates
it, the idle timeout aside, and a kernel restarted keeps all of it.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from agentos import AgentOSClient
from agentos.errors import AlreadyExists, BadRequest, NotFound, PermissionDenied
from conftest import kernel_dir, kernel_with


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: opening sessions needs a root kernel (EXEC's namespaces)")
        return False
    return True


def listed(client: AgentOSClient) -> dict[str, dict]:
    return {s["session"]: s for s in client.sessions()}


def wait_until(what, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "it did not happen in time"
        time.sleep(0.1)
    return value


def test_open_makes_a_ready_session_listed_with_its_labels_never_its_env():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        opened = client.open_session("sb1", network=False, env={"E2B_SANDBOX": "true"},
                                     labels={"e2b.template": "base", "team": "x"})
        assert opened == {"success": True, "session": "sb1", "state": "ready",
                          "fresh_interpreter": False}, opened
        entry = listed(client)["sb1"]
        assert entry["state"] == "ready" and entry["runs"] == 0, entry
        assert entry["labels"] == {"e2b.template": "base", "team": "x"}, entry
        assert "env" not in entry and "E2B_SANDBOX" not in str(entry)
        assert "ends_at" not in entry
        # Its runs are held to what the open asked, and go on in it.
        assert client.exec("x = 5", "python", session="sb1", network=False)["ok"]
        run = client.exec("print(x)", "python", session="sb1", network=False)
        assert run["stdout"] == "5\n", run
        with pytest.raises(Exception, match="same"):
            client.exec("1", "python", session="sb1", network={"allow": ["example.com"]})
        with pytest.raises(AlreadyExists):
            client.open_session("sb1", network=False)


def test_a_session_is_listed_with_its_limits_and_what_its_sandbox_uses():
    if not has_root():
        return
    limits = {"memory": 256 << 20, "cpu_quota": 50_000, "max_pids": 64}
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.open_session("busy", network=False, limits=limits)
        assert "usage" not in listed(client)["busy"], "only when asked for"
        before = {s["session"]: s for s in client.sessions(usage=True)}["busy"]
        assert before["limits"] == {**limits, "cpu_period": 100_000}, before
        used = before["usage"]
        assert set(used) == {"memory_bytes", "memory_cache_bytes", "cpu_usec", "uptime_ms",
                             "pids"}, used
        assert 0 < used["memory_bytes"] < limits["memory"], used
        assert used["memory_cache_bytes"] <= used["memory_bytes"], used
        assert used["pids"] >= 1, used
        # Half a second of CPU and 64 MiB held: both show, the CPU time
        # counted from the session's start (its cgroup served runs before).
        burn = ("import time\nheld = bytearray(64 << 20)\nend = time.process_time() + 0.5\n"
                "while time.process_time() < end: pass\n")
        assert client.exec(burn, "python", session="busy", network=False,
                           limits=limits)["ok"]
        after = {s["session"]: s for s in client.sessions(usage=True)}["busy"]["usage"]
        assert after["cpu_usec"] - used["cpu_usec"] >= 450_000, (used, after)
        assert after["uptime_ms"] - used["uptime_ms"] >= 500, (used, after)
        assert after["cpu_usec"] < 30_000_000, after
        assert after["memory_bytes"] >= used["memory_bytes"] + (60 << 20), (used, after)
        # A hibernated session has no sandbox: neither is listed.
        if client.hello()["features"].get("session_disks"):
            client.pause_session("busy", hibernate=True)
            entry = {s["session"]: s for s in client.sessions(usage=True)}["busy"]
            assert entry["state"] == "hibernated", entry
            assert "usage" not in entry and "limits" not in entry, entry
        else:
            print("!!! NOT TESTED: a hibernated session's listing needs session disks")


def test_opening_a_stored_session_gives_a_fresh_interpreter_and_keeps_its_labels():
    if not has_root():
        return
    with kernel_dir() as kernels:
        with AgentOSClient(kernels.kernel.socket_path) as client:
            client.open_session("sb1", labels={"k": "v"}, lifetime_ms=3_600_000)
            assert client.exec("open('/workspace/f', 'w').write('kept')", "python",
                               session="sb1")["ok"]
            ends_at = listed(client)["sb1"]["ends_at"]
        with AgentOSClient(kernels.restart().socket_path) as client:
            entry = listed(client)["sb1"]
            assert entry["state"] == "stored", entry
            assert entry["labels"] == {"k": "v"} and entry["ends_at"] == ends_at, entry
            assert entry["then"] == "close", entry
            again = client.open_session("sb1")
            assert again["fresh_interpreter"] is True, again
            entry = listed(client)["sb1"]
            assert entry["labels"] == {"k": "v"}, entry
            assert "ends_at" not in entry, "an open gives its own lifetime"
            read = client.exec("print(open('/workspace/f').read())", "python", session="sb1")
            assert read["stdout"] == "kept\n", read


def test_a_lifetime_closes_the_session_at_its_end():
    if not has_root():
        return
    config = "[exec]\nsession_idle_secs = 1\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        started = time.monotonic()
        opened = client.open_session("short", lifetime_ms=3000)
        assert opened["ends_at"].endswith("Z"), opened
        # Idle for longer than session_idle_secs: its lifetime keeps it.
        time.sleep(2.0)
        assert listed(client)["short"]["state"] == "ready"
        wait_until(lambda: "short" not in listed(client))
        assert time.monotonic() - started >= 2.9


def test_a_lifetime_that_hibernates_leaves_a_session_resume_wakes():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.open_session("nap", lifetime_ms=1500, then="hibernate")
        assert client.exec("x = 'kept'", "python", session="nap")["ok"]
        wait_until(lambda: listed(client)["nap"]["state"] == "hibernated")
        entry = listed(client)["nap"]
        assert "ends_at" not in entry, entry
        assert client.resume_session("nap")["state"] == "ready"
        assert client.exec("print(x)", "python", session="nap")["stdout"] == "kept\n"


def test_lifetime_is_set_anew_cleared_and_only_on_ones_own_sessions():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client, \
            AgentOSClient(kernel.socket_path) as other:
        client.open_session("s1", lifetime_ms=1500)
        assert client.set_lifetime("s1", 3_600_000).endswith("Z")
        assert client.set_lifetime("s1", None) is None
        time.sleep(2.0)
        assert "s1" in listed(client), "the first lifetime was cleared"
        with pytest.raises(NotFound):
            client.set_lifetime("nope", 1000)
        other.delegate("someone-else")
        with pytest.raises(NotFound):
            other.set_lifetime("s1", 1000)
        with pytest.raises(BadRequest, match="lifetime_ms"):
            client.set_lifetime("s1", 0)
        with pytest.raises(BadRequest):
            client.set_lifetime("s1", 1000, then="explode")


def test_a_lifetime_that_ended_while_the_kernel_was_down_ends_at_its_start():
    if not has_root():
        return
    with kernel_dir() as kernels:
        with AgentOSClient(kernels.kernel.socket_path) as client:
            client.open_session("gone", lifetime_ms=1000)
            client.open_session("stays", lifetime_ms=3_600_000)
        kernels.kernel.process.kill()
        kernels.kernel.process.wait()
        time.sleep(1.5)
        with AgentOSClient(kernels.restart().socket_path) as client:
            wait_until(lambda: "gone" not in listed(client))
            assert "stays" in listed(client)


def test_open_refuses_hostile_fields_by_name(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        for fields, named in [
            ({"labels": {f"k{n}": "v" for n in range(33)}}, "labels"),
            ({"labels": {"k": "v" * 5000}}, "labels"),
            ({"labels": {"k": "\x1b[31m"}}, "labels"),
            ({"env": {"AGENTOS_SOCKET": "/tmp/x"}}, "AGENTOS_"),
            ({"env": {"A=B": "x"}}, "env"),
            ({"lifetime_ms": 0}, "lifetime_ms"),
            ({"lifetime_ms": 31 * 24 * 3600 * 1000}, "lifetime_ms"),
            ({"then": "close"}, "then"),
        ]:
            with pytest.raises(BadRequest, match=named):
                client.open_session("h1", **fields)
        for extra in ({"code": "print(1)"}, {"files": {}}, {"name": "x"}):
            with pytest.raises(BadRequest, match=next(iter(extra))):
                client.call_json(0x02, {"op": "open", "session": "h1", **extra})
        assert "h1" not in {s["session"] for s in client.sessions()}


def test_a_delegate_opens_sessions_of_its_own():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as alice, \
            AgentOSClient(kernel.socket_path) as bob:
        alice.delegate("alice")
        bob.delegate("bob")
        alice.open_session("sb", labels={"owner": "alice"})
        bob.open_session("sb", labels={"owner": "bob"})
        assert listed(alice)["sb"]["labels"] == {"owner": "alice"}
        assert listed(bob)["sb"]["labels"] == {"owner": "bob"}
        with pytest.raises(PermissionDenied):
            bob.open_session("t", permissions={"spawn": True})


def test_the_cli_opens_a_session_and_sets_its_lifetime(kernel):
    if not has_root():
        return
    from test_cli import agentos

    opened = agentos(kernel, "sessions", "--open", "c1", "--label", "team=data",
                     "--lifetime", "3600", "--then", "hibernate")
    assert opened.returncode == 0 and "opened; it ends at" in opened.stdout, opened
    listed_now = json.loads(agentos(kernel, "sessions", "--json").stdout)["sessions"]
    entry = next(s for s in listed_now if s["session"] == "c1")
    assert entry["labels"] == {"team": "data"} and entry["then"] == "hibernate", entry
    cleared = agentos(kernel, "sessions", "--set-lifetime", "c1", "--lifetime", "0")
    assert cleared.returncode == 0 and "has no lifetime" in cleared.stdout, cleared
    bad = agentos(kernel, "sessions", "--open", "c2", "--label", "nokey")
    assert bad.returncode != 0 and "KEY=VALUE" in bad.stderr, bad
    again = agentos(kernel, "sessions", "--open", "c1")
    assert again.returncode != 0 and "open already" in again.stderr, again


def test_a_run_opens_no_session_with_more_than_it_has(kernel):
    # LLM-written code in a run, given EXEC of its own, asks to open a
    # session with more memory and permissions than the run was given.
    from conftest import RUN_ASKS_KERNEL

    code = RUN_ASKS_KERNEL + (
        'print(json.dumps(ask(0x02, {"op": "open", "session": "grab", '
        '"limits": {"memory": 1 << 40}})))\n'
        'print(json.dumps(ask(0x02, {"op": "open", "session": "grab2", '
        '"permissions": {"spawn": True}})))\n')
    with AgentOSClient(kernel.socket_path) as client:
        result = client.exec(code, "python", timeout_ms=60_000, permissions={"exec": True})
        if result.get("code") == "unavailable":
            print("!!! NOT TESTED: a run opening a session (EXEC unavailable here)")
            return
        assert result["ok"], result
        first, second = (json.loads(line) for line in result["stdout"].splitlines())
        assert first["code"] == "permission_denied", first
        assert "more than the caller's own" in first["error"], first
        assert second.get("success") is not True and second["code"] == "permission_denied", second
