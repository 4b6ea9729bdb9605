"""Hibernated sessions wake on any node of a fleet: a node that hibernates
an operator's session publishes its files and globals to the fleet's
store, and a run (or a RESUME) of it on another node fetches it, checks
every content against its hash, claims it and makes it there. One claim
wins, so a session wakes on one node; the node it left is told where it
went. Each node runs in a network namespace of its own and reaches
PostgreSQL only through the harness's bridge."""

from __future__ import annotations

import base64
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from agentos import AgentOSClient, AgentOSError
from fleet_harness import fleet, wait_for
from package_index_standin import build_wheel

# pip, a session's first interpreter and a wake, on two busy cores.
SLOW_MS = 180_000


def client_of(node) -> AgentOSClient:
    return AgentOSClient(node.socket_path, timeout=240)


def kept_rows(f) -> list[str]:
    """The fleet's hibernated sessions, as `name|node|hashes`."""
    text = f.postgres.sql(
        "SELECT name || '|' || node || '|' || cardinality(hashes) FROM agentos_sessions",
        "agentos")
    return [line for line in text.splitlines() if line]


def n1_alive(seen_from) -> bool:
    with client_of(seen_from) as client:
        return any(n["name"] == "n1" and n["alive"] for n in client.nodes()["nodes"])


def contents_count(f) -> int:
    return int(f.postgres.sql("SELECT count(*) FROM agentos_session_contents",
                              "agentos").strip())


def install_code(wheel: Path) -> str:
    """Code that installs ``wheel`` into the session's environment from a
    file (no index: the sandbox reaches no network) and leaves a file and
    a global."""
    data = base64.b64encode(wheel.read_bytes()).decode()
    return textwrap.dedent(f"""
        import base64, subprocess
        path = '/workspace/{wheel.name}'
        open(path, 'wb').write(base64.b64decode('{data}'))
        done = subprocess.run(['python', '-m', 'pip', 'install', '--no-index', path],
                              capture_output=True, text=True)
        print(done.returncode, done.stdout[-300:], done.stderr[-300:])
        open('/workspace/plan.txt', 'w').write('v1')
        x = 41
        """)


PROBE = ("import agentos_probe; print(x + 1, open('/workspace/plan.txt').read(), "
         "agentos_probe.VALUE)")


@pytest.fixture
def wheel():
    directory = Path(tempfile.mkdtemp(prefix="agentos-wheel-"))
    try:
        yield build_wheel(directory, "agentos-probe", "1.0.0")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def refused_run(node, session: str) -> AgentOSError:
    """What the kernel says, refusing a run of ``session`` on ``node``."""
    with client_of(node) as client:
        with pytest.raises(AgentOSError) as refused:
            client.exec("print(x)", session=session, timeout_ms=SLOW_MS)
    return refused.value


def hibernated_on(node, session: str, code: str) -> None:
    with client_of(node) as client:
        ran = client.exec(code, session=session, timeout_ms=SLOW_MS)
        assert ran["ok"], ran
        paused = client.pause_session(session, hibernate=True)
        assert paused["state"] == "hibernated", paused


def test_a_hibernated_session_wakes_on_another_node_with_its_files_packages_and_globals(wheel):
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        with client_of(n1) as client:
            installed = client.exec(install_code(wheel), session="s1", timeout_ms=SLOW_MS)
            assert installed["ok"] and installed["stdout"].startswith("0 "), installed
        with client_of(n1) as client:
            assert client.pause_session("s1", hibernate=True)["state"] == "hibernated"
        # Published: the manifest's row, and each content once.
        rows = wait_for("s1 in the fleet's store", lambda: kept_rows(f), timeout=30)
        name, node, hashes = rows[0].split("|")
        assert (name, node) == ("s1", "n1") and int(hashes) > 3, rows
        assert contents_count(f) == int(hashes)

        # A run on n2 wakes it there: its files, its package, its globals.
        with client_of(n2) as client:
            woken = client.exec(PROBE, session="s1", timeout_ms=SLOW_MS)
            assert woken["ok"], woken
            assert woken["stdout"].strip() == "42 v1 from the stand-in index", woken
            assert [s["session"] for s in client.sessions()] == ["s1"]
        # Claimed: the fleet keeps it no more, nor any of its contents.
        assert kept_rows(f) == [] and contents_count(f) == 0

        # Hibernated again, on n2: the fleet keeps n2's now.
        hibernated_on(n2, "s1", "x = 99; open('/workspace/plan.txt', 'w').write('v2')")
        wait_for("s1 kept again", lambda: kept_rows(f), timeout=30)
        assert kept_rows(f)[0].split("|")[:2] == ["s1", "n2"]

        # n1's copy is no longer its own (it is closed once n1 learns so);
        # a run there wakes what the fleet keeps now: what n2 made of it.
        with client_of(n1) as client:
            back = client.exec(PROBE, session="s1", timeout_ms=SLOW_MS)
            assert back["stdout"].strip() == "100 v2 from the stand-in index", back
        assert kept_rows(f) == [] and contents_count(f) == 0
        # And n2's copy, in turn, is told where it went.
        with client_of(n2) as client:
            with pytest.raises(AgentOSError) as refused:
                client.resume_session("s1")
            assert refused.value.code == "not_found", refused.value
            assert 'woken on node "n1"' in str(refused.value), refused.value
            assert client.sessions() == []

        # Closed where it hibernated: the fleet forgets it too; and so when
        # its lifetime closes it. A restore onto it, which would wake it
        # unclaimed, is refused while the fleet keeps it.
        hibernated_on(n1, "s2", "y = 1")
        wait_for("s2 kept", lambda: kept_rows(f), timeout=30)
        with client_of(n1) as client:
            client.snapshot("s2", "before")
            with pytest.raises(AgentOSError) as refused:
                client.restore("s2", "before")
            assert refused.value.code == "bad_request" and "kept by the fleet" in str(
                refused.value), refused.value
            assert client.close_session("s2") is True
        wait_for("s2 forgotten", lambda: kept_rows(f) == [], timeout=30)
        assert contents_count(f) == 0
        hibernated_on(n1, "s3", "z = 1")
        wait_for("s3 kept", lambda: kept_rows(f), timeout=30)
        with client_of(n1) as client:
            client.call_json(0x02, {"op": "lifetime", "session": "s3", "lifetime_ms": 300,
                                    "then": "close"})
        wait_for("s3 forgotten once its lifetime closed it", lambda: kept_rows(f) == [],
                 timeout=30)


