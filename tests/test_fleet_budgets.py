"""A principal's THINK quota holds across a fleet: each node leases chunks
of it from the fleet's ledger in PostgreSQL, so a flood of THINKs through
every node at once spends no more than the quota. Each node runs in a
network namespace of its own; the model, like the database, is reached
through the harness's bridge."""

from __future__ import annotations

import concurrent.futures
import time

from agentos import AgentOSClient, AgentOSError
from fleet_harness import fleet
from stub_model import StubModel

QUOTA = 1000
NODES = 3
# The default lease: nothing here waits for one to run out, and a loaded
# machine's slow statement does not cost a node its connection.
LEASE_MS = 10000


def think(node, delegate: str | None = None) -> dict:
    """One THINK's reply (``code`` set when it failed)."""
    with AgentOSClient(node.socket_path, timeout=60) as client:
        if delegate:
            client.call_json(0x19, {"delegate": delegate})
        try:
            return dict(client.think("hi", max_tokens=20))
        except AgentOSError as err:
            return {"code": err.code, "error": err.message}


def flood(nodes, callers_each: int, thinks_each: int) -> tuple[list[dict], list[dict]]:
    """THINKs through every node at once, ``callers_each`` callers on each
    sending ``thinks_each`` one after another: the replies answered, and
    those that failed."""
    callers = [node for node in nodes for _ in range(callers_each)]
    with concurrent.futures.ThreadPoolExecutor(len(callers)) as pool:
        floods = pool.map(lambda node: [think(node) for _ in range(thinks_each)], callers)
        replies = [reply for flood in floods for reply in flood]
    return ([r for r in replies if "code" not in r], [r for r in replies if "code" in r])


def test_a_principals_tokens_hold_across_the_fleet_under_a_think_flood():
    with fleet() as f:
        model = StubModel(["ok"], host=f.bridge.address)
        try:
            quota = f"[llm.quota]\ntokens = {QUOTA}\nperiod_secs = 3600\n"
            nodes = [f.node(f"n{i}", lease_ms=LEASE_MS, extra=model.config() + quota)
                     for i in range(1, NODES + 1)]
            # Far more THINKs than the quota pays for (each answer costs
            # 13 tokens).
            answered, refused = flood(nodes, callers_each=4, thinks_each=30)
            spent = sum(r["tokens"] for r in answered)
            print(f"fleet-wide: {len(answered)} THINKs answered, {spent} tokens "
                  f"of a {QUOTA}-token quota; {len(refused)} refused")
            assert {r["code"] for r in refused} == {"limit_exceeded"}, [r for r in refused if r["code"] != "limit_exceeded"][:3]
            # Within the quota (the ledger never grants more), and most of
            # it used: the nodes did share it.
            assert spent <= QUOTA, spent
            assert spent >= QUOTA // 2, spent
            assert len(model.requests) == len(answered)
            # The ledger granted the nodes together no more than the quota.
            granted = f.postgres.sql(
                "SELECT sum(granted) FROM agentos_allowances WHERE measure = 'tokens'",
                "agentos").strip()
            assert 0 < int(granted) <= QUOTA, granted
            # How often the nodes asked the ledger (a lease is one insert or
            # update of a row), for the record: THINK itself asks nothing.
            time.sleep(1)
            leases = f.postgres.sql(
                "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables "
                "WHERE relname = 'agentos_allowances'", "agentos").strip()
            print(f"ledger: {leases} leases for {len(answered) + len(refused)} THINKs")
            # What each node holds comes back as answers use less than they
            # paid: THINKs until each node refuses still spend no more.
            for node in nodes:
                more = [think(node) for _ in range(10)]
                assert "code" in more[-1], f"{node.name} still answers"
                spent += sum(r["tokens"] for r in more if "code" not in r)
            assert spent <= QUOTA, spent

            # With the database gone, a principal whose allowance must be
            # leased is refused naming the ledger; one whose is spent is
            # refused as before, and the nodes go on.
            f.postgres.stop()
            gone = think(nodes[1], delegate="key-2")
            assert gone["code"] == "unavailable", gone
            assert "ledger" in gone["error"], gone
            assert think(nodes[1])["code"] == "limit_exceeded"
        finally:
            model.close()


def test_a_principals_request_rate_holds_across_the_fleet():
    with fleet() as f:
        model = StubModel(["ok"], host=f.bridge.address)
        try:
            quota = "timeout_ms = 2000\n[llm.quota]\nrpm = 6\n"
            nodes = [f.node(f"n{i}", lease_ms=LEASE_MS, extra=model.config() + quota)
                     for i in range(1, NODES + 1)]
            # Not across a minute's end: the rate is counted by the
            # database's minute.
            if time.time() % 60 > 50:
                time.sleep(61 - time.time() % 60)
            answered, waited = flood(nodes, callers_each=3, thinks_each=2)
            assert len(answered) == 6, (answered, waited)
            assert {r["code"] for r in waited} == {"timeout"}, [r for r in waited if r["code"] != "timeout"][:3]
            assert len(model.requests) == 6
        finally:
            model.close()
