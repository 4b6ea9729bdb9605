"""What E2B's SDKs wait for through `agentos e2b`, next to the same work
through AgentOS's own SDK, against one kernel in the same run:

- a sandbox made and its first command run (`Sandbox.create()` then
  `commands.run("true")`), next to a session opened and a process started
  in it and followed to its end (`open_session`, `start_process`,
  `process_output`);
- `run_code("1+1")` in a warm context, next to `exec("1+1")` in a warm
  session.

Prints p50 and p99 of each, and the ratios; asserts nothing. Run by
scripts/bench-e2b, which starts the kernel and the face.
"""

from __future__ import annotations

import argparse
import os
import time

from agentos import AgentOSClient
from e2b import Sandbox
from e2b_code_interpreter import Sandbox as CodeSandbox


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def show(name: str, samples: list[float]) -> tuple[float, float]:
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    print(f"{name:58s} p50 {p50 * 1000:8.2f} ms   p99 {p99 * 1000:8.2f} ms   (n={len(samples)})")
    return p50, p99


def e2b_create_to_first_command(count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        sandbox = Sandbox.create()
        sandbox.commands.run("true")
        samples.append(time.perf_counter() - started)
        sandbox.kill()
    return samples


def agentos_open_to_first_process(client: AgentOSClient, count: int) -> list[float]:
    samples = []
    for n in range(count):
        name = f"bench-{os.getpid()}-{n}"
        started = time.perf_counter()
        client.open_session(name, lifetime_ms=300_000)
        pid = client.start_process(name, ["/bin/bash", "-l", "-c", "true"])["pid"]
        after = 0
        while True:
            output = client.process_output(name, pid=pid, after=after, follow=True)
            after = output["offset"]
            if output["ended"]:
                break
        samples.append(time.perf_counter() - started)
        client.close_session(name)
    return samples


def e2b_warm_run_code(count: int) -> list[float]:
    sandbox = CodeSandbox.create(template="base")
    try:
        for _ in range(5):
            sandbox.run_code("1+1")
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            sandbox.run_code("1+1")
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        sandbox.kill()


def agentos_warm_exec(client: AgentOSClient, count: int) -> list[float]:
    name = f"bench-exec-{os.getpid()}"
    client.open_session(name)
    try:
        for _ in range(5):
            client.exec("1+1", session=name)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            client.exec("1+1", session=name)
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        client.close_session(name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sandboxes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    with AgentOSClient(args.socket, timeout=60) as client:
        made = show("E2B SDK: Sandbox.create() + commands.run('true')",
                    e2b_create_to_first_command(args.sandboxes))
        opened = show("AgentOS SDK: open_session + start_process + output",
                      agentos_open_to_first_process(client, args.sandboxes))
        coded = show("E2B SDK: run_code('1+1'), warm context", e2b_warm_run_code(args.runs))
        executed = show("AgentOS SDK: exec('1+1'), warm session", agentos_warm_exec(client, args.runs))
    print(f"ratio create+first command, E2B face / AgentOS SDK: p50 {made[0] / opened[0]:.2f}x, "
          f"p99 {made[1] / opened[1]:.2f}x")
    print(f"ratio warm code, E2B face / AgentOS SDK: p50 {coded[0] / executed[0]:.2f}x, "
          f"p99 {coded[1] / executed[1]:.2f}x")


if __name__ == "__main__":
    main()