def test_contents_changed_in_the_fleets_store_are_refused_and_the_session_stays_kept():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        hibernated_on(n1, "s1", "open('/workspace/a.txt', 'w').write('a' * 100); x = 1")
        wait_for("s1 kept", lambda: kept_rows(f), timeout=30)
        # Whoever can write to the database swaps a file's content.
        f.postgres.sql(
            "UPDATE agentos_session_contents SET content = 'evil'::bytea WHERE hash = "
            "(SELECT hash FROM agentos_session_contents ORDER BY length(content) DESC "
            "LIMIT 1)", "agentos")
        refused = refused_run(n2, "s1")
        assert "damaged" in str(refused), refused
        with client_of(n2) as client:
            assert client.sessions() == []
        # Nothing was claimed: the fleet still keeps it, for n1 to wake.
        assert [row.split("|")[0] for row in kept_rows(f)] == ["s1"]

        # A content named by no hash (a path) is never written anywhere.
        f.postgres.sql(
            "INSERT INTO agentos_session_contents VALUES "
            "('root', '', '../../../../tmp/agentos-fleet-escape', 0, 'x'::bytea);"
            "UPDATE agentos_sessions SET hashes = "
            "array_append(hashes, '../../../../tmp/agentos-fleet-escape')", "agentos")
        refused = refused_run(n2, "s1")
        assert refused.code == "unavailable" and "no hash" in str(refused), refused
        assert not Path("/tmp/agentos-fleet-escape").exists()

        # While the database is down, a session the fleet keeps cannot be
        # claimed: the run says so, by name; a new session opens as ever.
        f.postgres.stop()
        try:
            with client_of(n1) as client:
                with pytest.raises(AgentOSError) as refused:
                    client.exec("print(x)", session="s1", timeout_ms=SLOW_MS)
                assert refused.value.code == "unavailable", refused.value
                assert "kept by the fleet" in str(refused.value)
                fresh = client.exec("print('fresh')", session="s3", timeout_ms=SLOW_MS)
                assert fresh["stdout"].strip() == "fresh"
        finally:
            f.postgres.start()


def test_a_session_outlives_its_killed_node_and_the_node_back_knows_it_went():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        # A file of two parts in the fleet's store (8 MiB each).
        big = ("import hashlib, os; data = os.urandom(9 << 20); "
               "open('/workspace/big.bin', 'wb').write(data); "
               "digest = hashlib.sha256(data).hexdigest(); "
               "open('/workspace/note.txt', 'w').write('kept'); x = 7")
        with client_of(n1) as client:
            client.open_session("s1", labels={"team": "a"}, env={"GREETING": "hi"})
        hibernated_on(n1, "s1", big)
        wait_for("s1 kept", lambda: kept_rows(f), timeout=30)
        parts = f.postgres.sql("SELECT max(part) FROM agentos_session_contents", "agentos")
        assert int(parts.strip()) == 1, parts
        n1.kill()
        with client_of(n2) as client:
            woken = client.exec(
                "import hashlib; data = open('/workspace/big.bin', 'rb').read(); "
                "print(x, open('/workspace/note.txt').read(), "
                "hashlib.sha256(data).hexdigest() == digest)",
                session="s1", timeout_ms=SLOW_MS)
            assert woken["stdout"].strip() == "7 kept True", woken
            # Its labels came with it (and its env, for its processes).
            assert [s["labels"] for s in client.sessions()] == [{"team": "a"}]
        # n1 comes back with its disks, and its copy of s1 on one of them:
        # its record says the fleet was keeping it, so it is claimed before
        # it wakes — and the claim is lost.
        # (Once its lease has run out: a live name is never taken twice.)
        wait_for("n1's lease to run out", lambda: not n1_alive(n2), timeout=30)
        n1.start()
        wait_for("n1 in the fleet", n1.is_joined, timeout=30)
        refused = refused_run(n1, "s1")
        assert 'woken on node "n2"' in str(refused), refused


def test_a_session_bigger_than_the_owners_room_where_it_wakes_is_refused_and_stays_kept():
    with fleet() as f:
        n1 = f.node("n1")
        # n2 gives each owner 1 MiB of room for snapshots.
        n2 = f.node("n2", extra="\n[exec]\nsnapshot_bytes = 1048576\n")
        hibernated_on(n1, "s1", "import os; open('/workspace/big', 'wb').write(os.urandom(3 << 20))")
        wait_for("s1 kept", lambda: kept_rows(f), timeout=30)
        refused = refused_run(n2, "s1")
        assert refused.code == "unavailable" and "over 1048576 bytes" in str(refused), refused
        with client_of(n2) as client:
            assert client.sessions() == []
        assert [row.split("|")[0] for row in kept_rows(f)] == ["s1"]

