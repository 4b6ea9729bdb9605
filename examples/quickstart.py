#!/usr/bin/env python3
"""A first session with the AgentOS kernel, through the Python SDK.

Run it against a running agentosd (``scripts/run`` starts one and runs this):

    AGENTOS_SOCKET=/path/to/agentos.sock python examples/quickstart.py
"""

from __future__ import annotations

import os
import sys
import time

from agentos import AgentOSClient, AgentOSConnectionError, AgentOSError, BadRequest, Opcode

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    with AgentOSClient() as client:
        hello = client.hello()
        features = hello["features"]
        print(f"connected to AgentOS kernel {hello['kernel_version']} at {client.socket_path}")
        print(f"  protocol {hello['protocol_version']}, you are id {hello['agent_id']}")
        available = [name for name in ("think", "exec", "spawn", "task") if features.get(name)]
        print(f"  features available: {', '.join(available) or 'protocol core only'}")

        print(f"echo: {client.echo('Hello!')!r}")

        samples = []
        for _ in range(2000):
            start = time.perf_counter()
            client.noop(b"ping")
            samples.append(time.perf_counter() - start)
        samples.sort()
        print(
            f"2000 NOOP round trips from Python: p50 {samples[1000] * 1e6:.1f} µs, "
            f"p99 {samples[1980] * 1e6:.1f} µs"
        )

        for i in range(100):
            client.send(Opcode.NOOP, f"pipelined-{i}")
        in_order = all(client.recv().payload == f"pipelined-{i}".encode() for i in range(100))
        print(f"100 pipelined NOOPs answered in order: {in_order}")

        print(f"agents: {client.list_agents()}")

        hello_agent = os.path.join(REPO, "agents", "hello_agent.py")
        agent = client.spawn(f"hello-{os.getpid()}", hello_agent, python=sys.executable)
        isolation = agent["isolation"]
        print(
            f"spawned agent {agent['id']} ({agent['name']}): {agent['status']}, "
            f"namespaces [{' '.join(isolation['namespaces'])}], cgroup {isolation['cgroup']}"
        )
        if isolation.get("degraded_reason"):
            print(f"  degraded: {isolation['degraded_reason']}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = next(a for a in client.list_agents() if a["id"] == agent["id"])
            if state["state"] != "running":
                break
            time.sleep(0.05)
        print(f"agent {agent['id']} {state['state']} with exit code {state['exit_code']}")

        try:
            client.spawn("../etc", hello_agent)
        except BadRequest as err:
            print(f"a bad request is refused: {err.code} — {err.message}")

        if features.get("exec"):
            run = client.exec(
                "import csv; rows = list(csv.reader(open('data.csv')))\n"
                "open('sum.txt', 'w').write(str(sum(int(r[1]) for r in rows)))",
                files={"data.csv": b"a,1\nb,2\nc,39\n"},
                collect=["sum.txt"],
                limits={"memory": "128M", "cpus": 0.5},
            )
            print(f"EXEC in a fresh sandbox: ok {run['ok']}, sum.txt = {run['files']['sum.txt']!r}, "
                  f"{run['duration_ms']} ms")
            ids = [client.dispatch("exec", {"code": f"import time; time.sleep({d}); print({d})"})
                   for d in (2, 0, 1)]
            order = [task["result"]["stdout"].strip() for task in client.as_completed(ids, timeout=60)]
            print(f"3 background tasks ended in the order {', '.join(order)}")

        try:
            if features.get("think"):
                reply = client.think("What is 2+2? Answer in one sentence.", max_tokens=48)
                print(f"THINK answer: {' '.join(reply['content'].split())}")
                print(
                    f"  {reply['tokens']} tokens from {reply['model']}, "
                    f"queued {reply['queue_ms']} ms, answered in {reply['latency_ms']} ms"
                )
            else:
                # Asking anyway shows the kernel's reason: no provider
                # configured, the local model not installed, ...
                client.think("What is 2+2?")
        except AgentOSError as err:
            print(f"THINK: {err.code} — {err.message}")

        client.exit()
        print("said goodbye")
        return 0 if in_order else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AgentOSConnectionError as err:
        print(f"quickstart: {err.message}", file=sys.stderr)
        sys.exit(2)
