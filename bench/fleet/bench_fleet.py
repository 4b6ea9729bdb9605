"""The fleet's costs, against a node alone in the same run: dispatch to
start of a task, tasks per second with one node and with three, failover
from `kill -9` to the task running elsewhere, and the database statements
a task costs. Nodes run in network namespaces of their own on a bridge with
PostgreSQL, as in the fleet's tests (tests/fleet_harness.py).

On a machine of two cores, three nodes share the same two cores: the tasks
per second measure the fleet's overhead, not scale-out.

Prints figures and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from agentos import AgentOSClient  # noqa: E402
from conftest import start_kernel  # noqa: E402
from fleet_harness import Fleet, postgres_bin_dir, wait_for  # noqa: E402

QUIET = {"AGENTOS_LOG_LEVEL": "warn"}
TASK = 0x13


def ask(socket: str, request: dict) -> dict:
    with AgentOSClient(socket, timeout=120) as client:
        return client.call_json(TASK, request)


def dispatch(socket: str, code: str = "pass", **fields) -> str:
    return ask(socket, {"op": "dispatch", "kind": "exec", "request": {"code": code},
                        **fields})["task_id"]


def finished(socket: str, task_id: str) -> dict:
    return ask(socket, {"op": "wait", "task_id": task_id, "timeout_ms": 120000})["task"]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# A run's code reads the host's clock first thing (a sandbox shares it).
STAMP = "import time; print(repr(time.time()))"


def start_latencies(socket: str, count: int) -> list[float]:
    """Milliseconds from sending each task's dispatch to its code running,
    one task at a time: the same run's start-up is in both figures, so
    their difference is the fleet's."""
    gaps = []
    for _ in range(count):
        sent = time.time()
        task = finished(socket, dispatch(socket, STAMP))
        gaps.append((float(task["result"]["stdout"]) - sent) * 1000)
    return gaps


def throughput(sockets: list[str], count: int) -> float:
    """Tasks per second: `count` tasks dispatched through `sockets` in
    turn, until the last has finished."""
    began = time.monotonic()
    ids = [(sockets[i % len(sockets)], dispatch(sockets[i % len(sockets)]))
           for i in range(count)]
    for socket, task_id in ids:
        finished(socket, task_id)
    return count / (time.monotonic() - began)


def failovers(fleet: Fleet, rounds: int) -> list[float]:
    """Seconds from `kill -9` of the node running a task to the task
    running on the other node."""
    nodes = [fleet.node("f1", env=QUIET), fleet.node("f2", env=QUIET)]
    took = []
    for _ in range(rounds):
        watcher = nodes[0]
        task_id = dispatch(watcher.socket_path, "import time; time.sleep(600)", max_attempts=2)
        status = lambda: ask(watcher.socket_path, {"op": "status", "task_id": task_id})["task"]
        first = wait_for("running", lambda: (t := status())["state"] == "running" and t, 30)
        victim = next(n for n in nodes if n.name == first["node"])
        survivor = next(n for n in nodes if n is not victim)
        watcher = survivor
        killed = time.monotonic()
        victim.kill()
        wait_for("running elsewhere", lambda: (t := status())["state"] == "running"
                 and t["node"] == survivor.name, 60, every=0.02)
        took.append(time.monotonic() - killed)
        ask(survivor.socket_path, {"op": "cancel", "task_id": task_id})
        victim.start()
        wait_for("back", victim.is_joined, 30)
    return took


def statements(fleet: Fleet) -> int:
    return int(fleet.postgres.sql(
        "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements", "agentos").strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="tasks per latency run")
    parser.add_argument("--burst", type=int, default=60, help="tasks per throughput run")
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--lease-ms", type=int, default=2000)
    args = parser.parse_args()
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        sys.exit("bench-fleet: PostgreSQL's server is not installed (scripts/setup --test)")

    alone_dir = Path(tempfile.mkdtemp(prefix="agentos-bench-"))
    alone = start_kernel(alone_dir, env_extra=QUIET)
    fleet = Fleet(bin_dir, "shared_preload_libraries = 'pg_stat_statements'\n")
    try:
        fleet.postgres.sql("CREATE EXTENSION pg_stat_statements", "agentos")
        print(f"bench-fleet: {args.tasks} tasks one at a time, {args.burst} at once, "
              f"{args.failovers} failovers, lease {args.lease_ms} ms")
        finished(alone.socket_path, dispatch(alone.socket_path))  # warm
        local = start_latencies(alone.socket_path, args.tasks)

        n1 = fleet.node("n1", lease_ms=args.lease_ms, env=QUIET)
        finished(n1.socket_path, dispatch(n1.socket_path))
        fleet.postgres.sql("SELECT pg_stat_statements_reset()", "agentos")
        idle_from = time.monotonic()
        time.sleep(5)
        idle = statements(fleet) / (time.monotonic() - idle_from)
        fleet.postgres.sql("SELECT pg_stat_statements_reset()", "agentos")
        began = time.monotonic()
        remote = start_latencies(n1.socket_path, args.tasks)
        spent = statements(fleet) - idle * (time.monotonic() - began)
        per_task = spent / args.tasks

        print("\ndispatch to start (ms: the dispatch sent, to the task's code running)")
        for name, gaps in (("alone (local task)", local), ("fleet task, 1 node", remote)):
            print(f"  {name:<22} p50 {percentile(gaps, 50):7.1f}   p99 {percentile(gaps, 99):7.1f}")
        print(f"  ratio p50 fleet/alone: {percentile(remote, 50) / max(percentile(local, 50), 0.1):.2f}")

        print(f"\ndatabase statements per task: {per_task:.1f} (idle: {idle:.1f} a second "
              "per node, taken out); the client prepares each statement with parameters, "
              "one round trip more")

        alone_rate = throughput([alone.socket_path], args.burst)
        one_rate = throughput([n1.socket_path], args.burst)
        n2 = fleet.node("n2", lease_ms=args.lease_ms, env=QUIET)
        n3 = fleet.node("n3", lease_ms=args.lease_ms, env=QUIET)
        three_rate = throughput([n.socket_path for n in (n1, n2, n3)], args.burst)
        print("\ntasks per second (EXEC runs of `pass`; 2 cores shared by every node: this "
              "measures the fleet's overhead, not scale-out)")
        print(f"  alone                  {alone_rate:6.1f}")
        print(f"  fleet, 1 node          {one_rate:6.1f}   ratio to alone {one_rate / alone_rate:.2f}")
        print(f"  fleet, 3 nodes         {three_rate:6.1f}   ratio to alone {three_rate / alone_rate:.2f}")
        for node in (n1, n2, n3):
            node.stop()

        took = failovers(fleet, args.failovers)
        target = args.lease_ms / 1000 + 1
        print(f"\nfailover, kill -9 to running elsewhere (s; lease {args.lease_ms / 1000:.0f} s, "
              f"target <= {target:.0f} s)")
        print(f"  p50 {statistics.median(took):.2f}   p99 {percentile(took, 99):.2f}   "
              f"max {max(took):.2f}   over {len(took)}")
    finally:
        fleet.close()
        alone.stop()
        shutil.rmtree(alone_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
