#!/usr/bin/env python3
"""Why AgentOS exists, in one run: four agents misbehave or behave side by
side, and the kernel keeps each one in its box.

- cpu-hog    an infinite loop, capped at 10% of a CPU      -> THROTTLED
- mem-hog    a memory leak, capped at 50 MiB               -> KILLED (OOM)
- fork-bomb  forks without end, capped at 16 processes     -> CONTAINED
- healthy    a heartbeat to the kernel every half second   -> RUNNING

Meanwhile the demo pings the kernel itself. Prints a table from LIST and
exits 0 only if every agent ended up where it should.

Usage: python agents/fault_isolation_demo.py [--seconds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from agentos import AgentOSClient, NotFound

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
LIVE_STATES = ("starting", "running", "paused", "restarting")


def stop_all(kernel: AgentOSClient, ids: list[int], grace_ms: int = 1000) -> None:
    """KILLs the demo's agents and waits until each has been reaped."""
    for agent_id in ids:
        try:
            kernel.kill(agent_id, grace_ms=grace_ms)
        except NotFound:  # it had already ended
            pass
    deadline = time.monotonic() + grace_ms / 1000 + 5
    while time.monotonic() < deadline:
        live = [a for a in kernel.list_agents() if a["id"] in ids and a["state"] in LIVE_STATES]
        if not live:
            return
        time.sleep(0.05)
    print(f"warning: agents {[a['id'] for a in live]} still ending", file=sys.stderr)


def spawn_all(kernel: AgentOSClient, suffix: str) -> dict[str, dict]:
    python = sys.executable
    plan = {
        "cpu-hog": ("cpu_hog_agent.py", {"cpus": 0.1}),
        "mem-hog": ("memory_hog_agent.py", {"memory": "50M"}),
        "fork-bomb": ("fork_bomb_agent.py", {"max_pids": 16}),
        "healthy": ("healthy_agent.py", {"memory": "128M"}),
    }
    agents = {}
    for role, (script, limits) in plan.items():
        reply = kernel.spawn(
            f"{role}-{suffix}", os.path.join(HERE, script), python=python, limits=limits
        )
        agents[role] = reply
        isolation = reply["isolation"]
        print(
            f"spawned {role:<9} as agent {reply['id']:<4} "
            f"namespaces [{' '.join(isolation['namespaces'])}], cgroup {isolation['cgroup']}",
            flush=True,
        )
        if isolation.get("degraded_reason"):
            print(f"  degraded: {isolation['degraded_reason']}", flush=True)
    return agents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="how long to watch")
    options = parser.parse_args()

    with AgentOSClient() as kernel:
        suffix = str(os.getpid())
        agents = spawn_all(kernel, suffix)
        ids = {role: reply["id"] for role, reply in agents.items()}

        def snapshot() -> dict[str, dict]:
            by_id = {a["id"]: a for a in kernel.list_agents()}
            return {role: by_id[agent_id] for role, agent_id in ids.items()}

        start = snapshot()
        started = time.monotonic()
        pings = []
        while time.monotonic() - started < options.seconds:
            t = time.perf_counter()
            kernel.echo("ping")
            pings.append(time.perf_counter() - t)
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        end = snapshot()

        cpu, mem, bomb, healthy = (end[r] for r in ("cpu-hog", "mem-hog", "fork-bomb", "healthy"))
        cpu_share = (cpu["cpu"]["usage_usec"] - start["cpu-hog"]["cpu"]["usage_usec"]) / (elapsed * 1e6)
        rows = []
        checks = []

        throttled = cpu["state"] == "running" and cpu_share <= 0.15 and cpu["cpu"]["nr_throttled"] > 0
        checks.append(throttled)
        rows.append((
            "cpu-hog", "infinite loop", "THROTTLED" if throttled else "NOT THROTTLED",
            f"CPU share {cpu_share:.1%} (quota 10%), throttled {cpu['cpu']['nr_throttled']} times",
        ))

        killed = mem["state"] == "oom_killed" and mem["oom_killed"]
        checks.append(killed)
        rows.append((
            "mem-hog", "memory leak", "KILLED (OOM)" if killed else f"NOT KILLED ({mem['state']})",
            f"limit {mem['limits']['memory'] // MIB} MiB, exit signal {mem['signal']}",
        ))

        at_cap = bomb["pids"]["current"]
        contained = bomb["state"] == "running" and at_cap <= bomb["pids"]["max"]
        checks.append(contained)
        rows.append((
            "fork-bomb", "fork bomb", "CONTAINED" if contained else "NOT CONTAINED",
            f"{at_cap}/{bomb['pids']['max']} processes",
        ))

        alive = healthy["state"] == "running"
        checks.append(alive)
        rows.append((
            "healthy", "heartbeat", "RUNNING" if alive else healthy["state"].upper(),
            f"{healthy['memory']['current'] / MIB:.1f} MiB, up {healthy['uptime_ms'] / 1000:.1f}s",
        ))

        pings.sort()
        p99 = pings[int(len(pings) * 0.99) - 1] * 1000 if pings else float("nan")
        print()
        print(f"{'AGENT':<10} {'BEHAVIOUR':<14} {'RESULT':<14} DETAIL")
        for row in rows:
            print(f"{row[0]:<10} {row[1]:<14} {row[2]:<14} {row[3]}")
        print(f"kernel     NOOP x{len(pings):<8} {'RESPONSIVE' if p99 < 20 else 'SLOW':<14} p99 {p99:.2f} ms while all this ran")
        print()

        stop_all(kernel, [reply["id"] for reply in agents.values()])
        ok = all(checks) and p99 < 20
        print("every agent stayed in its box" if ok else "SOME AGENT ESCAPED ITS LIMITS", flush=True)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
