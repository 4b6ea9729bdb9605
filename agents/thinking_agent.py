#!/usr/bin/env python3
"""Asks the kernel's LLM one question and prints the answer and what it
cost: tokens, time in the kernel's queue, time at the model.

Usage: python agents/thinking_agent.py [question ...]

Run it as an operator with AGENTOS_SOCKET set, or spawn it as an agent
(`agentos spawn thinker agents/thinking_agent.py`); as an agent, its THINKs
count against its own `permissions.llm_tokens` and show in LIST.
"""

import sys

from agentos import AgentOSClient, AgentOSError

DEFAULT_QUESTION = "What is the capital of France?"


def main(argv: list[str]) -> int:
    question = " ".join(argv).strip() or DEFAULT_QUESTION
    # A THINK waits for the model, which can take longer than the SDK's
    # default per-call timeout when other agents are queued ahead.
    with AgentOSClient(timeout=120) as kernel:
        me = kernel.hello()["agent_id"]
        print(f"agent {me} asks: {question}", flush=True)
        reply = kernel.think(question, max_tokens=96)
    answer = reply["content"].strip()
    usage = reply["usage"]
    print(f"answer: {answer}")
    print(
        f"tokens: {reply['tokens']} ({usage['prompt_tokens']} prompt + "
        f"{usage['completion_tokens']} completion) from {reply['model']}"
    )
    print(f"queue: {reply['queue_ms']} ms, latency: {reply['latency_ms']} ms", flush=True)
    if not answer:
        print("thinking_agent: the model returned an empty answer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AgentOSError as err:
        print(f"thinking_agent: THINK failed: {err.code} — {err.message}", file=sys.stderr)
        sys.exit(1)
