#!/usr/bin/env python3
"""An orchestrator: SPAWNs thinking agents, one question each, waits for
them to end, reports how each ended and what it spent on THINK (from LIST),
then THINKs a summary of the team's work itself.

Usage: python agents/multi_agent_workflow.py [question ...]
       (each argument is one worker's question; default: three of its own)

Run it as an operator, or spawn it as an agent with `permissions.spawn`:
an agent without that permission is refused SPAWN (permission_denied).
The workers' answers go to their own logs; the kernel's LIST is what the
orchestrator reads.
"""

import os
import sys
import time

from agentos import AgentOSClient, AgentOSError, NotFound

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_QUESTIONS = (
    "What is the capital of France?",
    "Why do leaves change colour in autumn?",
    "What is a prime number?",
)
LIVE_STATES = ("starting", "running", "paused", "restarting")
WAIT_SECONDS = 120


def spawn_workers(kernel: AgentOSClient, questions: list[str]) -> dict[int, str]:
    """Starts one thinking agent per question; returns question by agent id."""
    workers = {}
    for i, question in enumerate(questions, 1):
        reply = kernel.spawn(
            f"thinker-{i}-{os.getpid()}",
            os.path.join(HERE, "thinking_agent.py"),
            python=sys.executable,
            args=[question],
            limits={"memory": "256M", "max_pids": 32},
        )
        print(f"spawned {reply['name']} as agent {reply['id']}: {question}", flush=True)
        workers[reply["id"]] = question
    return workers


def wait_for(kernel: AgentOSClient, ids: set[int]) -> dict[int, dict]:
    """Polls LIST until every agent in ``ids`` has ended, KILLing any still
    live after ``WAIT_SECONDS``; returns their last entries."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        entries = {a["id"]: a for a in kernel.list_agents() if a["id"] in ids}
        live = [i for i, entry in entries.items() if entry["state"] in LIVE_STATES]
        if not live:
            return entries
        if time.monotonic() > deadline:
            print(f"gave up waiting after {WAIT_SECONDS} s; stopping {live}", flush=True)
            for agent_id in live:
                try:
                    kernel.kill(agent_id, grace_ms=1000)
                except NotFound:  # it ended meanwhile
                    pass
            return entries
        time.sleep(0.2)


def summarise(kernel: AgentOSClient, workers: dict[int, str], ok: list[int]) -> str:
    done = "\n".join(f"- {workers[i]}" for i in ok) or "- nothing"
    reply = kernel.think(
        f"A team of assistants answered these questions:\n{done}\n\n"
        "In two sentences, describe what the team worked on.",
        max_tokens=96,
        temperature=0.3,
    )
    return reply["content"].strip()


def main(argv: list[str]) -> int:
    questions = [q for q in argv if q.strip()] or list(DEFAULT_QUESTIONS)
    with AgentOSClient(timeout=120) as kernel:
        workers = spawn_workers(kernel, questions)
        ended = wait_for(kernel, set(workers))
        ok = []
        print("\nworkers:")
        for agent_id in workers:
            entry = ended.get(agent_id)
            if entry is None:
                print(f"  agent {agent_id}: no longer listed", flush=True)
                continue
            llm = entry.get("llm") or {}
            print(
                f"  {entry['name']} (agent {agent_id}): {entry['state']}, "
                f"exit code {entry['exit_code']}, THINK calls {llm.get('calls', 0)}, "
                f"tokens {llm.get('tokens', 0)}",
                flush=True,
            )
            if entry["state"] == "exited" and entry["exit_code"] == 0:
                ok.append(agent_id)
        summary = summarise(kernel, workers, ok)
    print(f"\nsummary: {summary}", flush=True)
    if len(ok) < len(workers):
        print(
            f"multi_agent_workflow: {len(workers) - len(ok)} of {len(workers)} workers "
            "did not finish cleanly (see their logs)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AgentOSError as err:
        print(f"multi_agent_workflow: {err.code} — {err.message}", file=sys.stderr)
        sys.exit(1)
