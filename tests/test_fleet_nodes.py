"""A fleet's nodes: joining, leases by the database's clock, one live node
per name, the schema's versions, a database that is down or cut off, and
the password that never shows. Each node runs in a network namespace of its
own and reaches PostgreSQL only through the harness's bridge."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from agentos import AgentOSClient, AgentOSError
from conftest import RUN_ASKS_KERNEL, binary, kernel_with
from fleet_harness import fleet, wait_for

FLEET_OPCODE = 0x1A


def nodes_seen(node) -> dict[str, dict]:
    with AgentOSClient(node.socket_path, timeout=30) as client:
        return {n["name"]: n for n in client.nodes()["nodes"]}


def hello_fleet(node) -> bool:
    with AgentOSClient(node.socket_path, timeout=30) as client:
        return client.hello()["features"]["fleet"]


def start_failing(node, timeout: float = 30) -> tuple[int, str]:
    """Starts ``node``'s agentosd expecting it to refuse: its exit status
    and log."""
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    (workdir / "agentosd.toml").write_text(node.config + '\n[llm]\nprovider = "none"\n')
    env = {**os.environ, **node.env, "AGENTOS_STATE_DIR": str(workdir / "state")}
    try:
        done = subprocess.run(
            [*node.host.wrap(), binary("agentosd"), "--socket", str(workdir / "s.sock"),
             "--config", str(workdir / "agentosd.toml")],
            env=env, capture_output=True, text=True, timeout=timeout,
        )
        # A refused node stops before it has made anything: no disk, no mount.
        mounts = Path("/proc/self/mountinfo").read_text()
        assert str(workdir) not in mounts, "a refused node left a mount behind"
        loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        assert str(workdir) not in loops, "a refused node left a loop device behind"
        return done.returncode, done.stderr
    finally:
        subprocess.run(["rm", "-rf", str(workdir)])


def test_nodes_join_and_each_sees_the_whole_fleet():
    with fleet() as f:
        n1 = f.node("n1", extra='advertise = "http://n1.example:3000"\n')
        n2 = f.node("n2")
        for node in (n1, n2):
            seen = wait_for("both nodes listed", lambda: (s := nodes_seen(node)) and
                            {"n1", "n2"} <= s.keys() and s)
            assert seen["n1"]["alive"] and seen["n2"]["alive"], seen
            assert seen["n1"]["advertise"] == "http://n1.example:3000"
            assert seen["n2"]["advertise"] is None
            assert seen["n1"]["reads_schema"] >= 1
            assert seen["n1"]["lease_age_ms"] < 2000
            assert hello_fleet(node)
        with AgentOSClient(n2.socket_path) as client:
            assert client.nodes()["node"] == "n2"
        # The figures a node reports at its renewals.
        with AgentOSClient(n1.socket_path) as client:
            agent = client.spawn("sleeper", command=["sleep", "60"])
            wait_for("n1's agent counted",
                     lambda: nodes_seen(n2)["n1"]["agents"] == 1, timeout=15)
            client.kill(agent["id"])
        out = subprocess.run([binary("agentos"), "--socket", n1.socket_path, "nodes"],
                             capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
        assert lines[0].split()[:2] == ["NAME", "STATE"], out
        assert any(line.startswith("* n1") and " live " in line for line in lines), out
        assert any(line.startswith("  n2") for line in lines), out
        version = f.postgres.sql("SELECT version FROM agentos_schema", "agentos").strip()
        assert int(version) == seen["n1"]["reads_schema"]


def test_the_databases_password_is_never_in_argv_or_the_log():
    with fleet() as f:
        node = f.node("n1")
        password = f.postgres.password
        cmdline = Path(f"/proc/{node.kernel.process.pid}/cmdline").read_bytes()
        assert password.encode() not in cmdline
        # Down, the database is named in the log, its password hidden.
        f.postgres.stop()
        wait_for("the node out of the fleet", lambda: not hello_fleet(node), timeout=15)
        with AgentOSClient(node.socket_path) as client:
            with pytest.raises(AgentOSError) as refused:
                client.nodes()
        assert refused.value.code == "unavailable", refused.value
        assert "database" in str(refused.value)
        assert password not in str(refused.value)
        log = node.kernel.log()
        assert "postgresql://agentos:***@" in log, log[-2000:]
        assert password not in log


def test_a_second_live_node_of_the_same_name_refuses_to_start():
    with fleet() as f:
        first = f.node("twin", lease_ms=2000)
        second = f.node("twin", lease_ms=2000, start=False)
        status, log = start_failing(second)
        assert status != 0
        assert 'node name "twin" is held by another live node' in log, log
        # Once the first is gone and its lease has run out (by the
        # database's clock), the name is free again.
        first.kill()
        time.sleep(2.5)
        second.start()
        assert wait_for("the second twin joined", lambda: hello_fleet(second), timeout=10)
        seen = nodes_seen(second)
        assert list(seen) == ["twin"] and seen["twin"]["alive"]


def test_a_node_refuses_a_schema_newer_than_it_reads():
    with fleet() as f:
        node = f.node("n1")
        reads = nodes_seen(node)["n1"]["reads_schema"]
        f.postgres.sql(f"UPDATE agentos_schema SET version = {reads + 5}", "agentos")
        late = f.node("late", start=False)
        status, log = start_failing(late)
        assert status != 0
        assert f"schema version {reads + 5}" in log, log
        assert f"reads versions up to {reads}" in log, log


def test_a_node_migrates_only_when_every_live_node_can_read_the_result():
    with fleet() as f:
        node = f.node("n1")
        reads = nodes_seen(node)["n1"]["reads_schema"]
        # An older node, live, that reads one version less; the database
        # one version behind what the new node would migrate it to.
        f.postgres.sql(
            f"UPDATE agentos_schema SET version = {reads - 1};"
            " INSERT INTO agentos_nodes"
            " (name, incarnation, version, reads_schema, lease_until, lease_ms)"
            f" VALUES ('old', 1, '0.0.1', {reads - 1}, now() + interval '1 hour', 2000)",
            "agentos",
        )
        newer = f.node("newer", start=False)
        status, log = start_failing(newer)
        assert status != 0
        assert f'live node "old" reads versions up to {reads - 1}' in log, log
        f.postgres.sql(f"UPDATE agentos_schema SET version = {reads};"
                       " DELETE FROM agentos_nodes WHERE name = 'old'", "agentos")
        newer.start()
        assert wait_for("the newer node joined", lambda: hello_fleet(newer), timeout=10)


def test_a_dead_node_is_seen_dead_once_its_lease_runs_out():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        wait_for("n2 listed", lambda: nodes_seen(n1).get("n2", {}).get("alive"))
        n2.kill()
        started = time.monotonic()
        wait_for("n2 dead", lambda: not nodes_seen(n1)["n2"]["alive"], timeout=10)
        # Not before its lease (2 s) could have run out.
        assert time.monotonic() - started > 0.5
        assert nodes_seen(n1)["n1"]["alive"]


def test_a_cut_off_node_serves_alone_and_rejoins_when_its_link_is_mended():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        wait_for("n2 listed", lambda: nodes_seen(n1).get("n2", {}).get("alive"))
        n2.host.cut()
        wait_for("n2 dead to n1", lambda: not nodes_seen(n1)["n2"]["alive"], timeout=10)
        wait_for("n2 out of the fleet", lambda: not hello_fleet(n2), timeout=10)
        with AgentOSClient(n2.socket_path, timeout=60) as client:
            # Its own work goes on.
            assert client.list_agents() == []
            with pytest.raises(AgentOSError) as refused:
                client.nodes()
            assert refused.value.code == "unavailable"
        n2.host.mend()
        wait_for("n2 back", lambda: hello_fleet(n2), timeout=20)
        wait_for("n2 alive to n1", lambda: nodes_seen(n1)["n2"]["alive"], timeout=10)


def test_a_node_starts_alone_while_the_database_is_down_and_joins_when_it_answers():
    with fleet() as f:
        f.postgres.stop()
        node = f.node("n1", joined=False)
        assert not hello_fleet(node)
        with AgentOSClient(node.socket_path) as client:
            with pytest.raises(AgentOSError) as refused:
                client.nodes()
            assert refused.value.code == "unavailable"
        f.postgres.start()
        wait_for("n1 joined", lambda: hello_fleet(node), timeout=20)
        assert nodes_seen(node)["n1"]["alive"]


def test_fleet_is_for_operators_only():
    with fleet() as f:
        node = f.node("n1")
        code = RUN_ASKS_KERNEL + (
            f"print(json.dumps(ask({FLEET_OPCODE}, {{'op': 'nodes'}})))"
        )
        with AgentOSClient(node.socket_path, timeout=60) as client:
            run = client.exec(code)
            assert run["exit_code"] == 0, run
            answer = json.loads(run["stdout"])
            assert answer["code"] == "permission_denied", answer
            assert "nodes" not in answer
            # Unknown fields and operations are refused by name.
            for bad in ({"op": "nodes", "all": True}, {"op": "join"}, {}):
                with pytest.raises(AgentOSError) as refused:
                    client.call_json(FLEET_OPCODE, bad)
                assert refused.value.code == "bad_request", bad


def test_a_node_without_a_fleet_says_so():
    with kernel_with() as kernel:
        with AgentOSClient(kernel.socket_path) as client:
            assert client.hello()["features"]["fleet"] is False
            with pytest.raises(AgentOSError) as refused:
                client.nodes()
            assert refused.value.code == "unavailable"
            assert "has not joined a fleet" in str(refused.value)


def test_metrics_carry_the_nodes_name_and_the_fleets_gauges():
    with fleet() as f:
        n1, _n2 = f.node("n1"), f.node("n2")
        def text():
            return subprocess.run([binary("agentos"), "--socket", n1.socket_path, "metrics"],
                                  capture_output=True, text=True, check=True).stdout
        seen = wait_for("both nodes counted", lambda: (t := text())
                        and 'agentos_fleet_nodes{state="live",node="n1"} 2' in t and t, timeout=20)
        assert 'agentos_fleet_joined{node="n1"} 1' in seen, seen
        assert 'agentos_fleet_tasks_held{node="n1"} 0' in seen
        # Every series says whose it is.
        series = [line for line in seen.splitlines() if line and not line.startswith("#")]
        assert series and all('node="n1"' in line for line in series), [
            line for line in series if 'node="n1"' not in line][:5]
