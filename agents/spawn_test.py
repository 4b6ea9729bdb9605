#!/usr/bin/env python3
"""Spawns three workers, lists them, kills them, and checks each step.

Run it as an operator (`python agents/spawn_test.py`) or spawn it as an
agent with `permissions.spawn` — then the workers are its children, and it
may kill them and only them.
"""

import os
import sys
import time

from agentos import AgentOSClient, AlreadyExists

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    with AgentOSClient() as kernel:
        suffix = f"{os.getpid()}"
        names = [f"worker-{i}-{suffix}" for i in range(3)]
        spawned = [
            kernel.spawn(
                name,
                os.path.join(HERE, "worker_agent.py"),
                python=sys.executable,
                limits={"memory": "128M", "max_pids": 32},
            )
            for name in names
        ]
        for reply in spawned:
            print(f"spawned {reply['name']} as agent {reply['id']} ({reply['status']})", flush=True)
        time.sleep(1.5)
        listed = {a["name"]: a for a in kernel.list_agents()}
        for name in names:
            state = listed[name]["state"]
            print(f"{name}: {state}", flush=True)
            if state != "running":
                return 1
        try:
            kernel.spawn(names[0], os.path.join(HERE, "worker_agent.py"), python=sys.executable)
            print("a duplicate name was accepted", flush=True)
            return 1
        except AlreadyExists as err:
            print(f"duplicate refused: {err.code}", flush=True)
        for reply in spawned:
            kernel.kill(reply["id"], grace_ms=2000)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = {a["name"]: a["state"] for a in kernel.list_agents() if a["name"] in names}
            if all(s == "killed" for s in states.values()):
                print(f"all killed: {states}", flush=True)
                return 0
            time.sleep(0.2)
        print(f"not all killed: {states}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
